"""Pre-flight: the run config Flower will build, validated, plus cheap data checks.

Nothing here imports torch or the data libraries: a bad key fails in about a
second. The data checks read only a parquet file's schema and first row.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from methods import parse_run_config
from run_config.schema import ConfigError, RunConfig, check_against_data

# Models that need image inputs (C, H, W), and the smallest side each accepts.
_MIN_SIDE = {"cnn4": 16, "resnet8": 8, "resnet10": 8, "resnet18": 8}


def flwr_run_config(project_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """The run config ``flwr run`` would send: the app's defaults fused with the
    ``--run-config`` overrides, by Flower's own functions."""
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    try:
        parsed = parse_config_args(overrides or None)
    except Exception as err:  # noqa: BLE001 - click's exception carries the message
        message = getattr(err, "message", None) or str(err)
        raise ConfigError(f"--run-config: {message}") from None
    try:
        return get_fused_config_from_dir(project_dir, parsed)
    except ValueError as err:  # a key the app does not define
        key = str(err).split("'")[1] if "'" in str(err) else str(err)
        raise ConfigError(f"unknown config key '{key}'") from None


def _parquet_peek(path: Path) -> tuple[tuple[int, ...], int] | None:
    """(input shape, number of classes) of a Hugging Face-schema parquet file, read
    from its schema, its label column and its first image; None if not that schema."""
    import io
    import json

    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - a corrupt or foreign file
        raise ConfigError(
            f"config key 'dataset': {path} is not a readable parquet file ({err})"
        ) from None
    names = pf.schema_arrow.names
    label = next((c for c in ("label", "labels", "fine_label") if c in names), None)
    image = next((c for c in ("img", "image") if c in names), None)
    if label is None or image is None:
        return None
    meta = pf.schema_arrow.metadata or {}
    classes = None
    if b"huggingface" in meta:
        feature = json.loads(meta[b"huggingface"]).get("info", {}).get("features", {})
        classes = len(feature.get(label, {}).get("names", []) or []) or None
    if classes is None:
        labels = pf.read(columns=[label]).column(0).to_numpy()
        classes = int(labels.max()) + 1
    first = pf.read_row_group(0, columns=[image]).column(0)[0].as_py()
    raw = first.get("bytes") if isinstance(first, dict) else None
    if raw is None:
        return None
    from PIL import Image

    img = Image.open(io.BytesIO(raw))
    channels = 1 if img.mode in ("L", "1", "I", "F") else 3
    return (channels, img.size[1], img.size[0]), classes


def data_checks(
    cfg: RunConfig, project_dir: Path
) -> tuple[str, tuple[tuple[int, ...], int] | None]:
    """The cheap checks: the data exist, the partitioner fits the classes, the
    model takes the data's shape. Returns a short description of the data and,
    where known without loading it, (input shape, number of classes)."""
    paths = [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    key = "client-data-paths" if paths else "dataset"
    if not paths:
        if cfg.dataset == "synthetic":
            return cfg.dataset, ((cfg.sim_dim,), 2)
        if cfg.dataset == "sklearn-digits":
            return cfg.dataset, ((1, 8, 8), 10)
        paths = [cfg.dataset]
    shape_classes = None
    described = []
    for name in paths:
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = project_dir / path
        looks_local = name.startswith(("/", ".", "~")) or name.endswith(".parquet")
        if not path.exists():
            if looks_local or name.count("/") > 1:
                raise ConfigError(f"config key '{key}': {name!r} does not exist")
            described.append(f"{name} (hub)")
            continue
        if path.is_file() and path.suffix == ".parquet":
            peek = _parquet_peek(path)
            if peek is not None:
                shape, classes = peek
                check_against_data(cfg, classes)
                side = _MIN_SIDE.get(cfg.model)
                if side is not None and min(shape[1:]) < side:
                    raise ConfigError(
                        f"config key 'model': '{cfg.model}' needs images of at least "
                        f"{side}x{side}, {name} has {shape[1]}x{shape[2]}"
                    )
                described.append(f"{name} ({classes} classes, {shape})")
                shape_classes = shape_classes or peek
                continue
        if not path.is_dir() and not path.is_file():
            raise ConfigError(f"config key '{key}': {name!r} is not a file or folder")
        described.append(name)
    return ", ".join(described), shape_classes


def model_checks(cfg: RunConfig, shape_classes: tuple[tuple[int, ...], int] | None) -> None:
    """Build the method's model for the data's shape and pass one dummy batch through
    it, as the run will: a model that cannot take the data (an image model on the
    generated vectors, images too small for it) is a config error naming the key.
    This imports torch (a few seconds), after every key has been checked."""
    if shape_classes is None:
        return
    import torch

    from methods import get_method
    from pfl_data import DataInfo

    shape, classes = shape_classes
    try:
        model = get_method(cfg.method).build_model(cfg, DataInfo(shape, classes))
        model.eval()
        with torch.no_grad():
            model(torch.zeros((2, *shape)))
    except ConfigError:
        raise  # a method's own check (FedFac's fedfac.fa-layers) names its key
    except Exception as err:  # noqa: BLE001 - any failure here is the run's first crash
        kind = "vectors of" if len(shape) == 1 else "inputs of shape"
        raise ConfigError(
            f"config key 'model': '{cfg.model}' cannot take the data's {kind} "
            f"{shape if len(shape) > 1 else shape[0]} (dataset={cfg.dataset!r}): "
            f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        ) from None


def preflight(project_dir: Path, overrides: list[str]) -> tuple[RunConfig, dict[str, Any], str]:
    """(validated config, raw config, data description); ConfigError on a bad one, or
    on a Flower or torch version the project's patches were not checked against."""
    import pfl_patches

    try:
        pfl_patches.check()
    except pfl_patches.UntestedVersion as err:
        raise ConfigError(str(err)) from None
    raw = flwr_run_config(project_dir, overrides)
    cfg = parse_run_config(raw)
    if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "config key 'tensorboard': true needs the tensorboard package "
            "(pip install -e '.[tensorboard]')"
        )
    described, shape_classes = data_checks(cfg, project_dir)
    model_checks(cfg, shape_classes)
    return cfg, raw, described
