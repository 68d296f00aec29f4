"""Client data: the FedFac simulation generator and Hugging Face data sets.

``data_info`` tells the server the input shape and class count;
``load_client_data`` gives one client its train/test tensors, decoded once per
process and cached (a simulation actor serves many rounds).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from pfl_data.synthetic import generate_simulation_study
from run_config.schema import RunConfig


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


def simulation_study(  # noqa: ANN201 (SimulationStudy)
    cfg: RunConfig, num_partitions: int, teachers: bool = False
):
    """The generated federation for this config (cached); ``teachers`` keeps the
    per-client teacher weights too (FedFac's oracle split)."""
    return generate_simulation_study(
        num_partitions,
        cfg.sim_samples,
        cfg.sim_dim,
        cfg.hidden_dim,
        cfg.sim_shared_neurons,
        cfg.sim_shared_covariates,
        cfg.sim_noise,
        cfg.seed,
        teachers,
    )


def data_info(cfg: RunConfig, data_path: str = "", cache_dir: str = "") -> DataInfo:
    """Input shape and number of classes of the configured data set. With a
    ``cache_dir`` (a site's state directory) they are kept there: finding them
    decodes the data set, which a deployed ClientApp would do every message."""
    first_client_path = cfg.client_data_paths.split(",")[0].strip()
    if cfg.dataset == "synthetic" and not data_path and not first_client_path:
        return DataInfo((cfg.sim_dim,), 2)
    from pfl_data.hf import hf_data_info

    source = data_path or first_client_path or cfg.dataset
    if not cache_dir:
        info = hf_data_info(source)
    else:
        from pfl_data.cache import cached_info, info_key

        def build() -> tuple[tuple[int, ...], int, tuple[str, ...]]:
            info = hf_data_info(source)
            return info.input_shape, info.num_classes, info.class_names

        key = info_key(cfg, data_path)
        info = DataInfo(*cached_info(Path(cache_dir) / "data-cache", key, build))
    names = run_class_names(cfg)
    if names:  # the run's classes, in the run's order: every site maps its labels by name
        return DataInfo(info.input_shape, len(names), names)
    return info


def site_class_names(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = "", cache_dir: str = ""
) -> tuple[str, ...]:
    """This client's own class list, in its label order (empty if its data name none)."""
    if data_path or not cfg.client_data_paths:
        return data_info(cfg, data_path, cache_dir).class_names
    from pfl_data.hf import _client_path, hf_data_info

    return hf_data_info(_client_path(cfg, partition_id, num_partitions)).class_names


def run_class_names(cfg: RunConfig) -> tuple[str, ...]:
    """The run's ``class-names`` (empty: each data set's own label ids)."""
    return tuple(n.strip() for n in cfg.class_names.split(",") if n.strip())


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


# A simulation actor serves every client in turn: with fewer slots than clients per actor
# every message would miss and decode its client's data again (docs/PERFORMANCE.md,
# the overhead preset). 256 slots bound the memory to 256 clients' tensors.
@lru_cache(maxsize=256)
def load_client_data(
    cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str = "", cache_dir: str = ""
) -> ClientData:
    """One client's data. ``data_path`` (a site's own data in deployment)
    replaces ``cfg.dataset`` and is used whole, without partitioning. With a
    ``cache_dir`` (a site's state directory) decoded image data are kept there
    between messages (pfl_data/cache.py)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition id {partition_id} not in [0, {num_partitions})")
    if cfg.dataset == "synthetic" and not data_path and not cfg.client_data_paths:
        study = simulation_study(cfg, num_partitions)
        x, y = study.features[partition_id], study.labels[partition_id]
        return _to_tensors(*split_train_test(x, y, cfg.test_fraction, cfg.seed + partition_id))
    from pfl_data.hf import load_client_arrays

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return load_client_arrays(cfg, partition_id, num_partitions, data_path)

    if not cache_dir:
        return _to_tensors(*build())
    from pfl_data.cache import cache_key, cached_arrays

    key = cache_key(cfg, partition_id, num_partitions, data_path)
    arrays = cached_arrays(Path(cache_dir) / "data-cache", key, build)
    return _to_tensors(*(np.array(a) for a in arrays))  # memory-mapped -> owned, writable
