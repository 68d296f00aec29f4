"""Partitioners: flwr-datasets' where it has them (iid, dirichlet, pathological,
natural: its partitions, made on arrays and held compactly by pflower/data/compact.py);
``dirichlet-client`` (FedDecomp's protocol) and ``domain`` (Factorized-FL's
domain-heterogeneous scenario) written by hand (flwr-datasets has neither); and one
client's train and test rows."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import numpy as np

from pflower.config.schema import ConfigError, RunConfig
from pflower.data import compact, split_train_test
from pflower.data.compact import Partitions
from pflower.data.hf import _Source, load_source
from pflower.data.tables import NO_TABLE_KEYS, SPLIT_COLUMN, Tabular

log = logging.getLogger("pflower.data.hf")  # the name its lines always had


def library_partitions(
    src: _Source,
    partitioner: str,
    num_partitions: int,
    seed: int,
    alpha: float = 0.5,
    classes_per_client: int = 2,
) -> Partitions:
    """Row indices of every partition: flwr-datasets' partitions (its IidPartitioner
    after a seeded shuffle, DirichletPartitioner, PathologicalPartitioner), made on
    arrays and held as two (pflower/data/compact.py: the same rows for the same seed)."""
    n = len(src.labels)
    try:
        if partitioner == "iid":
            return compact.iid(n, num_partitions, seed)
        if partitioner == "dirichlet":
            min_size = max(2, min(10, n // (2 * num_partitions)))
            return compact.dirichlet(src.labels, num_partitions, alpha, min_size, seed)
        if partitioner == "pathological":
            # client i surely gets class i % C, so every class is used when N >= C
            return compact.pathological(src.labels, num_partitions, classes_per_client, seed)
    except ValueError as err:
        key = {"dirichlet": "alpha", "pathological": "classes-per-client"}.get(
            partitioner, "partitioner"
        )
        raise ConfigError(
            f"config key '{key}': the {partitioner} partition of {n} rows into "
            f"{num_partitions} clients failed: {err}"
        ) from err
    raise ValueError(f"config key 'partitioner': {partitioner!r} is not a library partitioner")


@lru_cache(maxsize=8)
def _cached_library_partitions(
    name: str,
    partitioner: str,
    num_partitions: int,
    seed: int,
    alpha: float,
    cpc: int,
    tabular: Tabular = NO_TABLE_KEYS,
) -> Partitions:
    src = load_source(name, tabular)
    return library_partitions(src, partitioner, num_partitions, seed, alpha, cpc)


def natural_ids(column: np.ndarray) -> tuple[Any, ...]:
    """The distinct values of a natural partition's column, in partition order: sorted,
    as flwr-datasets' NaturalIdPartitioner numbers them."""
    return tuple(compact.natural_partitions(column).values.tolist())


def natural_partition(src: _Source, partition_by: str, partition_id: int) -> np.ndarray:
    """Rows of the ``partition_id``-th id (sorted) of column ``partition_by``: what
    flwr-datasets' NaturalIdPartitioner gives (tests/test_partitions.py compares them),
    from every client's rows computed once per column a process holds
    (pflower/data/compact.py; the library's prints a progress bar each time it is
    built, and a simulated client asks at every message)."""
    if partition_by not in src.columns:
        raise ConfigError(
            f"config key 'partition-by': column {partition_by!r} is not in the data set "
            f"(plain columns: {sorted(src.columns)})"
        )
    parts = compact.natural_partitions(src.columns[partition_by])
    if partition_id >= len(parts):
        raise ConfigError(
            f"config key 'partition-by': column {partition_by!r} has {len(parts)} "
            f"ids, fewer than partition id {partition_id} + 1 (set num-supernodes to match)"
        )
    return parts.indices(partition_id)


def dirichlet_client_partitions(
    labels: np.ndarray,
    num_classes: int,
    num_partitions: int,
    alpha: float,
    train_per_client: int,
    test_per_client: int,
    seed: int,
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """FedDecomp's protocol (its reference code; no library has it, so by hand).

    Client i draws q_i ~ Dir(alpha) over classes, then class counts for its train
    set (train_per_client) and its test set (test_per_client) from the same q_i.
    Rows come from per-class pools without replacement across clients; a pool
    that runs dry is refilled (rows then repeat across clients, logged once).
    Train and test are disjoint within a client.
    """
    rng = np.random.default_rng(seed)
    classes = [np.flatnonzero(labels == c) for c in range(num_classes)]
    present = np.array([len(c) > 0 for c in classes])
    pools = [list(rng.permutation(c)) for c in classes]
    warned = False
    out = []
    for _ in range(num_partitions):
        q = rng.dirichlet(np.full(num_classes, alpha))
        q = np.where(present, q, 0.0)
        q = q / q.sum() if q.sum() > 0 else present / present.sum()
        n_train = rng.multinomial(train_per_client, q)
        n_test = rng.multinomial(test_per_client, q)
        used: set[int] = set()
        picked: list[list[int]] = [[], []]
        for c in range(num_classes):
            need = int(n_train[c] + n_test[c])
            if need > len(classes[c]):
                raise ConfigError(
                    f"config key 'train-per-client': a client needs {need} rows of class {c} "
                    f"but the data set has {len(classes[c])}; lower train-/test-per-client"
                )
            rows: list[int] = []
            while len(rows) < need:
                if not pools[c]:
                    if not warned:
                        log.warning(
                            "dirichlet-client: class pools exhausted, rows repeat across clients"
                        )
                        warned = True
                    pools[c] = [int(r) for r in rng.permutation(classes[c]) if int(r) not in used]
                r = int(pools[c].pop())
                if r not in used:
                    used.add(r)
                    rows.append(r)
            picked[0] += rows[: n_train[c]]
            picked[1] += rows[n_train[c] :]
        out.append((np.array(picked[0], dtype=np.int64), np.array(picked[1], dtype=np.int64)))
    return tuple(out)


# CIFAR-10 has no coarse labels: its classes fall into two semantic groups
CIFAR10_GROUPS = {
    "vehicles": ("airplane", "automobile", "ship", "truck"),
    "animals": ("bird", "cat", "deer", "dog", "frog", "horse"),
}


def semantic_groups(src: _Source) -> dict[str, np.ndarray] | None:
    """Groups of semantically related classes, if the data set has them.

    CIFAR-100's ``coarse_label`` column (each fine class's superclass), else
    CIFAR-10's class names (vehicles, animals); None for any other data set.
    """
    coarse = src.columns.get("coarse_label")
    if coarse is not None:
        out: dict[int, set[int]] = {}
        for fine, c in zip(src.labels.tolist(), coarse.tolist(), strict=True):
            out.setdefault(int(c), set()).add(fine)
        sets = list(out.values())
        if sum(len(g) for g in sets) != len(set().union(*sets)):
            raise ConfigError(
                "config key 'domain-groups': column 'coarse_label' puts one class in two groups"
            )
        return {f"coarse-{c}": np.array(sorted(out[c])) for c in sorted(out)}
    if set(src.class_names) == {n for g in CIFAR10_GROUPS.values() for n in g}:
        index = {n: i for i, n in enumerate(src.class_names)}
        return {k: np.array(sorted(index[n] for n in g)) for k, g in CIFAR10_GROUPS.items()}
    return None


def domain_groups(num_classes: int, num_domains: int, seed: int) -> tuple[np.ndarray, ...]:
    """Disjoint, seeded class subsets, one per domain (classes split evenly)."""
    if num_domains > num_classes:
        raise ConfigError(
            f"config key 'num-domains': {num_domains} domains need at least as many classes, "
            f"the data set has {num_classes}"
        )
    order = np.random.default_rng([seed, 7]).permutation(num_classes)
    return tuple(np.sort(g) for g in np.array_split(order, num_domains))


def groups_for(src: _Source, kind: str, num_domains: int, seed: int) -> tuple[np.ndarray, ...]:
    """The class groups of partitioner=domain (config key ``domain-groups``)."""
    semantic = semantic_groups(src) if kind in ("auto", "semantic") else None
    if semantic is not None:
        names = src.class_names or tuple(str(c) for c in range(src.num_classes))
        log.info(
            "domain groups of %s: semantic, %s",
            src.name,
            "; ".join(f"{k}: {', '.join(names[c] for c in v)}" for k, v in semantic.items()),
        )
        return tuple(semantic.values())
    if kind == "semantic":
        raise ConfigError(
            f"config key 'domain-groups': {src.name} has no semantic class groups (no "
            "'coarse_label' column, and its classes are not CIFAR-10's); use 'random'"
        )
    log.info("domain groups of %s: %d seeded random class subsets", src.name, num_domains)
    return domain_groups(src.num_classes, num_domains, seed)


def domain_partitions(
    labels: np.ndarray, groups: tuple[np.ndarray, ...], num_partitions: int, seed: int
) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Factorized-FL's domain-heterogeneous scenario.

    Client i belongs to group i % len(groups); each group owns a disjoint subset of
    the classes, which each of its clients relabels 0..k-1 by its own seeded
    permutation; the group's rows are split IID over its clients. Returns (rows,
    new labels) per client (a client of a group that is not used gets none).
    """
    num_classes = int(max(int(g.max()) for g in groups)) + 1
    out: list[tuple[np.ndarray, np.ndarray]] = [None] * num_partitions  # type: ignore[list-item]
    for g, cls in enumerate(groups):
        rng = np.random.default_rng([seed, 11, g])
        members = list(range(g, num_partitions, len(groups)))
        rows = rng.permutation(np.flatnonzero(np.isin(labels, cls)))
        for client, chunk in zip(members, np.array_split(rows, max(1, len(members))), strict=False):
            mapping = np.full(num_classes, -1, dtype=np.int64)
            mapping[cls] = np.random.default_rng([seed, 11, g, client]).permutation(len(cls))
            chunk = np.sort(chunk)
            out[client] = (chunk, mapping[labels[chunk]])
    return tuple(out)


@lru_cache(maxsize=8)
def _cached_hand_partitions(
    name: str, kind: str, num_partitions: int, key: tuple, tabular: Tabular = NO_TABLE_KEYS
) -> tuple:
    src = load_source(name, tabular)
    if kind == "dirichlet-client":
        return dirichlet_client_partitions(src.labels, src.num_classes, num_partitions, *key)
    groups_kind, num_domains, seed = key
    groups = groups_for(src, groups_kind, num_domains, seed)
    return domain_partitions(src.labels, groups, num_partitions, seed)


def _split(
    cfg: RunConfig, src: _Source, rows: np.ndarray, partition_id: int, use_split_column: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test rows: the ``split-column`` when there is one, else the seeded
    ratio. A split column the run names must exist and mark each row train or test."""
    column = cfg.split_column.strip() or SPLIT_COLUMN
    split = src.columns.get(column)
    declared = column != SPLIT_COLUMN
    if declared and split is None and use_split_column:
        raise ConfigError(
            f"config key 'split-column': {column!r} is not a column of {src.name} "
            f"(columns: {sorted(src.columns)})"
        )
    if use_split_column and split is not None:
        values = split[rows].astype(str)
        if {"train", "test"} <= set(values) and set(values) <= {"train", "test"}:
            return rows[values == "train"], rows[values == "test"]
        if declared or set(values) - {"train", "test"}:
            raise ConfigError(
                f"config key 'split-column': column {column!r} of {src.name} must mark this "
                f"client's rows 'train' or 'test', with at least one of each; it has "
                f"{sorted(map(str, set(values)))[:5]}"
            )
    _, tr, _, te = split_train_test(rows, rows, cfg.test_fraction, cfg.seed + partition_id)
    return tr, te


def _partition(
    cfg: RunConfig, src: _Source, partition_id: int, num_partitions: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train rows, test rows, train labels, test labels) of one client."""
    p = cfg.partitioner
    if p != "natural" and len(src.labels) < 2 * num_partitions:
        raise ConfigError(
            f"config key 'dataset': {len(src.labels)} samples cannot give {num_partitions} "
            "clients (num-supernodes) a training and a test sample each"
        )
    if p == "dirichlet-client":
        key = (cfg.alpha, cfg.train_per_client, cfg.test_per_client, cfg.seed)
        tab = Tabular.of(cfg)
        tr, te = _cached_hand_partitions(src.name, p, num_partitions, key, tab)[partition_id]
        return tr, te, src.labels[tr], src.labels[te]
    if p == "domain":
        key = (cfg.domain_groups, cfg.num_domains, cfg.seed)
        rows, labels = _cached_hand_partitions(src.name, p, num_partitions, key, Tabular.of(cfg))[
            partition_id
        ]
        new = np.zeros(len(src.labels), dtype=np.int64)
        new[rows] = labels
        tr, te = _split(cfg, src, rows, partition_id, use_split_column=False)
        return tr, te, new[tr], new[te]
    if p == "natural":
        rows = natural_partition(src, cfg.partition_by, partition_id)
        tr, te = _split(cfg, src, rows, partition_id, use_split_column=True)
    else:
        rows = _cached_library_partitions(
            src.name,
            p,
            num_partitions,
            cfg.seed,
            cfg.alpha,
            cfg.classes_per_client,
            Tabular.of(cfg),
        )[partition_id]
        tr, te = _split(cfg, src, rows, partition_id, use_split_column=False)
    return tr, te, src.labels[tr], src.labels[te]
