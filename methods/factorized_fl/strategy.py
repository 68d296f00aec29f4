"""Factorized-FL's aggregation: similarity-matched, one aggregate per client.

For each reporting client k: s_ki = cosine(v_k, v_i) of the matching vectors
(``factorized-fl.match=v-change``: of v_k - v_0 and v_i - v_0, v_0 the shared initial v)
(s_kk = 1), keep the clients with s >= tau, at least ``factorized-fl.min-aggr`` of the most
similar (k itself always first), weights softmax(epsilon * s) over the kept
ones; k's next payload is that weighted mean of the kept clients' shared tensors.
Every aggregate of a round is built from that round's decoded replies, which are
never written to (the reference overwrites its store while iterating).
Clients that did not report keep their last aggregate; a client never seen gets
the global payload (the initial tensors, then the sample-weighted mean of the
latest round).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.common import Parameters, ndarrays_to_parameters
from torch import nn

from methods.factorized_fl import FactorizedFLParams
from methods.factorized_fl.model import FactorizedWire, encode_sparse
from pflower.config.schema import RunConfig
from strategies.base import PFLStrategy, Reply, payload_bytes, weighted_mean
from strategies.robust import lower_median


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
    return keep, softmax_weights(sim_row[keep], epsilon)


def softmax_weights(similarities: np.ndarray, epsilon: float) -> np.ndarray:
    logits = epsilon * similarities
    w = np.exp(logits - logits.max())  # scipy.special.softmax would do the same; numpy suffices
    return w / w.sum()


def cap_matches(keeps: list[np.ndarray], sim: np.ndarray, cap: float) -> list[np.ndarray]:
    """``factorized-fl.match-cap``: client i stays in at most ceil(cap x m) other
    clients' kept sets, m the lower median over clients of that count, those rows
    most similar to it; each client always keeps itself (cap 0: unchanged)."""
    n = len(keeps)
    counts = np.zeros(n, dtype=int)
    for k, keep in enumerate(keeps):
        counts[[i for i in keep if i != k]] += 1
    limit = int(np.ceil(cap * lower_median(counts.tolist())))
    if cap <= 0 or limit <= 0:
        return keeps
    out = [set(keep.tolist()) for keep in keeps]
    for i in np.flatnonzero(counts > limit):
        rows = [k for k in range(n) if k != i and i in out[k]]
        for k in sorted(rows, key=lambda k: -sim[k, i])[limit:]:
            out[k].discard(int(i))
    return [np.array([i for i in keep if i in out[k]]) for k, keep in enumerate(keeps)]


def mixing_device() -> str | None:
    """Where the per-client aggregates are mixed: the server's GPU when it has one
    (torch, float64), else None (numpy, each client's weighted mean, as on every
    CPU-only server)."""
    import torch

    return "cuda" if torch.cuda.is_available() else None


def mix_all(
    dense: list[list[np.ndarray]], mixture: np.ndarray, device: str
) -> list[list[np.ndarray]]:
    """Every client's aggregate at once: for each shared tensor, the mixture matrix
    (row k: client k's weights over the uploads) times the uploads stacked, in float64
    on ``device``, cast back to each tensor's dtype. The same numbers as each client's
    ``weighted_mean`` to float64 rounding (tests/test_factorized_fl.py measures it)."""
    import torch

    m = torch.as_tensor(mixture, dtype=torch.float64, device=device)
    out: list[list[np.ndarray]] = [[] for _ in dense]
    for j, first in enumerate(dense[0]):
        stacked = torch.stack([torch.as_tensor(d[j]).reshape(-1) for d in dense])
        mixed = (m @ stacked.to(device=device, dtype=torch.float64)).cpu().numpy()
        for k, row in enumerate(mixed):
            out[k].append(row.reshape(first.shape).astype(first.dtype))
    return out


class FactorizedFLStrategy(PFLStrategy):
    """Per-client similarity-weighted aggregation over the Factorized-FL wire."""

    wire: FactorizedWire

    def __init__(self, cfg: RunConfig, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(cfg=cfg, model=model, **kwargs)
        # factorized-fl.match=v-change: compare each v's move away from the initial v,
        # which every client starts from (the model's own initialisation)
        v0 = model.state_dict()[self.wire.match].detach().cpu().numpy().reshape(-1)
        change = FactorizedFLParams.of(cfg).match == "v-change"
        self.match_origin = v0.astype(np.float32) if change else None
        self.mix_device = mixing_device()  # None: numpy (mixing_device)

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        decoded = [self.wire.decode_up(r.arrays) for r in replies]
        dense = [d for d, _ in decoded]
        vectors = np.stack([m for _, m in decoded])
        if self.match_origin is not None:
            vectors = vectors - self.match_origin
        sim = cosine_matrix(vectors)
        p = FactorizedFLParams.of(self.cfg)
        new: dict[str, Parameters] = {}
        kept_counts = []
        mixture = np.zeros((len(replies), len(replies)))  # row k: whom client k learns from
        keeps = [
            matching_weights(sim[k], k, p.sim_threshold, p.min_aggr, p.epsilon)[0]
            for k in range(len(replies))
        ]
        keeps = cap_matches(keeps, sim, p.match_cap)
        for k in range(len(replies)):
            keep = keeps[k]
            kept_counts.append(len(keep))
            mixture[k, keep] = softmax_weights(sim[k, keep], p.epsilon)
        if self.mix_device is not None:  # every client's aggregate in one matmul a tensor
            mixed = mix_all(dense, mixture, self.mix_device)
        else:
            mixed = [
                weighted_mean([dense[i] for i in keeps[k]], list(mixture[k, keeps[k]]))
                for k in range(len(replies))
            ]
        for k, reply in enumerate(replies):
            new[reply.client_key] = self.payloads.encode(mixed[k])
        self.payloads.per_client.update(new)  # only after every aggregate is built
        sizes = [float(r.num_examples) for r in replies]
        self.set_global(weighted_mean(dense, sizes))
        keys = [r.client_key for r in replies]
        off_diag = sim[~np.eye(len(keys), dtype=bool)]
        extra = {
            "ffl_kept_mean": float(np.mean(kept_counts)),
            "ffl_similarity_mean": float(off_diag.mean()) if off_diag.size else 1.0,
            "ffl_similarity": {"clients": keys, "matrix": np.round(sim, 4).tolist()},
            "ffl_mixture": {"clients": keys, "matrix": np.round(mixture, 4).tolist()},
        }
        if self.wire.sparse:  # beta: the share of mu entries sent, and of |mu| >= threshold
            mus = [a for d in dense for n, a in zip(self.wire.shared, d) if n in self.wire.sparse]
            size = max(1, sum(a.size for a in mus))
            extra["ffl_mu_density"] = sum(int(np.count_nonzero(a)) for a in mus) / size
            # what evaluation keeps and the paper's cost count counts (client.py:139-159)
            above = sum(int((np.abs(a) >= p.mu_threshold).sum()) for a in mus)
            extra["ffl_mu_above_threshold"] = above / size
            if p.mu_wire == "dense":  # what the round's uploads cost with mu thresholded
                extra["ffl_bytes_up_thresholded"] = sum(
                    self.thresholded_bytes(d, m) for d, m in decoded
                )
        self.note(server_round, **extra)

    def thresholded_bytes(self, dense: list[np.ndarray], match: np.ndarray | None) -> int:
        """Bytes of one upload had its mu travelled as ``mu-wire='sparse'`` sends it
        (entries with |mu| >= mu-threshold, the cheapest layout): what the paper's
        cost count counts (the authors' client.py:139-159) while their code sends it
        whole."""
        threshold = FactorizedFLParams.of(self.cfg).mu_threshold
        arrays: list[np.ndarray] = []
        for n, a in zip(self.wire.shared, dense, strict=True):
            arrays += list(encode_sparse(a, threshold)) if n in self.wire.sparse else [a]
        if self.wire.match_extra and match is not None:
            arrays.append(match)
        return payload_bytes(ndarrays_to_parameters(arrays))


STRATEGIES = {
    "factorized-fl-alpha": FactorizedFLStrategy,
    "factorized-fl-beta": FactorizedFLStrategy,
}
