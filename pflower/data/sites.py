"""The sites a run's data define, their names, and whether a federation fits them.

A natural partition (``partitioner='natural'``) gives one client per distinct value
of its ``partition-by`` column, and ``client-data-paths`` one per path: such a run
needs exactly that many SuperNodes. Fewer leave sites out without a word (Flower's
own default federation of 2 trained 2 of 4 hospitals and exited 0); more ask for
partitions that do not exist, and every extra client refuses every round. The
pre-flight (pflower/cli) and the ServerApp, before it sends a message, refuse a
federation that does not fit, in one line naming ``num-supernodes``.

A natural partition's sites are named by their column's values (``cleveland``, not
``client-0``): their client keys, so results, logs and errors name the hospital.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pflower.config.schema import ConfigError, RunConfig
from pflower.data.tables import Tabular

SHOWN = 6  # site names a message lists before "..."


def _natural(cfg: RunConfig, data_path: str = "") -> bool:
    """Whether this client's rows come from a natural partition of ``dataset``."""
    return (
        cfg.partitioner == "natural"
        and cfg.dataset != "synthetic"  # the generator's clients ignore the partitioner
        and not cfg.client_data_paths.strip()
        and not data_path
    )


@lru_cache(maxsize=16)
def _natural_ids(dataset: str, partition_by: str, tabular: Tabular) -> tuple[Any, ...]:
    """The ids of ``partition_by`` in partition order (pflower.data.partitions)."""
    from pflower.data.hf import load_source
    from pflower.data.partitions import natural_ids

    src = load_source(dataset, tabular)
    if partition_by not in src.columns:
        raise ConfigError(
            f"config key 'partition-by': column {partition_by!r} is not in the data set "
            f"(plain columns: {sorted(src.columns)})"
        )
    return natural_ids(src.columns[partition_by])


def _as_name(value: Any, column: str) -> str:
    """A client key from a column value: its text where it is a word (``cleveland``),
    the column and the value where it is a number (``centre-2``); characters a file
    name or a log line would trip on become ``-`` (personal state is stored by key)."""
    text = re.sub(r"[^\w.-]+", "-", str(value)).strip("-.")
    return text if isinstance(value, str) and text else f"{column}-{text}"


@lru_cache(maxsize=16)
def _names(ids: tuple[Any, ...], column: str) -> tuple[str, ...]:
    names = tuple(_as_name(v, column) for v in ids)
    if len(set(names)) < len(names):  # two values that read the same: keep them apart
        return tuple(f"client-{i}" for i in range(len(ids)))
    return names


def natural_site_names(cfg: RunConfig, data_path: str = "") -> tuple[str, ...] | None:
    """The natural partition's site names in partition order (None: not one)."""
    if not _natural(cfg, data_path):
        return None
    ids = _natural_ids(cfg.dataset, cfg.partition_by, Tabular.of(cfg))
    return _names(ids, cfg.partition_by)


def site_name(cfg: RunConfig, partition_id: int, data_path: str = "") -> str:
    """The client key of simulated partition ``partition_id``: its natural site's name,
    else ``client-<id>``."""
    names = natural_site_names(cfg, data_path)
    if names is not None and 0 <= partition_id < len(names):
        return names[partition_id]
    return f"client-{partition_id}"


def data_sites(cfg: RunConfig) -> tuple[str, tuple[str, ...]] | None:
    """(what defines the sites, their names) when the data fix the client count: a
    natural partition's column, or ``client-data-paths``; None when any count works."""
    paths = [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    if paths:
        return "client-data-paths", tuple(paths)
    names = natural_site_names(cfg)
    if names is None:
        return None
    return f"partition-by={cfg.partition_by!r}", names


def federation_fit_problem(
    cfg: RunConfig, supernodes: int, fix: str = 'run with --federation-config "num-supernodes={n}"'
) -> str | None:
    """Why a federation of ``supernodes`` does not fit the run's sites, in one line
    naming ``num-supernodes`` and the setting that fits (``fix``, with ``{n}`` the
    sites' count: a preset's is its key ``clients``); None when it fits."""
    sites = data_sites(cfg)
    if sites is None or len(sites[1]) == supernodes:
        return None
    what, names = sites
    count = len(names)
    shown = ", ".join(names[:SHOWN]) + (", ..." if count > SHOWN else "")
    if supernodes < count:
        left = f"{count - supernodes} of them would not train"
    else:
        left = f"{supernodes - count} SuperNodes would have no data"
    return (
        f"num-supernodes={supernodes}, but {what} gives {count} sites ({shown}), one "
        f"SuperNode each: {left}; {fix.format(n=count)}"
    )


def size_problem(cfg: RunConfig, supernodes: int) -> str | None:
    """What of the run's keys cannot work with ``supernodes`` clients (the config alone
    does not know the federation's size), in one line naming the key; None if all can."""
    if cfg.min_available_clients > supernodes:
        return (
            f"config key 'min-available-clients': {cfg.min_available_clients} but the "
            f"federation has {supernodes} clients (num-supernodes): every round would wait "
            "10 minutes, then go on without them"
        )
    return cfg.params.federation_problem(cfg, supernodes)
