"""Client data: the FedFac simulation generator and Hugging Face data sets.

``data_info`` tells the server the input shape and class count;
``load_client_data`` gives one client its train/test tensors, decoded once per
process and cached (a simulation actor serves many rounds).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np
import torch

from pflower.config.schema import RunConfig
from pflower.data.synthetic import StudyArgs, generate_simulation_study, simulated_client


@dataclass(frozen=True)
class DataInfo:
    input_shape: tuple[int, ...]
    num_classes: int
    class_names: tuple[str, ...] = ()  # the data's own, in its label order (if it names them)


@dataclass(frozen=True)
class ClientData:
    """One client's tensors: float32 inputs (already normalised), int64 labels."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def nbytes(self) -> int:
        """The bytes its four tensors hold."""
        return sum(
            t.numel() * t.element_size()
            for t in (self.x_train, self.y_train, self.x_test, self.y_test)
        )

    @cached_property
    def digest(self) -> str:
        """A short digest of these exact tensors (results.json's data fingerprint)."""
        h = hashlib.sha256()
        for t in (self.x_train, self.y_train, self.x_test, self.y_test):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


def simulation_study(  # noqa: ANN201 (SimulationStudy)
    cfg: RunConfig, num_partitions: int, teachers: bool = False
):
    """The generated federation for this config (cached); ``teachers`` keeps the
    per-client teacher weights too (FedFac's oracle split)."""
    args = study_arguments(cfg)
    return generate_simulation_study(num_partitions, *args, teachers, cfg.sim_client_streams)


def study_arguments(cfg: RunConfig) -> StudyArgs:
    """``generate_simulation_study``'s arguments after the client count, from the config."""
    return StudyArgs(
        cfg.sim_samples,
        cfg.sim_dim,
        cfg.hidden_dim,
        cfg.sim_shared_neurons,
        cfg.sim_shared_covariates,
        cfg.sim_noise,
        cfg.seed,
    )


def declared_info(cfg: RunConfig) -> DataInfo | None:
    """The data's shape and classes as the run declares them (``input-shape`` with
    ``class-names`` or ``num-classes``), or None if it does not declare both."""
    names = run_class_names(cfg)
    classes = len(names) or cfg.num_classes
    if not cfg.input_shape or not classes:
        return None
    return DataInfo(tuple(int(d) for d in cfg.input_shape.split(",")), classes, names)


def data_info(cfg: RunConfig, data_path: str = "", cache_dir: str = "") -> DataInfo:
    """Input shape and number of classes of the run: as declared (no data read: a
    deployment's server needs none), else of the configured data set. With a
    ``cache_dir`` (a site's state directory) they are kept there: finding them
    decodes the data set, which a deployed ClientApp would do every message."""
    declared = declared_info(cfg)
    if declared is not None:
        return declared
    return found_info(cfg, data_path, cache_dir)


def found_info(cfg: RunConfig, data_path: str = "", cache_dir: str = "") -> DataInfo:
    """``data_info`` of the data themselves, whatever the run declares."""
    first_client_path = cfg.client_data_paths.split(",")[0].strip()
    if cfg.dataset == "synthetic" and not data_path and not first_client_path:
        return DataInfo((cfg.sim_dim,), 2)
    from pflower.data.hf import hf_data_info
    from pflower.data.tables import Tabular

    source = data_path or first_client_path or cfg.dataset
    if not cache_dir:
        info = hf_data_info(source, Tabular.of(cfg))
    else:
        from pflower.data.cache import cached_info, info_key

        def build() -> tuple[tuple[int, ...], int, tuple[str, ...]]:
            info = hf_data_info(source, Tabular.of(cfg))
            return info.input_shape, info.num_classes, info.class_names

        key = info_key(cfg, data_path)
        info = DataInfo(*cached_info(Path(cache_dir) / "data-cache", key, build))
    names = run_class_names(cfg)
    if names:  # the run's classes, in the run's order: every site maps its labels by name
        return DataInfo(info.input_shape, len(names), names)
    return info


def check_site_data(cfg: RunConfig, data: ClientData, where: str) -> None:
    """ConfigError naming the key if this client's data do not fit what the run
    declares (``input-shape``, ``num-classes``): the model would not take them, or a
    label id would mean no class of the run."""
    from pflower.config.schema import ConfigError

    declared = declared_info(cfg)
    shape = tuple(data.x_train.shape[1:])
    if cfg.input_shape and declared is not None and shape != declared.input_shape:
        raise ConfigError(
            f"config key 'input-shape': the run declares {declared.input_shape}, the data "
            f"of {where} are {shape}"
        )
    classes = len(run_class_names(cfg)) or cfg.num_classes
    labels = torch.cat([data.y_train, data.y_test])
    if classes and labels.numel() and int(labels.max()) >= classes:
        raise ConfigError(
            f"config key 'num-classes': the run has {classes} classes, the data of {where} "
            f"have label id {int(labels.max())}"
        )


def site_class_names(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = "", cache_dir: str = ""
) -> tuple[str, ...]:
    """This client's own class list, in its label order (empty if its data name none)."""
    if data_path or not cfg.client_data_paths:  # its data's own, not what the run declares
        return found_info(cfg, data_path, cache_dir).class_names
    from pflower.data.hf import _client_path, hf_data_info
    from pflower.data.tables import Tabular

    path = _client_path(cfg, partition_id, num_partitions)
    return hf_data_info(path, Tabular.of(cfg)).class_names


def run_class_names(cfg: RunConfig) -> tuple[str, ...]:
    """The run's ``class-names`` (empty: each data set's own label ids)."""
    return tuple(n.strip() for n in cfg.class_names.split(",") if n.strip())


def class_ids(cfg: RunConfig, names: tuple[str, ...]) -> dict[str, int]:
    """A site's class name -> the label id the run gives it: by ``class-names`` when
    the run lists them, else the site's own order (image folders: sorted names)."""
    listed = {n: i for i, n in enumerate(run_class_names(cfg))}
    return {n: listed.get(n, -1) if listed else i for i, n in enumerate(names)}


def compare_site_classes(cfg: RunConfig, sites: list[tuple[str, tuple[str, ...]]]) -> None:
    """ConfigError naming ``class-names`` when the sites' class names (``(site, its
    names)``) would give one class two ids: one class spelled two ways (case or spaces
    only), or, without ``class-names``, sites whose class lists differ (each numbers
    its own in order, so an id would mean different classes at different sites)."""
    from pflower.config.schema import ConfigError

    spellings: dict[str, dict[str, list[str]]] = {}
    for site, names in sites:
        for n in names:
            spellings.setdefault(" ".join(n.split()).casefold(), {}).setdefault(n, []).append(site)
    for ways in spellings.values():
        if len(ways) > 1:
            shown = "; ".join(f"{n!r} at {', '.join(at)}" for n, at in ways.items())
            raise ConfigError(
                f"config key 'class-names': one class is spelled {len(ways)} ways ({shown}); "
                "class names are compared exactly: rename the folders (or label values) "
                "to one spelling"
            )
    named = [(site, names) for site, names in sites if names]
    if run_class_names(cfg) or len({names for _, names in named}) < 2:
        return
    union = sorted({n for _, names in named for n in names})
    shown = "; ".join(f"{site}: {', '.join(names)}" for site, names in named)
    raise ConfigError(
        f"config key 'class-names': the sites' classes differ ({shown}); without "
        "class-names each site numbers its own classes in order, so one id would mean "
        f"different classes at different sites: set class-names='{','.join(union)}'"
    )


def class_fingerprint(names: tuple[str, ...]) -> str:
    """A short digest of a class list (names only, in label order)."""
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16] if names else ""


def split_train_test(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeded shuffle, then the last ``test_fraction`` of samples is the test split."""
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = max(1, int(round(test_fraction * len(y)))) if len(y) > 1 else 0
    tr, te = order[: len(y) - n_test], order[len(y) - n_test :]
    return x[tr], y[tr], x[te], y[te]


def _to_tensors(
    x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray
) -> ClientData:
    return ClientData(
        torch.as_tensor(x_tr, dtype=torch.float32),
        torch.as_tensor(y_tr, dtype=torch.int64),
        torch.as_tensor(x_te, dtype=torch.float32),
        torch.as_tensor(y_te, dtype=torch.int64),
    )


# A simulation actor serves every client in turn. A federation whose clients' tensors
# fit CLIENT_DATA_BUDGET is kept whole (a hit costs next to nothing against a rebuild);
# a larger one is rebuilt each message: any LRU smaller than the federation misses on
# every message of a round that asks every client (the rounds cycle through them),
# while its slots would hold memory for nothing. A site's own data (``data_path``,
# ``cache_dir``) are always kept.
CLIENT_DATA_BUDGET = 256 * 2**20
_client_bytes: dict[tuple, int] = {}  # (cfg, num_partitions) -> one client's bytes


def decode_shared_data(cfg: RunConfig) -> None:
    """The data set simulated clients partition, decoded whole where it fits
    (pflower/data/hf.py ``DECODE_WHOLE_BYTES``); a no-op for generated data, per-client
    paths and sets already decoded."""
    if cfg.dataset == "synthetic" or cfg.client_data_paths:
        return
    from pflower.data.hf import Tabular, load_source

    load_source(cfg.dataset, Tabular.of(cfg)).decode_whole()


def load_client_data(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = "", cache_dir: str = ""
) -> ClientData:
    """One client's data (``build_client_data``), kept for the next message when it
    is a site's own or the whole simulated federation's fit ``CLIENT_DATA_BUDGET``."""
    args = (cfg, partition_id, num_partitions, data_path, cache_dir)
    simulated = not data_path and not cache_dir
    size = _client_bytes.get((cfg, num_partitions)) if simulated else None
    if size is not None and size * num_partitions > CLIENT_DATA_BUDGET:
        return build_client_data(*args)
    data = _kept_client_data(*args)
    if simulated:
        _client_bytes.setdefault((cfg, num_partitions), data.nbytes)
    return data


@lru_cache(maxsize=4096)
def _kept_client_data(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = "", cache_dir: str = ""
) -> ClientData:
    return build_client_data(cfg, partition_id, num_partitions, data_path, cache_dir)


def build_client_data(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = "", cache_dir: str = ""
) -> ClientData:
    """One client's data. ``data_path`` (a site's own data in deployment)
    replaces ``cfg.dataset`` and is used whole, without partitioning. With a
    ``cache_dir`` (a site's state directory) decoded image data are kept there
    between messages (pflower/data/cache.py)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition id {partition_id} not in [0, {num_partitions})")
    if cfg.dataset == "synthetic" and not data_path and not cfg.client_data_paths:
        args = study_arguments(cfg)
        x, y = simulated_client(partition_id, num_partitions, args, cfg.sim_client_streams)
        return _to_tensors(*split_train_test(x, y, cfg.test_fraction, cfg.seed + partition_id))
    from pflower.data.client_arrays import load_client_arrays

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return load_client_arrays(cfg, partition_id, num_partitions, data_path)

    if not cache_dir:
        return _to_tensors(*build())
    from pflower.data.cache import cache_key, cached_arrays

    key = cache_key(cfg, partition_id, num_partitions, data_path)
    arrays = cached_arrays(Path(cache_dir) / "data-cache", key, build)
    return _to_tensors(*(np.array(a) for a in arrays))  # memory-mapped -> owned, writable
