"""Bounds on what one client can do to the aggregate, before any method aggregates:
the rules, their references' arithmetic and the robust means. Every reply, streamed
or held, is judged by one implementation of them: strategies/streaming.py
(``Limits``, ``bound_reply``; a held round's through ``bound_held``).

- ``weight-cap`` c: a reply's weight (its reported sample count) is at most c times
  the round's lower median reported count, so a client that claims 1e15 examples
  weighs at most c times a typical client (0: off).
- ``update-norm-bound`` r: a reply's update (upload minus what the server sent it,
  over the float tensors of the same shape) may be at most r times the lower median
  of this round's update norms and those the server accepted in the previous
  ``norm-history-rounds`` rounds; a longer one is clipped to it, or rejected with
  ``update-norm-action=reject`` (0: off).
- ``direction-check-from`` k: with k or more replies (and a mean aggregation), a
  reply whose update has cosine below ``direction-min-cosine`` with the round's
  coordinate-wise median update points against the round: its component along the
  median is removed (``direction-action=project``), or it is rejected (``reject``;
  0: off).
- ``aggregation=median`` / ``trimmed-mean``: coordinate-wise robust rules (Flower's
  ``aggregate_median`` and ``aggregate_trimmed_avg``) in place of the mean.

The lower median (the ceil(n/2)-th smallest value) needs no majority to be honest
at n = 2: there it is the smaller of the two, so one hostile site of two weighs at
most c/(c+1) of the round and its update is clipped to r times the honest one's.
With fewer than half of the replies hostile it lies between honest values. After
clipping every update is at most r times that reference, so any weighted mean of
them moves the global model by at most that much.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import Parameters, parameters_to_ndarrays
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

from strategies import kernels

NDArrays = list[np.ndarray]
log = logging.getLogger("flwr.pflower")


def lower_median(values: list[float]) -> float:
    """The ceil(n/2)-th smallest value: the median for odd n, the smaller middle value
    for even n (at n = 2, the smaller one)."""
    return float(sorted(values)[(len(values) - 1) // 2])


def count_limit(counts: list[int], cap: float) -> int:
    """The most a reply weighs: ``cap`` x the lower median count, at least 1."""
    return max(1, int(cap * lower_median(counts)))


def compared(uploads: list[NDArrays], references: list[NDArrays]) -> list[int]:
    """The tensors an update is taken over: float, the reference's shape, in every reply."""
    first = uploads[0]
    return [
        t
        for t in range(len(first))
        if all(
            t < min(len(u), len(r)) and u[t].dtype.kind == "f" and u[t].shape == r[t].shape
            for u, r in zip(uploads, references)
        )
    ]


def update_vector(upload: NDArrays, reference: NDArrays, tensors: list[int]) -> np.ndarray:
    """``upload - reference`` over ``tensors``, flattened (float64), written in place
    into one vector (a copy per tensor and a concatenation cost three times as much)."""
    out = np.empty(sum(upload[t].size for t in tensors), np.float64)
    at = 0
    for t in tensors:
        size = upload[t].size
        np.subtract(
            upload[t].ravel(), reference[t].ravel(), out=out[at : at + size], dtype=np.float64
        )
        at += size
    return out


def update_of(upload: NDArrays, reference: NDArrays) -> np.ndarray:
    """``upload - reference`` over the float tensors of the reference's shape (float64)."""
    return update_vector(upload, reference, compared([upload], [reference]))


def column_median(block: np.ndarray) -> np.ndarray:
    """``np.median(block, axis=0)``, by a sort down the columns: faster for the few
    rows (replies) a round has, measured in
    docs/notes/2026-11-26-where-a-client-round-goes-and-streamed-aggregation.md."""
    n = block.shape[0]
    ordered = np.sort(block, axis=0)
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def with_update(
    upload: NDArrays, reference: NDArrays, tensors: list[int], vector: np.ndarray
) -> NDArrays:
    """``upload`` whose ``tensors`` are ``reference + vector`` (a new list)."""
    out, start = list(upload), 0
    for t in tensors:
        u, r, part = upload[t], reference[t], vector[start : start + upload[t].size]
        if u.dtype in kernels.COMPILED_DTYPES and r.dtype in kernels.COMPILED_DTYPES:
            out[t] = np.empty(u.shape, u.dtype)
            kernels.rebase()(np.ascontiguousarray(r).reshape(-1), part, out[t].reshape(-1))
        else:
            out[t] = (r + part.reshape(u.shape)).astype(u.dtype)
        start += u.size
    return out


def remove_along(update: np.ndarray, unit: np.ndarray, dot: float) -> None:
    """``update -= dot * unit`` in place (a float64 vector: compiled, no temporary)."""
    kernels.remove_along()(update, unit, dot)


def robust_mean(uploads: list[NDArrays], rule: str, trim: float) -> NDArrays:
    """The coordinate-wise median or trimmed mean, cast back to each tensor's dtype."""
    results = [(u, 1) for u in uploads]
    if rule == "median":
        merged = aggregate_median(results)
    elif rule == "trimmed-mean":
        merged = aggregate_trimmed_avg(results, trim)
    else:
        raise ValueError(f"unknown robust rule {rule!r}")
    out = []
    for m, first in zip(merged, uploads[0]):
        m = np.asarray(m)
        out.append((np.rint(m) if first.dtype.kind in "iu" else m).astype(first.dtype))
    return out


@dataclass(frozen=True)
class Bounds:
    """The run's bounds on one reply (config keys in the module docstring)."""

    weight_cap: float
    norm_bound: float
    action: str = "clip"
    direction_from: int = 0  # 0: no direction check
    min_cosine: float = 0.0
    direction_action: str = "project"

    @classmethod
    def of(cls, cfg: Any, mean_aggregation: bool, updates: bool = True) -> Bounds:
        """The run config's bounds; the direction check only where the method's
        aggregation is a mean of the updates. ``updates=False``: the shared arrays are
        statistics averaged afresh (a card's ``bounds_updates``), not a model a reply
        moves: no update-norm bound or direction check, which measure a reply against
        the last global arrays; the weight cap stays."""
        return cls(
            cfg.weight_cap,
            cfg.update_norm_bound if updates else 0.0,
            cfg.update_norm_action,
            cfg.direction_check_from if mean_aggregation and updates else 0,
            cfg.direction_min_cosine,
            cfg.direction_action,
        )


class NormHistory:
    """The update norms the server accepted in its last ``rounds`` rounds, and the last
    streamed round's change of the global model (unit; strategies/streaming.py), with
    the global model it changed from (``previous``): the checkpoint keeps that (the
    model's dtype: float32 for a CNN, against the float64 direction's twice the
    bytes) and a resumed run takes the same direction from it, to the bit."""

    def __init__(self, rounds: int) -> None:
        self.direction: np.ndarray | None = None
        self.previous: NDArrays | None = None  # the global model before the last change
        self.rounds: deque[list[float]] = deque(maxlen=max(rounds, 0) or None)
        self.keep = rounds > 0

    def values(self) -> list[float]:
        return [n for norms in self.rounds for n in norms]

    def add(self, norms: list[float]) -> None:
        if self.keep and norms:
            self.rounds.append(norms)

    def changed(self, before: NDArrays, after: NDArrays) -> None:
        """The global model went from ``before`` to ``after`` (neither changed in place
        later: the strategy replaces its global tensors each round)."""
        self.previous, self.direction = before, direction_of(before, after)

    def state(self) -> dict[str, np.ndarray]:
        """For the checkpoint: a resumed run judges its next round as the uninterrupted
        run would."""
        out = {
            "bounds/norms": np.array(self.values(), np.float64),
            "bounds/norm-rounds": np.array([len(r) for r in self.rounds], np.int64),
        }
        if self.direction is not None and self.previous is not None:
            out |= {f"{PREVIOUS}{i}": a for i, a in enumerate(self.previous)}
        return out

    def restore(self, arrays: dict[str, np.ndarray], global_arrays: NDArrays) -> None:
        """The inverse of ``state``, the checkpoint's global model ``global_arrays``
        restored first (a checkpoint without it leaves the history empty; one that
        kept the direction itself, from before, gives that)."""
        norms, counts = arrays.get("bounds/norms"), arrays.get("bounds/norm-rounds")
        if norms is not None and counts is not None:
            self.rounds.clear()
            ends = np.cumsum(counts)
            self.rounds.extend(norms[e - n : e].tolist() for n, e in zip(counts, ends))
        previous = [arrays.get(f"{PREVIOUS}{i}") for i in range(len(global_arrays))]
        if previous and all(p is not None for p in previous):
            self.changed(previous, global_arrays)
        else:
            self.previous, self.direction = None, arrays.get("bounds/direction")


PREVIOUS = "bounds/previous/"  # + the global tensor's index: the checkpoint's previous model


def direction_of(before: NDArrays, after: NDArrays) -> np.ndarray | None:
    """The unit change from ``before`` to ``after`` (float64), or None if none."""
    change = update_of(after, before)
    length = float(np.linalg.norm(change))
    if length == 0:
        return None
    change /= length  # in place: no second copy of the model at the round's serial end
    return change


def decoded_references(
    payload_for: Callable[[str], Parameters], align: Callable[[NDArrays], NDArrays] | None = None
) -> Callable[[str], NDArrays]:
    """Each client's decoded payload (what its update is measured against), each
    distinct payload decoded once (thread-safe: a streamed round asks from many)."""
    decoded: dict[int, tuple[Parameters, NDArrays]] = {}
    lock = threading.Lock()

    def of(client_key: str) -> NDArrays:
        payload = payload_for(client_key)
        with lock:
            if id(payload) not in decoded:  # the payload is kept: its id stays its own
                arrays = parameters_to_ndarrays(payload)
                decoded[id(payload)] = (payload, align(arrays) if align else arrays)
            return decoded[id(payload)][1]

    return of


class RunningMean:
    """A weighted sum of arrays per tensor, in double-double: ``hi + lo`` is the exact
    sum up to float64 rounding of the (tiny) error terms, whatever the order.

    ``spare``: a finished sum's buffers (``release``), zeroed and reused if their shapes
    fit, so a round's first reply need not fault in fresh pages (whether it pays depends
    on the allocator: ``python -m benchmarks.studies.running_sum`` measures it)."""

    def __init__(self, spare: tuple[list[np.ndarray], list[np.ndarray]] | None = None) -> None:
        self.hi: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.dtypes: list[np.dtype] = []
        self.totals: list[float] = []  # each array's sum of weights
        self.count = 0
        self.spare = spare

    @property
    def total(self) -> float:
        """The sum of the weights (of the first array: a parted sum has one per array)."""
        return self.totals[0] if self.totals else 0.0

    def _start(self, arrays: NDArrays) -> None:
        spare, self.spare = self.spare, None
        if spare is not None and [h.shape for h in spare[0]] == [a.shape for a in arrays]:
            for buffer in (*spare[0], *spare[1]):
                buffer.fill(0.0)
            self.hi, self.lo = spare
        else:
            self.hi = [np.zeros(a.shape, np.float64) for a in arrays]
            self.lo = [np.zeros(a.shape, np.float64) for a in arrays]
        self.dtypes = [a.dtype for a in arrays]
        self.totals = [0.0] * len(arrays)

    def add(self, arrays: NDArrays, weight: float | list[float]) -> None:
        """Add ``arrays`` times ``weight`` (one per array: a method's mean in parts,
        strategies/parts.py)."""
        if not self.count:
            self._start(arrays)
        elif len(arrays) != len(self.hi):
            raise ValueError(f"{len(arrays)} tensors, the sum has {len(self.hi)}")
        weights = kernels.per_array(weight, len(arrays))
        add = kernels.two_sum()
        for i, (a, hi, lo) in enumerate(zip(arrays, self.hi, self.lo)):
            if a.shape != hi.shape:
                raise ValueError(f"a tensor of shape {a.shape} where the sum has {hi.shape}")
            # other dtypes convert exactly, or as numpy's float64 multiply would
            flat = np.ascontiguousarray(a).reshape(-1)
            if flat.dtype not in kernels.COMPILED_DTYPES:
                flat = flat.astype(np.float64)
            add(flat, weights[i], hi.reshape(-1), lo.reshape(-1))
            self.totals[i] += weights[i]
        self.count += 1

    def mean(self) -> NDArrays:
        """Per-tensor weighted mean, cast back to each tensor's dtype."""
        if not self.count:
            raise ValueError("an empty sum has no mean")
        out = []
        for hi, lo, dtype, total in zip(self.hi, self.lo, self.dtypes, self.totals):
            if dtype in kernels.COMPILED_DTYPES:  # numpy's bits, without its temporaries
                into = np.empty(hi.shape, dtype)
                kernels.mean_of()(hi.reshape(-1), lo.reshape(-1), total, into.reshape(-1))
                out.append(into)
            else:
                out.append(((hi + lo) / total).astype(dtype))
        return out

    def release(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The sum's buffers for the next sum to reuse (this one is empty after)."""
        buffers = (self.hi, self.lo) if self.count else None
        self.hi, self.lo, self.dtypes, self.totals, self.count = [], [], [], [], 0
        return buffers


def weighted_mean(arrays: list[NDArrays], weights: list[float] | list[list[float]]) -> NDArrays:
    """Per-tensor weighted mean (``RunningMean``: a streamed round's sum, so a held and
    a streamed round agree), cast back to each tensor's dtype."""
    total = RunningMean()
    for a, w in zip(arrays, weights, strict=True):
        total.add(a, w)
    return total.mean()


def mean_by_rule(
    replies: list[Any],
    rule: str,
    trim: float,
    weigh: Callable[[int], float | list[float]] | None = None,
) -> NDArrays:
    """The replies' arrays combined by ``rule``: weighted (by sample count), mean
    (equal weights), median or trimmed-mean; ``weigh``: a reply's sample count -> its
    weight, one per array where a method's mean is in parts (strategies/parts.py)."""
    arrays = [r.arrays for r in replies]
    if rule in ("median", "trimmed-mean"):
        return robust_mean(arrays, rule, trim)
    if weigh is None:
        weigh = lambda count: 1.0 if rule == "mean" else float(count)  # noqa: E731
    return weighted_mean(arrays, [weigh(r.num_examples) for r in replies])
