"""Payloads: what each client is sent. The global shared tensors, encoded by the
method's wire once per change (not per client), and for a method that aggregates
per client (Factorized-FL) each client's own payload, kept in memory up to a budget
and spilled to the run's folder past it, so the server's memory stays bounded
however many clients there are."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from flwr.common import NDArrays, Parameters, parameters_to_ndarrays

from models.roles import TensorSpec
from models.wire import Wire, to_parameters
from strategies.replies import take_arrays


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


class Payloads:
    """The global shared tensors (dense, as the server keeps them) and the payloads
    made from them; per-client payloads where a method sets them."""

    def __init__(
        self, wire: Wire, initial: NDArrays, budget: float, spill_dir: Path | None
    ) -> None:
        self.wire = wire
        self.global_arrays: NDArrays = [a.copy() for a in initial]
        self.per_client = ClientPayloads(budget, spill_dir)  # bytes in memory, then files
        self._encoded: Parameters | None = None

    def set_global(self, arrays: NDArrays) -> None:
        self.global_arrays = arrays
        self._encoded = None

    def encode(self, dense: NDArrays) -> Parameters:
        return to_parameters(self.wire.encode_down(dense))  # np.save's bytes, one copy

    def global_payload(self) -> Parameters:
        """The global payload, serialized once per change (not per client)."""
        if self._encoded is None:
            self._encoded = self.encode(self.global_arrays)
        return self._encoded

    def payload_for(self, client_key: str | None) -> Parameters:
        """The client's own payload if it has one, else the global payload."""
        if client_key is not None and client_key in self.per_client:
            return self.per_client[client_key]
        return self.global_payload()

    def state(self, spec: list[TensorSpec]) -> dict[str, np.ndarray]:
        """The global tensors (by ``spec`` name) and every client's payload (by the
        wire's down spec), for the checkpoint."""
        out = {f"global/{s.name}": a for s, a in zip(spec, self.global_arrays)}
        down = self.wire.down_spec()
        for key, payload in self.per_client.items():
            for s, a in zip(down, parameters_to_ndarrays(payload)):
                out[f"client/{key}/{s.name}"] = a
        return out

    def restore(self, spec: list[TensorSpec], arrays: dict[str, np.ndarray]) -> None:
        """The inverse of ``state``; ValueError naming the first misfit."""
        self.set_global(take_arrays(arrays, "global/", spec))
        keys = {k[len("client/") : k.rindex("/")] for k in arrays if k.startswith("client/")}
        self.per_client = ClientPayloads(self.per_client.budget, self.per_client.spill_dir)
        down = self.wire.down_spec()
        for key in sorted(keys):
            self.per_client[key] = to_parameters(take_arrays(arrays, f"client/{key}/", down))
