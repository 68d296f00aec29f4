"""Compact partitions (pflower/data/compact.py, #94): flwr-datasets' partitions, row for
row, held as one array of offsets and one of rows; a million clients' structure."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from benchmarks.scale import flower_partitions
from pflower.config.schema import ConfigError
from pflower.data import compact
from pflower.data.hf import source_from_dataset
from pflower.data.partitions import library_partitions


def _flower(labels: np.ndarray, partitioner, shuffle_seed: int = -1) -> list[np.ndarray]:
    """Every partition's rows as flwr-datasets' ``partitioner`` gives them through
    ``load_partition`` (the code path library_partitions took before #94)."""
    return flower_partitions(partitioner, labels, shuffle=shuffle_seed)


def _same(ours: compact.Partitions, theirs: list[np.ndarray]) -> None:
    assert len(ours) == len(theirs)
    for i, rows in enumerate(theirs):
        assert np.array_equal(ours.indices(i), rows), i


def _labels(n: int, classes: list[int], seed: int) -> np.ndarray:
    """Unbalanced labels drawn from ``classes`` (not necessarily 0..C-1)."""
    rng = np.random.default_rng([seed, 5])
    p = rng.dirichlet(np.ones(len(classes)))
    return np.asarray(classes)[rng.choice(len(classes), n, p=p)]


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("n,parts", [(1000, 10), (997, 33), (50, 50), (3000, 7)])
def test_iid_is_flowers_shuffled_iid_partition(seed, n, parts) -> None:
    from flwr_datasets.partitioner import IidPartitioner

    ours = compact.iid(n, parts, seed)
    _same(ours, _flower(np.zeros(n, dtype=np.int64), IidPartitioner(parts), shuffle_seed=seed))


@pytest.mark.parametrize("seed", [0, 3, 11])
@pytest.mark.parametrize(
    "n,parts,alpha,min_size,classes",
    [
        (1000, 10, 0.5, 10, list(range(10))),
        (2000, 40, 0.1, 2, [0, 3, 4, 9]),  # labels that are not 0..C-1
        (600, 20, 0.05, 2, list(range(6))),  # numpy's small-alpha Dirichlet algorithm
        (500, 25, 0.3, 3, list(range(5))),  # drawn again (seeds 0, 3), given up (11)
        (800, 8, 5.0, 0, list(range(10))),
    ],
)
def test_dirichlet_is_flowers_dirichlet_partition(seed, n, parts, alpha, min_size, classes):
    from flwr_datasets.partitioner import DirichletPartitioner

    labels = _labels(n, classes, seed)
    kwargs = {"alpha": alpha, "min_partition_size": min_size, "self_balancing": False}
    try:
        theirs = _flower(labels, DirichletPartitioner(parts, "label", seed=seed, **kwargs))
    except ValueError as err:  # both give up after 10 attempts
        with pytest.raises(ValueError, match="max number of attempts"):
            compact.dirichlet(labels, parts, alpha, min_size, seed)
        assert "max number of attempts" in str(err)
        return
    _same(compact.dirichlet(labels, parts, alpha, min_size, seed), theirs)


def test_dirichlet_draws_again_as_flower_does_until_the_smallest_partition_fits(
    caplog,
) -> None:
    """Not vacuous: the hard case above draws twice more (a warning each time, in both)
    and ends with flwr-datasets' rows."""
    from flwr_datasets.partitioner import DirichletPartitioner

    labels = _labels(500, list(range(5)), 0)
    with pytest.warns(UserWarning, match="min_partition_size") as theirs_warned:
        theirs = _flower(labels, DirichletPartitioner(25, "label", 0.3, 3, seed=0))
    with caplog.at_level("WARNING", logger="pflower.data.compact"):
        ours = compact.dirichlet(labels, 25, 0.3, 3, 0)
    _same(ours, theirs)
    assert ours.sizes().min() >= 3
    assert len(caplog.records) == len(theirs_warned) == 2


@pytest.mark.parametrize("seed", [0, 2, 5])
@pytest.mark.parametrize(
    "n,parts,per,classes",
    [
        (1000, 10, 2, list(range(10))),
        (1200, 30, 3, list(range(10))),  # duplicates drawn and drawn again
        (400, 4, 2, list(range(10))),  # fewer partitions than classes: some unused
        (900, 12, 1, [1, 2, 5, 8]),
        (700, 9, 4, [0, 2, 4, 6, 8]),
    ],
)
def test_pathological_is_flowers_first_deterministic_partition(seed, n, parts, per, classes):
    from flwr_datasets.partitioner import PathologicalPartitioner

    labels = _labels(n, classes, seed)
    theirs = _flower(
        labels,
        PathologicalPartitioner(parts, "label", per, "first-deterministic", seed=seed),
    )
    _same(compact.pathological(labels, parts, per, seed), theirs)


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological"])
def test_library_partitions_are_the_rows_flwr_datasets_gave_before(kind) -> None:
    """What a run's clients get (library_partitions with the run's keys) is what the
    flwr-datasets path gave for the same seed: committed results do not move."""
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
    )

    labels = np.arange(1200) % 10
    src = source_from_dataset(
        datasets.Dataset.from_dict({"f0": np.zeros(1200, np.float32), "label": labels})
    )
    for seed in (0, 4):
        ours = library_partitions(src, kind, 12, seed, alpha=0.5, classes_per_client=3)
        if kind == "iid":
            theirs = _flower(labels, IidPartitioner(12), shuffle_seed=seed)
        elif kind == "dirichlet":  # the run's rule: min size max(2, min(10, n / 2N))
            theirs = _flower(labels, DirichletPartitioner(12, "label", 0.5, 10, seed=seed))
        else:
            part = PathologicalPartitioner(12, "label", 3, "first-deterministic", seed=seed)
            theirs = _flower(labels, part)
        _same(ours, theirs)


def test_a_partition_that_cannot_be_made_is_a_config_error_naming_its_key() -> None:
    labels = np.arange(100) % 10
    src = source_from_dataset(
        datasets.Dataset.from_dict({"f0": np.zeros(100, np.float32), "label": labels})
    )
    with pytest.raises(ConfigError, match="'classes-per-client'.*more partitions"):
        library_partitions(src, "pathological", 40, 0, classes_per_client=4)
    with pytest.raises(ConfigError, match="'alpha'.*max number of attempts"):
        library_partitions(src, "dirichlet", 40, 0, alpha=0.01)


@pytest.mark.parametrize(
    "column",
    [
        np.array([3, 1, 3, 7, 1, 1, 9, 3]),
        np.array(["w2", "w10", "w1", "w2", "a", "w10"]),
    ],
)
def test_natural_is_flowers_natural_id_partition(column) -> None:
    from flwr_datasets.partitioner import NaturalIdPartitioner

    labels = np.zeros(len(column), dtype=np.int64)
    theirs = flower_partitions(NaturalIdPartitioner(partition_by="writer"), labels, column)
    ours = compact.natural(column)
    _same(ours, theirs)
    assert ours.values.tolist() == sorted(set(column.tolist()))
    assert compact.natural_partitions(column) is compact.natural_partitions(column)  # kept


def test_partitions_hold_two_arrays_and_index_like_the_tuple_they_replace() -> None:
    parts = compact.Partitions.from_sizes(np.array([2, 0, 3]), np.array([4, 0, 1, 2, 3]))
    assert len(parts) == 3 and parts.offsets.tolist() == [0, 2, 2, 5]
    assert [p.tolist() for p in parts] == [[4, 0], [], [1, 2, 3]]
    assert parts[2].dtype == np.int64 and parts.sizes().tolist() == [2, 0, 3]
    got = parts.indices(0)
    got[0] = 99  # a copy: the partition is not changed through it
    assert parts.indices(0).tolist() == [4, 0]
    for bad in (3, -1):
        with pytest.raises(IndexError):
            parts.indices(bad)


@pytest.mark.parametrize("kind", ["iid", "dirichlet"])
def test_a_million_clients_are_two_arrays_every_row_once(kind) -> None:
    """A million clients of a synthetic label array (3 million rows, 10 classes):
    offsets of a million and one int64s, every row once in an int32 array, each
    client's rows those the offsets say (not timed: benchmarks/scale.py times it)."""
    clients, n = 1_000_000, 3_000_000
    labels = (np.arange(n) * 7919 % 10).astype(np.int64)
    if kind == "iid":
        parts = compact.iid(n, clients, seed=0)
    else:
        parts = compact.dirichlet(labels, clients, alpha=0.5, min_partition_size=0, seed=0)
    assert len(parts) == clients and parts.offsets.dtype == np.int64
    assert parts.rows.dtype == np.int32 and parts.nbytes == 8 * (clients + 1) + 4 * n
    assert parts.offsets[0] == 0 and parts.offsets[-1] == n
    assert (np.diff(parts.offsets) >= 0).all()
    assert np.array_equal(np.sort(parts.rows), np.arange(n))  # every row, once
    sizes = parts.sizes()
    if kind == "iid":
        assert set(sizes.tolist()) == {3}
    else:  # Dirichlet: sizes spread; a client's rows are its share of some classes
        assert sizes.max() > 10 and (sizes == 0).any()
    for c in (0, 123_456, clients - 1):
        assert np.array_equal(parts.indices(c), parts.rows[parts.offsets[c] : parts.offsets[c + 1]])


@pytest.mark.parametrize("bound", [2, 10, 62, 2**31 + 5])  # the last rejects half its draws
@pytest.mark.parametrize("held", [False, True])
def test_draws_in_blocks_are_numpys_single_draws_and_leave_its_generator_alike(bound, held):
    """``_Draws`` gives what ``rng.integers(0, bound, size=1)[0]`` gives call after call
    (blocks smaller than the draws, so several are made) and leaves the generator as
    those calls do: its next draws, 32-bit ones included, are the same."""
    for count in (0, 1, 2, 7, 300):
        ours, theirs = np.random.default_rng(count), np.random.default_rng(count)
        if held:  # a 32-bit half waiting in both generators
            ours.integers(0, 5, size=1), theirs.integers(0, 5, size=1)
        draws = compact._Draws(ours, bound, block=10)
        got = [draws() for _ in range(count)]
        draws.close()
        assert got == [int(theirs.integers(0, bound, size=1)[0]) for _ in range(count)]
        assert ours.integers(0, 7, size=3).tolist() == theirs.integers(0, 7, size=3).tolist()
        a, b = np.arange(50), np.arange(50)
        ours.shuffle(a), theirs.shuffle(b)
        assert np.array_equal(a, b) and ours.random() == theirs.random()


def test_the_partition_benchmark_tables_both_paths_and_their_agreement(tmp_path, capsys):
    """``python -m benchmarks scale --partitions`` at a small size: every partitioner,
    compact and flwr-datasets' side by side, the same rows (its exit code says so)."""
    from benchmarks.__main__ import main

    args = [
        "scale",
        "--partitions",
        "--clients",
        "60",
        "--rows-per-client",
        "5",
        "--flower-up-to",
        "60",
    ]
    assert main([*args, "--out", str(tmp_path)]) == 0
    table = (tmp_path / "scale-1m-partitions.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "| 60 |" in line]
    assert [r.split("|")[1].strip() for r in rows] == [
        "iid",
        "dirichlet",
        "pathological",
        "natural",
    ]
    assert all(r.rstrip().endswith("| yes |") for r in rows)
    assert "python -m benchmarks scale --partitions --clients 60" in table
