"""Partitions of a data set's rows over many clients, held compactly: one array of
offsets and one of row indices (``Partitions``), built with numpy, a million
clients in seconds.

The IID, Dirichlet and pathological (classes in shards) partitions are flwr-datasets'
for the same seed, draw for draw, row for row (tests/test_partitions.py compares them
with the library's partitioners); the natural partition is its NaturalIdPartitioner's.
Why not the library's own: its partitioners build a Python list of row ids for every
partition, and a ``datasets.Dataset`` at every ``load_partition``: hours at a million
clients, in every process that serves clients, and more memory a client than arrays
(docs/results/scale-1m-partitions.md measured both). Here the same draws are made on arrays: the
Dirichlet proportions and the class choices from the same generator in the same order,
each partition's rows shuffled by the same calls (numpy's shuffle makes the same draws
for a list and an array).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class Partitions:
    """Every client's row indices: client ``c``'s are ``rows[offsets[c]:offsets[c+1]]``
    (``offsets``: int64, one more than the clients; ``rows``: int32 below 2**31 rows).
    Indexing, ``len`` and iteration as the tuple of arrays it replaces."""

    def __init__(self, offsets: np.ndarray, rows: np.ndarray) -> None:
        self.offsets = offsets
        self.rows = rows

    @classmethod
    def from_sizes(cls, sizes: np.ndarray, rows: np.ndarray) -> Partitions:
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(offsets, rows)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def indices(self, client: int) -> np.ndarray:
        """Client ``client``'s rows (int64, a copy), in the partitioner's order."""
        if not 0 <= client < len(self):
            raise IndexError(f"client {client} is not in [0, {len(self)})")
        return self.rows[self.offsets[client] : self.offsets[client + 1]].astype(np.int64)

    __getitem__ = indices

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self.indices(c) for c in range(len(self)))

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        return int(self.offsets.nbytes + self.rows.nbytes)


def _row_type(num_rows: int) -> type:
    return np.int32 if num_rows < 2**31 else np.int64


def _check_partitions(num_rows: int, num_partitions: int) -> None:
    if num_partitions <= 0:
        raise ValueError("The number of partitions needs to be greater than zero.")
    if num_partitions > num_rows:  # flwr-datasets' refusal, in its words
        raise ValueError(
            "The number of partitions needs to be smaller than the number of samples in "
            "the dataset."
        )


def _rows_by_class(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The sorted distinct labels and each one's rows, in increasing order (what
    ``np.nonzero(labels == k)`` gives, by one stable sort rather than a pass a class)."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "iu" and len(labels) and labels.min() >= 0 and labels.max() < 2**16:
        counts = np.bincount(labels)
        classes = np.flatnonzero(counts)
        order = np.argsort(labels.astype(np.uint16), kind="stable")  # a radix sort
        counts = counts[classes]
    else:
        classes, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
        order = np.argsort(codes.reshape(-1), kind="stable")
    ends = np.cumsum(counts)
    return classes, [order[e - c : e] for c, e in zip(counts.tolist(), ends.tolist())]


def _assemble(
    num_partitions: int,
    sizes: np.ndarray,
    pieces: Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray]],
    row_type: type,
) -> Partitions:
    """Partitions of ``sizes`` rows from ``pieces``, class after class: (the class's
    rows, the partitions that take some (increasing; None: every one), how many each
    takes): each partition's rows class after class, each class's rows dealt out in
    partition order, as flwr-datasets' partitioners extend their lists."""
    parts = Partitions.from_sizes(sizes, np.empty(int(sizes.sum()), dtype=row_type))
    fill = parts.offsets[:-1].copy()  # where each partition's next row goes
    for rows, members, counts in pieces:
        taken = int(counts.sum())
        at = fill if members is None else fill[members]
        starts = np.cumsum(counts) - counts  # each partition's first row in the class
        dest = np.repeat(at - starts, counts) + np.arange(taken)
        parts.rows[dest] = rows[:taken]
        if members is None:
            fill += counts
        else:
            fill[members] += counts
    return parts


def _shuffle_each(parts: Partitions, rng: np.random.Generator) -> None:
    """Each partition's rows shuffled in place, partition after partition, by the
    calls flwr-datasets makes on its lists (the same draws on an array)."""
    offsets = parts.offsets.tolist()
    rows = parts.rows
    for start, end in zip(offsets[:-1], offsets[1:]):
        if end - start > 1:
            rng.shuffle(rows[start:end])


def iid(num_rows: int, num_partitions: int, seed: int) -> Partitions:
    """``Dataset.shuffle(seed=seed)`` (its generator's permutation) split as
    IidPartitioner splits it: contiguous shards, the first ``num_rows % num_partitions``
    one row longer (``Dataset.shard(contiguous=True)``)."""
    if num_partitions <= 0:
        raise ValueError("The number of partitions must be greater than zero.")
    order = np.random.default_rng(seed).permutation(num_rows).astype(_row_type(num_rows))
    div, mod = divmod(num_rows, num_partitions)
    sizes = np.full(num_partitions, div, dtype=np.int64)
    sizes[:mod] += 1
    return Partitions.from_sizes(sizes, order)


def _dirichlet_counts(rng: np.random.Generator, alpha: np.ndarray, class_size: int) -> np.ndarray:
    """How many of a class's ``class_size`` rows each partition takes: one draw of
    Dir(alpha), split as DirichletPartitioner splits (``np.split`` at the floors of the
    cumulative shares; the last partition takes the rest)."""
    cuts = (np.cumsum(rng.dirichlet(alpha)) * class_size).astype(int)[:-1]
    bounds = np.empty(len(alpha) + 1, dtype=np.int64)
    bounds[0], bounds[-1] = 0, class_size
    np.minimum(cuts, class_size, out=bounds[1:-1])
    return np.diff(bounds)


def dirichlet(
    labels: np.ndarray,
    num_partitions: int,
    alpha: float,
    min_partition_size: int,
    seed: int,
    shuffle: bool = True,
) -> Partitions:
    """DirichletPartitioner(partition_by=label, alpha, min_partition_size,
    self_balancing=False, shuffle, seed): for each class (sorted) a draw of Dir(alpha)
    over the partitions deals out its rows; the whole draw is made again (up to 10
    times) while a partition has fewer than ``min_partition_size`` rows."""
    _check_partitions(len(labels), num_partitions)
    rng = np.random.default_rng(seed)
    classes, by_class = _rows_by_class(labels)
    alphas = np.array([float(alpha)], dtype=float).repeat(num_partitions)
    for attempt in range(11):
        start = rng.bit_generator.state  # the draws, made again when the rows are placed
        sizes = np.zeros(num_partitions, dtype=np.int64)
        for rows in by_class:
            sizes += _dirichlet_counts(rng, alphas, len(rows))
        smallest = int(sizes.min())
        if smallest >= min_partition_size:
            break
        if attempt == 10:
            raise ValueError(
                "The max number of attempts (10) was reached. Please update the values of "
                "alpha and try again."
            )
        log.warning(
            "dirichlet: a partition has %d rows, under min_partition_size %d after %d "
            "attempts; drawing again",
            smallest,
            min_partition_size,
            attempt,
        )
    end = rng.bit_generator.state
    rng.bit_generator.state = start
    pieces = ((rows, None, _dirichlet_counts(rng, alphas, len(rows))) for rows in by_class)
    parts = _assemble(num_partitions, sizes, pieces, _row_type(len(labels)))
    assert rng.bit_generator.state == end  # the same draws, made again
    if shuffle:
        _shuffle_each(parts, rng)
    return parts


class _Draws:
    """What successive ``rng.integers(0, bound, size=1)[0]`` calls give, made in blocks.
    numpy draws each from the bit generator's 32-bit halves (a 64-bit word's low half
    first, the high half kept for the next draw) by Lemire's method, taking the next
    half when one is rejected (about bound / 2**32 of them); ``close`` leaves the
    generator where those calls would have. A million single draws cost seconds in
    numpy's per-call overhead; a block is one ``random_raw`` (tests compare the two)."""

    def __init__(self, rng: np.random.Generator, bound: int, block: int) -> None:
        assert 1 < bound < 2**32
        self.bits, self.bound, self.block = rng.bit_generator, bound, max(block, 64)
        self.start = self.bits.state
        self.halves = np.zeros(0, dtype=np.uint32)  # the stream drawn so far
        self.values: list[int] = []  # the accepted draws
        self.ends: list[int] = []  # each one's last half, + 1
        self.taken = 0

    def _more(self) -> None:
        words = self.bits.random_raw(self.block)
        fresh = np.empty(2 * self.block, dtype=np.uint32)
        fresh[0::2], fresh[1::2] = words & 0xFFFFFFFF, words >> np.uint64(32)
        if not len(self.halves) and self.start["has_uint32"]:  # the half held comes first
            fresh = np.concatenate([np.array([self.start["uinteger"]], np.uint32), fresh])
        offset = len(self.halves)
        self.halves = np.concatenate([self.halves, fresh])
        scaled = fresh.astype(np.uint64) * np.uint64(self.bound)
        threshold = (2**32 - self.bound) % self.bound
        accepted = np.flatnonzero((scaled & np.uint64(0xFFFFFFFF)) >= threshold)
        self.values += (scaled[accepted] >> np.uint64(32)).astype(np.int64).tolist()
        self.ends += (accepted + offset + 1).tolist()

    def __call__(self) -> int:
        while self.taken >= len(self.values):
            self._more()
        self.taken += 1
        return self.values[self.taken - 1]

    def close(self) -> None:
        """Put the generator where ``taken`` single draws leave it."""
        used = self.ends[self.taken - 1] if self.taken else 0
        held = int(self.start["has_uint32"])
        self.bits.state = self.start
        if used == 0:
            return
        if held:  # the half the generator held was taken first
            state = self.bits.state
            state["has_uint32"] = 0
            self.bits.state = state
        words, odd = divmod(used - held, 2)
        self.bits.advance(words)
        if odd:  # the word's high half waits for the next 32-bit draw
            self.bits.random_raw(1)
            state = self.bits.state
            state["has_uint32"], state["uinteger"] = 1, int(self.halves[used])
            self.bits.state = state


def _first_deterministic_classes(
    rng: np.random.Generator, num_partitions: int, num_classes: int, per_partition: int
) -> np.ndarray:
    """(partitions, per_partition) class positions, PathologicalPartitioner's
    "first-deterministic" assignment: partition p's first class is p % classes, the
    others drawn one at a time until new (``rng.choice(classes, size=1)``, which draws
    ``rng.integers(0, classes, size=1)``)."""
    chosen = np.empty((num_partitions, per_partition), dtype=np.int64)
    chosen[:, 0] = np.arange(num_partitions) % num_classes
    if per_partition == 1:
        return chosen
    draw = _Draws(rng, num_classes, 2 * num_partitions * (per_partition - 1))
    for p in range(num_partitions):
        have = [p % num_classes]
        while len(have) < per_partition:
            c = draw()
            if c not in have:
                have.append(c)
        chosen[p] = have
    draw.close()
    return chosen


def pathological(
    labels: np.ndarray,
    num_partitions: int,
    classes_per_partition: int,
    seed: int,
    shuffle: bool = True,
) -> Partitions:
    """PathologicalPartitioner(partition_by=label, num_classes_per_partition,
    class_assignment_mode="first-deterministic", shuffle, seed): each partition holds
    ``classes_per_partition`` classes; a class's rows are split evenly (``np.array_split``)
    over the partitions that hold it, in partition order."""
    _check_partitions(len(labels), num_partitions)
    rng = np.random.default_rng(seed)
    classes, by_class = _rows_by_class(labels)
    if classes_per_partition > len(classes):
        raise ValueError(
            f"The specified `num_classes_per_partition`={classes_per_partition} is greater "
            f"than the number of unique classes in the given dataset={len(classes)}."
        )
    chosen = _first_deterministic_classes(rng, num_partitions, len(classes), classes_per_partition)
    holders = np.repeat(np.arange(num_partitions), classes_per_partition)
    flat = chosen.reshape(-1)
    order = np.lexsort((holders, flat))  # by class, then partition
    holders, flat = holders[order], flat[order]
    used = np.bincount(flat, minlength=len(classes))
    have = np.array([len(r) for r in by_class])
    short = np.flatnonzero(used > have)
    if len(short):
        k = short[0]
        raise ValueError(
            f"Label: {classes[k]} is needed to be assigned to more partitions ({used[k]}) "
            f"than there are samples (corresponding to this label) in the dataset "
            f"({have[k]}). Please decrease the `num_partitions`, "
            "`num_classes_per_partition` to avoid this situation."
        )
    unused = classes[used == 0]
    if len(unused):
        log.warning("pathological: classes %s are not used by any partition", unused.tolist())
    # a class's j-th holder takes the j-th piece of np.array_split(its rows, holders)
    bounds = np.concatenate([[0], np.cumsum(used)])
    rank = np.arange(len(flat)) - bounds[flat]
    counts = have[flat] // used[flat] + (rank < have[flat] % used[flat])
    sizes = np.bincount(holders, weights=counts, minlength=num_partitions).astype(np.int64)
    pieces = (
        (by_class[k], holders[bounds[k] : bounds[k + 1]], counts[bounds[k] : bounds[k + 1]])
        for k in range(len(classes))
        if used[k]
    )
    parts = _assemble(num_partitions, sizes, pieces, _row_type(len(labels)))
    if shuffle:
        _shuffle_each(parts, rng)
    return parts


class NaturalPartitions(Partitions):
    """A natural partition: partition ``i`` holds the rows whose value of the column is
    ``values[i]`` (the distinct values sorted), in row order."""

    def __init__(self, offsets: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        super().__init__(offsets, rows)
        self.values = values


def natural(column: np.ndarray) -> NaturalPartitions:
    """NaturalIdPartitioner(partition_by=column)'s partitions: one a distinct value
    (one stable sort: each value's rows stay in row order)."""
    column = np.asarray(column)
    order = np.argsort(column, kind="stable")
    ordered = column[order]
    first = np.ones(len(column), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, len(column)))
    parts = Partitions.from_sizes(sizes, order.astype(_row_type(len(column))))
    return NaturalPartitions(parts.offsets, parts.rows, ordered[starts])


_NATURAL: dict[int, tuple[Any, NaturalPartitions]] = {}


def natural_partitions(column: np.ndarray) -> NaturalPartitions:
    """``natural(column)``, once per column a process holds (a simulated client asks
    at every message)."""
    held = _NATURAL.get(id(column))
    if held is None or held[0] is not column:
        if len(_NATURAL) >= 8:
            _NATURAL.clear()
        held = _NATURAL[id(column)] = (column, natural(column))
    return held[1]
