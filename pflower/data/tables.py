"""A table becomes inputs and labels (the run config's tabular keys): the label
column, the train/test column, the numeric feature columns, the categorical columns
one-hot with their declared levels, and the columns that are never features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pflower.config.schema import ConfigError, RunConfig

SPLIT_COLUMN = "split"


@dataclass(frozen=True)
class Tabular:
    """How a table becomes inputs and labels (the run config's tabular keys): the
    label column ('' : the first of LABEL_COLUMNS), the train/test column, the
    feature columns (empty: every other numeric column), the categorical columns
    with their declared levels, and the columns that are never features."""

    label: str = ""
    split: str = SPLIT_COLUMN
    features: tuple[str, ...] = ()
    categorical: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: RunConfig) -> Tabular:
        return cls(
            cfg.label_column.strip(),
            cfg.split_column.strip() or SPLIT_COLUMN,
            tuple(c.strip() for c in cfg.feature_columns.split(",") if c.strip()),
            parse_categorical(cfg.categorical_columns),
            (cfg.partition_by,) if cfg.partitioner == "natural" else (),
        )


NO_TABLE_KEYS = Tabular()  # a data set read with no tabular keys (the defaults)


def parse_categorical(spec: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``categorical-columns``: "cp:1/2/3/4,restecg:0/1/2" -> ((column, levels), ...)."""
    out = []
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        column, _, levels = item.partition(":")
        names = tuple(v.strip() for v in levels.split("/") if v.strip())
        if not column.strip() or len(names) < 2 or len(set(names)) != len(names):
            raise ConfigError(
                f"config key 'categorical-columns': {item!r} is not 'column:level/level/...' "
                "with at least two distinct levels (the first is the reference level)"
            )
        out.append((column.strip(), names))
    return tuple(out)


def _level(value: Any) -> str:
    """A categorical cell as text: 1.0 and 1 are the same level '1'."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def one_hot(values: np.ndarray, column: str, levels: tuple[str, ...], name: str) -> np.ndarray:
    """(n, len(levels) - 1) indicator columns, the first level the reference."""
    text = [_level(v) for v in values]
    unknown = sorted(set(text) - set(levels))
    if unknown:
        raise ConfigError(
            f"config key 'categorical-columns': column {column!r} of {name} has values "
            f"{unknown[:5]} outside its declared levels {list(levels)}"
        )
    cells = np.array(text, dtype=object)
    return np.stack([(cells == lv).astype(np.float32) for lv in levels[1:]], axis=1)


def _refuse_missing(values: np.ndarray, column: str, key: str, name: str) -> None:
    missing = (
        np.isnan(values).sum()
        if np.issubdtype(values.dtype, np.floating)
        else sum(v is None or (isinstance(v, float) and np.isnan(v)) for v in values)
    )
    if missing:
        raise ConfigError(
            f"config key '{key}': column {column!r} of {name} has {int(missing)} missing "
            "values; the run does not impute: fill or drop them first (docs/DATA.md)"
        )


def _is_id_column(name: str) -> bool:
    """Tabular columns that are ids (natural partitions, splits) or label groups
    (``coarse_label``: a feature made of it would leak the label), not features."""
    n = name.lower()
    ids = (SPLIT_COLUMN, "id", "client", "user", "writer", "domain", "coarse_label")
    return n in ids or n.endswith("_id")


def tabular_inputs(
    plain: dict[str, np.ndarray], name: str, tab: Tabular
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The feature matrix of a table: the declared (or every numeric) feature columns,
    then each categorical column's indicators, and the columns left (ids, the split);
    a missing value is refused."""
    categorical = dict(tab.categorical)
    for column, key in [*((c, "feature-columns") for c in tab.features),
                        *((c, "categorical-columns") for c in categorical)]:  # fmt: skip
        if column not in plain:
            raise ConfigError(
                f"config key '{key}': column {column!r} is not in {name} (columns: {sorted(plain)})"
            )
    skip = {tab.split, *tab.exclude, *categorical}
    feats = list(tab.features) or [
        c
        for c, v in plain.items()
        if c not in skip and not _is_id_column(c) and np.issubdtype(v.dtype, np.number)
    ]
    if not feats and not categorical:
        raise ValueError(f"config key 'dataset': {name} has no image or numeric feature column")
    parts = []
    for c in feats:
        if not np.issubdtype(plain[c].dtype, np.number):
            raise ConfigError(
                f"config key 'feature-columns': column {c!r} of {name} is not numeric "
                "(declare it in categorical-columns with its levels)"
            )
        _refuse_missing(plain[c], c, "feature-columns", name)
        parts.append(plain[c].astype(np.float32)[:, None])
    for c, levels in categorical.items():
        _refuse_missing(plain[c], c, "categorical-columns", name)
        parts.append(one_hot(plain[c], c, levels, name))
    used = {*feats, *categorical}
    dense = np.concatenate(parts, axis=1).astype(np.float32)
    return dense, {c: v for c, v in plain.items() if c not in used}
