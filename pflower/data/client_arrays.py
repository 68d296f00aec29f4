"""One client's arrays: its rows of the data set (a partition of the run's data, or the
whole of a site's own path), split into train and test, its classes mapped to the run's,
shifted or permuted as the run says, and normalised (pflower/data/hf.py loads the
sources, pflower/data/partitions.py says which rows are whose)."""

from __future__ import annotations

import numpy as np

from pflower.config.schema import RunConfig
from pflower.data.hf import (
    Tabular,
    _check_local,
    _client_path,
    apply_domain_shift,
    label_permutation,
    load_source,
    to_run_classes,
)
from pflower.data.partitions import _partition, _split


def load_client_arrays(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One client's (x_train, y_train, x_test, y_test): float32 normalised, int64 labels."""
    whole = data_path or (
        _client_path(cfg, partition_id, num_partitions) if cfg.client_data_paths else ""
    )
    tab = Tabular.of(cfg)
    if whole:
        _check_local(whole, "client-data-paths" if not data_path else "dataset")
        src = load_source(whole, tab)
        rows = np.arange(len(src.labels))
        tr, te = _split(cfg, src, rows, partition_id, use_split_column=True)
        y_tr, y_te = src.labels[tr], src.labels[te]
    else:
        src = load_source(cfg.dataset, tab)
        tr, te, y_tr, y_te = _partition(cfg, src, partition_id, num_partitions)
    names = tuple(n.strip() for n in cfg.class_names.split(",") if n.strip())
    if names:  # by name: a site that lacks a class keeps every other class's id
        table = to_run_classes(src, names, whole or cfg.dataset)
        y_tr, y_te = table[y_tr], table[y_te]
    x_tr, x_te = src.raw(tr), src.raw(te)
    if cfg.domain_shift and src.is_image:
        shift = partition_id % cfg.num_domains
        x_tr, x_te = apply_domain_shift(x_tr, shift), apply_domain_shift(x_te, shift)
    if cfg.permute_labels:
        perm = label_permutation(src.num_classes, cfg.seed, partition_id)
        y_tr, y_te = perm[y_tr], perm[y_te]
    if src.tabular:  # the site's own training rows only: nothing of another site's data
        mean, std = x_tr.mean(axis=0), x_tr.std(axis=0)
        std[std < 1e-6] = 1.0  # a constant column (Switzerland's cholesterol) stays 0
        return (
            ((x_tr - mean) / std).astype(np.float32),
            y_tr.astype(np.int64),
            ((x_te - mean) / std).astype(np.float32),
            y_te.astype(np.int64),
        )
    imagenet = bool(cfg.pretrained_weights)  # pretrained weights expect ImageNet's statistics
    return (
        src.normalise(x_tr, imagenet),
        y_tr.astype(np.int64),
        src.normalise(x_te, imagenet),
        y_te.astype(np.int64),
    )
