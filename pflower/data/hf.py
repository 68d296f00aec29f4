"""Hugging Face data sets: a source, its scenarios, and one client's arrays.

One path for every real data set: a Hugging Face ``datasets.Dataset``, from a hub
name, a local parquet or CSV file, a folder of parquet files or an image folder
(pflower/data/loading.py), or ``sklearn-digits`` (scikit-learn's 8x8 digits). A
table becomes inputs as pflower/data/tables.py says; partitions come from
pflower/data/partitions.py.

Images are decoded once per process into a per-source cache of uint8 rows: a
partitioned set that fits ``DECODE_WHOLE_BYTES`` whole at its first client's
message, any other set only the rows a client asks for (a simulation actor
serving many clients fills it up over time).
"""

from __future__ import annotations

import io
import logging
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pflower.config.schema import ConfigError, RunConfig
from pflower.data import DataInfo
from pflower.data.loading import _load_hf
from pflower.data.tables import NO_TABLE_KEYS, Tabular, _refuse_missing, tabular_inputs

log = logging.getLogger(__name__)

IMAGE_COLUMNS = ("img", "image")
LABEL_COLUMNS = ("label", "fine_label", "labels")
DOMAIN_SHIFTS = ("identity", "grayscale", "rotate90", "colour-shift", "blur", "invert")
_STATS_ROWS = 2048  # rows used to compute per-channel normalisation statistics
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # torchvision's weights
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# A simulated client's first message would decode its own rows inside a round; a set
# whose decoded images fit this many bytes is decoded whole at the first client's
# message instead, in one pass (rows no client holds included), so later rounds train
# rather than decode. Larger sets stay decoded row by row as clients ask.
DECODE_WHOLE_BYTES = 256 * 2**20


# ----------------------------------------------------------------------------- sources


@dataclass
class _Source:
    """One loaded data set: labels in memory, inputs decoded on demand."""

    name: str
    labels: np.ndarray  # (n,) int64
    num_classes: int
    input_shape: tuple[int, ...]
    columns: dict[str, np.ndarray]  # other plain columns (split, partition-by ids)
    class_names: tuple[str, ...] = ()  # the label column's ClassLabel names, if any
    ds: Any = None  # datasets.Dataset with undecoded images, Arrow-formatted (image sources)
    image_column: str | None = None
    mode: str = "RGB"
    dense: np.ndarray | None = None  # fully materialised float32 inputs (tabular/digits)
    tabular: bool = False  # a table: each site standardises with its own training rows
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    _cache: np.ndarray | None = None  # (n, C, H, W) uint8, decoded rows
    _done: np.ndarray | None = None  # (n,) bool, which rows are decoded
    _whole: bool = False  # every row decoded (decode_whole)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3

    def raw(self, idx: np.ndarray) -> np.ndarray:
        """float32 inputs of rows ``idx`` before normalisation ([0, 1] for images)."""
        idx = np.asarray(idx, dtype=np.int64)
        if self.dense is not None:
            return self.dense[idx]
        with self._lock:
            self._decode(idx)
            return self._cache[idx].astype(np.float32) / 255.0

    def decode_whole(self) -> None:
        """Decode every row now, in one pass, if the decoded set fits
        ``DECODE_WHOLE_BYTES`` (else rows stay decoded as clients ask for them)."""
        if self.dense is not None or self._whole:
            return
        n = len(self.labels)
        if n * int(np.prod(self.input_shape)) > DECODE_WHOLE_BYTES:
            return
        with self._lock:
            self._decode(np.arange(n))
            self._whole = True

    def _decode(self, idx: np.ndarray) -> None:
        """(Under the lock.) Decode the rows of ``idx`` not decoded yet into the cache."""
        if self._cache is None:
            self._cache = np.zeros((len(self.labels), *self.input_shape), dtype=np.uint8)
            self._done = np.zeros(len(self.labels), dtype=bool)
        assert self._done is not None
        todo = np.unique(idx[~self._done[idx]])
        if len(todo):
            # rows of the Arrow-formatted set, not select_columns' new data set per
            # call (most of a call's time went to its fingerprint and copied features)
            cells = self.ds[todo.tolist()].column(self.image_column).to_pylist()
            for row, cell in zip(todo, cells, strict=True):
                self._cache[row] = _decode(cell, self.mode, self.input_shape)
            self._done[todo] = True

    def normalise(self, x: np.ndarray, imagenet: bool = False) -> np.ndarray:
        """Per-channel standardisation: the data set's own statistics, or ImageNet's
        (what torchvision's pretrained weights were trained on) for 3-channel images."""
        shape = (1, -1, 1, 1) if self.is_image else (1, -1)
        mean, std = self.mean, self.std
        if imagenet and self.is_image and self.input_shape[0] == 3:
            mean, std = IMAGENET_MEAN, IMAGENET_STD
        return ((x - mean.reshape(shape)) / std.reshape(shape)).astype(np.float32)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_MODES = {0: "L", 2: "RGB"}  # IHDR colour type -> the mode its pixels are in


def png_as_is(data: bytes, mode: str, shape: tuple[int, ...]) -> bool:
    """Whether ``data`` is an 8-bit PNG already in ``mode`` at ``shape``'s size: its
    pixels are the image's as stored (PNG is lossless), so any decoder gives PIL's."""
    return (
        data[:8] == PNG_SIGNATURE
        and data[12:16] == b"IHDR"
        and data[24] == 8
        and PNG_MODES.get(data[25]) == mode
        and int.from_bytes(data[16:20], "big") == shape[2]
        and int.from_bytes(data[20:24], "big") == shape[1]
    )


def _decode(cell: Any, mode: str, shape: tuple[int, ...]) -> np.ndarray:
    from PIL import Image

    data = cell.get("bytes") if isinstance(cell, dict) else None
    if data and png_as_is(data, mode, shape):
        # torchvision's libpng decoder: the same pixels as PIL's in less time, no PIL
        # image in between
        import torch
        from torchvision.io import ImageReadMode, decode_png

        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_png(raw, ImageReadMode.UNCHANGED).numpy()
    if isinstance(cell, dict):
        img = (
            Image.open(io.BytesIO(cell["bytes"])) if cell.get("bytes") else Image.open(cell["path"])
        )
    else:
        img = cell
    img = img.convert(mode)
    if img.size != (shape[2], shape[1]):
        img = img.resize((shape[2], shape[1]), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def _digits() -> _Source:
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover
        raise ImportError("dataset='sklearn-digits' needs scikit-learn installed") from err
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    y = d.target.astype(np.int64)
    return _finish(_Source("sklearn-digits", y, 10, (1, 8, 8), {}, dense=x))


def _column(ds: Any, col: str) -> np.ndarray:
    """A plain column as numpy, through Arrow (no per-row formatting)."""
    arr = ds.with_format("arrow")[col]
    arr = arr.combine_chunks() if hasattr(arr, "combine_chunks") else arr
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _num_classes(ds: Any, label_col: str, labels: np.ndarray) -> int:
    import datasets

    feat = ds.features[label_col]
    if isinstance(feat, datasets.ClassLabel):
        return int(feat.num_classes)
    return int(labels.max()) + 1 if len(labels) else 0


def source_from_dataset(
    ds: Any, name: str = "<in-memory>", tabular: Tabular = NO_TABLE_KEYS
) -> _Source:
    """Wrap an in-memory ``datasets.Dataset`` (image or tabular) as a source."""
    import datasets

    if tabular.label:
        if tabular.label not in ds.column_names:
            raise ConfigError(
                f"config key 'label-column': {tabular.label!r} is not a column of {name} "
                f"(columns: {ds.column_names})"
            )
        label_col = tabular.label
    else:
        label_col = next((c for c in LABEL_COLUMNS if c in ds.column_names), None)
    if label_col is None:
        raise ValueError(
            f"config key 'dataset': {name} has no label column (one of {LABEL_COLUMNS}; "
            f"or name it with label-column); columns are {ds.column_names}"
        )
    raw_labels = _column(ds, label_col)
    _refuse_missing(raw_labels, label_col, "label-column", name)
    labels = raw_labels.astype(np.int64)
    image_col = next(
        (c for c in IMAGE_COLUMNS if c in ds.column_names),
        next((c for c, f in ds.features.items() if isinstance(f, datasets.Image)), None),
    )
    plain = {}
    for col in ds.column_names:
        if col in (label_col, image_col):
            continue
        feat = ds.features[col]
        if isinstance(feat, datasets.Value) or isinstance(feat, datasets.ClassLabel):
            plain[col] = _column(ds, col)
    src = _Source(name, labels, _num_classes(ds, label_col, labels), (), {})
    if isinstance(ds.features[label_col], datasets.ClassLabel):
        src.class_names = tuple(ds.features[label_col].names)
    if image_col is not None:
        raw = ds.cast_column(image_col, datasets.Image(decode=False))
        first = raw[0][image_col]
        from PIL import Image

        img = (
            Image.open(io.BytesIO(first["bytes"]))
            if first.get("bytes")
            else Image.open(first["path"])
        )
        mode = "L" if img.mode in ("1", "L", "LA", "I", "I;16", "F") else "RGB"
        w, h = img.size
        src.ds, src.image_column, src.mode = raw.with_format("arrow"), image_col, mode
        src.input_shape = (1 if mode == "L" else 3, h, w)
        src.columns = plain
    else:
        src.dense, src.columns = tabular_inputs(plain, name, tabular)
        src.input_shape, src.tabular = (src.dense.shape[1],), True
    return _finish(src)


def _finish(src: _Source) -> _Source:
    """Normalisation statistics, computed once over (a fixed sample of) the data set."""
    n = len(src.labels)
    rows = np.unique(np.linspace(0, n - 1, min(n, _STATS_ROWS)).astype(np.int64))
    x = src.raw(rows) if src.is_image else src.dense
    axes = (0, 2, 3) if src.is_image else (0,)
    src.mean = x.mean(axis=axes).astype(np.float32)
    src.std = np.maximum(x.std(axis=axes), 1e-6).astype(np.float32)
    return src


@lru_cache(maxsize=16)
def load_source(name_or_path: str, tabular: Tabular = NO_TABLE_KEYS) -> _Source:
    """The data set behind a ``dataset`` value or a path (cached per process)."""
    if name_or_path == "sklearn-digits":
        return _digits()
    return source_from_dataset(_load_hf(name_or_path), name_or_path, tabular)


def hf_data_info(name_or_path: str, tabular: Tabular = NO_TABLE_KEYS) -> DataInfo:
    """Input shape (after the transform), number of classes and class names of a data set."""
    src = load_source(name_or_path, tabular)
    return DataInfo(tuple(src.input_shape), src.num_classes, tuple(src.class_names))


def to_run_classes(src: _Source, names: tuple[str, ...], where: str) -> np.ndarray:
    """The table from ``src``'s label ids to the run's (``class-names``), by name; a
    class the run does not know is a config error naming it."""
    if not src.class_names:
        raise ValueError(
            f"config key 'class-names': {where} has integer labels with no names to map"
        )
    known = {n: i for i, n in enumerate(names)}
    unknown = [n for n in src.class_names if n not in known]
    if unknown:
        folded = {" ".join(n.split()).casefold(): n for n in names}
        near = [folded[k] for k in (" ".join(n.split()).casefold() for n in unknown) if k in folded]
        hint = f"; the run lists {near}: one class spelled two ways, rename to one" if near else ""
        raise ValueError(
            f"config key 'class-names': {where} has class(es) {unknown} that the run does "
            f"not list ({', '.join(names)}){hint}"
        )
    return np.array([known[n] for n in src.class_names], dtype=np.int64)


# ----------------------------------------------------------------------------- scenarios


def label_permutation(num_classes: int, seed: int, partition_id: int) -> np.ndarray:
    """Client ``partition_id``'s own permutation of the label ids (permute-labels)."""
    return np.random.default_rng([seed, 13, partition_id]).permutation(num_classes)


def apply_domain_shift(x: np.ndarray, shift: int) -> np.ndarray:
    """Images (n, C, H, W) in [0, 1] through fixed transform ``shift`` of DOMAIN_SHIFTS."""
    import torch
    from torchvision.transforms.v2 import functional as F

    name = DOMAIN_SHIFTS[shift % len(DOMAIN_SHIFTS)]
    t = torch.from_numpy(np.ascontiguousarray(x))
    c = t.shape[1]
    if name == "grayscale":
        t = F.rgb_to_grayscale(t, num_output_channels=c) if c == 3 else t
    elif name == "rotate90":
        t = torch.rot90(t, 1, dims=(2, 3)) if t.shape[2] == t.shape[3] else F.rotate(t, 90.0)
    elif name == "colour-shift":
        perm = [1, 2, 0] if c == 3 else list(range(c))
        t = F.adjust_brightness(t[:, perm], 1.3)
    elif name == "blur":
        k = 3 if min(t.shape[2:]) < 64 else 5
        t = F.gaussian_blur(t, kernel_size=[k, k], sigma=[1.0, 1.0])
    elif name == "invert":
        t = F.invert(t)
    return t.clamp(0.0, 1.0).numpy().astype(np.float32)


def _client_path(cfg: RunConfig, partition_id: int, num_partitions: int) -> str:
    paths = [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    if len(paths) < num_partitions:
        raise ConfigError(
            f"config key 'client-data-paths': {len(paths)} paths for {num_partitions} clients "
            "(give one per client, comma-separated, or run as many clients as paths: "
            f'--federation-config "num-supernodes={len(paths)}")'
        )
    return paths[partition_id]


def _check_local(path: str, key: str) -> None:
    if path != "sklearn-digits" and not Path(path).expanduser().exists():
        raise FileNotFoundError(f"config key '{key}': data path {path!r} does not exist")
