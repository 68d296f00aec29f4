"""Factorized-FL's aggregation: similarity-matched, one aggregate per client.

For each reporting client k: s_ki = cosine(v_k, v_i) of the matching vectors
(``ffl-match=v-change``: of v_k - v_0 and v_i - v_0, v_0 the shared initial v)
(s_kk = 1), keep the clients with s >= tau, at least ``ffl-min-aggr`` of the most
similar (k itself always first), weights softmax(epsilon * s) over the kept
ones; k's next payload is that weighted mean of the kept clients' shared tensors.
Every aggregate of a round is built from that round's decoded replies, which are
never written to (the reference overwrites its store while iterating).
Clients that did not report keep their last aggregate; a client never seen gets
the global payload (the initial tensors, then the sample-weighted mean of the
latest round).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from flwr.common import NDArrays, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from torch import nn

from models.factorized_fl import Wire
from models.roles import TensorSpec
from run_config.schema import RunConfig
from run_results import RunRecorder
from strategies.base import PFLStrategy, Reply, RoundLog, take_arrays, weighted_mean


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of the rows, diagonal set to 1."""
    v = vectors.astype(np.float64)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    unit = v / np.maximum(norms, 1e-12)
    sim = unit @ unit.T
    np.fill_diagonal(sim, 1.0)
    return np.clip(sim, -1.0, 1.0)


def matching_weights(
    sim_row: np.ndarray, self_index: int, tau: float, min_aggr: int, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the kept clients, their softmax(epsilon * s) weights) for one row.

    Kept: the clients with s >= tau, or the ``min_aggr`` most similar if fewer
    pass; the client itself (s = 1) always, ranked first on ties.
    """
    n = sim_row.shape[0]
    order = sorted(range(n), key=lambda i: (-sim_row[i], i != self_index))
    passing = int(np.sum(sim_row >= tau))
    keep = np.array(order[: min(n, max(passing, min_aggr, 1))])
    logits = epsilon * sim_row[keep]
    w = np.exp(logits - logits.max())  # scipy.special.softmax would do the same; numpy suffices
    return keep, w / w.sum()


class ClientPayloads:
    """Each client's aggregate (encoded, as sent): in memory up to ``budget`` bytes,
    then as files under ``spill_dir``, so the server's memory stays bounded however
    many clients there are (``personal-state-budget-mb``)."""

    def __init__(self, budget: float, spill_dir: Path | None) -> None:
        self.budget = budget
        self.spill_dir = spill_dir
        self.memory: dict[str, Parameters] = {}
        self.on_disk: set[str] = set()
        self.used = 0

    def _file(self, key: str) -> Path:
        assert self.spill_dir is not None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
        return self.spill_dir / f"{safe}.npz"

    def __contains__(self, key: object) -> bool:
        return key in self.memory or key in self.on_disk

    def __len__(self) -> int:
        return len(self.memory) + len(self.on_disk)

    def keys(self) -> list[str]:
        return sorted([*self.memory, *self.on_disk])

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __getitem__(self, key: str) -> Parameters:
        if key in self.memory:
            return self.memory[key]
        with np.load(self._file(key), allow_pickle=False) as z:
            tensors = [z[f"t{i}"].tobytes() for i in range(len(z.files) - 1)]
            return Parameters(tensors=tensors, tensor_type=str(z["type"]))

    def __setitem__(self, key: str, payload: Parameters) -> None:
        size = sum(len(t) for t in payload.tensors)
        old = self.memory.pop(key, None)
        if old is not None:
            self.used -= sum(len(t) for t in old.tensors)
        if self.spill_dir is None or (key not in self.on_disk and self.used + size <= self.budget):
            self.memory[key] = payload
            self.used += size
            return
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        arrays = {f"t{i}": np.frombuffer(t, np.uint8) for i, t in enumerate(payload.tensors)}
        tmp = self._file(key).with_suffix(".tmp.npz")
        np.savez(tmp, type=np.array(payload.tensor_type), **arrays)
        tmp.replace(self._file(key))
        self.on_disk.add(key)

    def update(self, other: dict[str, Parameters]) -> None:
        for key, payload in other.items():
            self[key] = payload

    def items(self) -> list[tuple[str, Parameters]]:
        return [(k, self[k]) for k in self.keys()]


class FactorizedFLStrategy(PFLStrategy):
    """Per-client similarity-weighted aggregation over the Factorized-FL wire."""

    def __init__(
        self,
        cfg: RunConfig,
        spec: list[TensorSpec],
        initial: NDArrays,
        model: nn.Module,
        recorder: RunRecorder | None = None,
        default_aggregation: str | None = None,
    ) -> None:
        super().__init__(cfg, spec, initial, model, recorder, default_aggregation)
        self.wire = Wire.of(model, tuple(s.name for s in spec), cfg)
        self.set_global(self.wire.encode(initial))
        self.spec = self.wire.down_spec()
        # stable client key -> its aggregate; spilled to the run's folder past the budget
        spill = recorder.dir / "client-payloads" if recorder is not None else None
        self.payloads = ClientPayloads(cfg.personal_state_budget_mb * 2**20, spill)
        # ffl-match=v-change: compare each v's move away from the initial v, which every
        # client starts from (the model's own initialisation)
        v0 = model.state_dict()[self.wire.match].detach().cpu().numpy().reshape(-1)
        self.match_origin = v0.astype(np.float32) if cfg.ffl_match == "v-change" else None

    def payload_for(self, client_key: str | None, server_round: int) -> Parameters:
        if client_key is not None and client_key in self.payloads:
            return self.payloads[client_key]
        return self.global_payload()

    def expected_spec(self, client_key: str) -> list[TensorSpec]:
        return self.wire.up_spec()

    def server_state(self) -> dict[str, np.ndarray]:
        state = super().server_state()
        for key, payload in self.payloads.items():
            for s, a in zip(self.spec, parameters_to_ndarrays(payload)):
                state[f"client/{key}/{s.name}"] = a
        return state

    def restore_server_state(self, arrays: dict[str, np.ndarray]) -> None:
        super().restore_server_state(arrays)
        keys = {k[len("client/") : k.rindex("/")] for k in arrays if k.startswith("client/")}
        self.payloads = ClientPayloads(self.payloads.budget, self.payloads.spill_dir)
        for key in sorted(keys):
            self.payloads[key] = ndarrays_to_parameters(
                take_arrays(arrays, f"client/{key}/", self.spec)
            )

    def check_reply(self, client_key: str, arrays: NDArrays, num_examples: int) -> str | None:
        return super().check_reply(client_key, arrays, num_examples) or self.wire.check_sparse(
            arrays
        )

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        decoded = [self.wire.decode(r.arrays) for r in replies]
        dense = [d for d, _ in decoded]
        vectors = np.stack([m for _, m in decoded])
        if self.match_origin is not None:
            vectors = vectors - self.match_origin
        sim = cosine_matrix(vectors)
        cfg = self.cfg
        new: dict[str, Parameters] = {}
        kept_counts = []
        mixture = np.zeros((len(replies), len(replies)))  # row k: whom client k learns from
        for k, reply in enumerate(replies):
            keep, w = matching_weights(
                sim[k], k, cfg.ffl_sim_threshold, cfg.ffl_min_aggr, cfg.ffl_epsilon
            )
            kept_counts.append(len(keep))
            mixture[k, keep] = w
            mine = weighted_mean([dense[i] for i in keep], list(w))
            new[reply.client_key] = ndarrays_to_parameters(self.wire.encode(mine))
        self.payloads.update(new)  # only after every aggregate of the round is built
        sizes = [float(r.num_examples) for r in replies]
        self.set_global(self.wire.encode(weighted_mean(dense, sizes)))
        keys = [r.client_key for r in replies]
        off_diag = sim[~np.eye(len(keys), dtype=bool)]
        extra = {
            "ffl_kept_mean": float(np.mean(kept_counts)),
            "ffl_similarity_mean": float(off_diag.mean()) if off_diag.size else 1.0,
            "ffl_similarity": {"clients": keys, "matrix": np.round(sim, 4).tolist()},
            "ffl_mixture": {"clients": keys, "matrix": np.round(mixture, 4).tolist()},
        }
        if self.wire.sparse:  # beta: the share of mu entries kept (|mu| >= threshold)
            mus = [a for d in dense for n, a in zip(self.wire.shared, d) if n in self.wire.sparse]
            kept = sum(int(np.count_nonzero(a)) for a in mus)
            extra["ffl_mu_density"] = kept / max(1, sum(a.size for a in mus))
        self.rounds.setdefault(server_round, RoundLog()).extra.update(extra)
