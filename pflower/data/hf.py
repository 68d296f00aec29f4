"""Hugging Face data sets: sources, partitioners and scenarios.

One path for every real data set: a Hugging Face ``datasets.Dataset``, from
  * a hub name (``datasets.load_dataset(name, split="train")``, needs internet),
  * a local parquet file or a folder of parquet files,
  * a local image folder (``imagefolder``: one sub-folder per class, optionally
    under ``train/`` and ``test/``),
  * ``sklearn-digits`` (scikit-learn's 8x8 digits, shipped inside the package).

Images are decoded lazily and once per process: a per-source cache holds the
decoded uint8 rows and only the rows a client asks for are decoded (a
simulation actor serving many clients fills it up over time).

Partitioners: flwr-datasets where it has them (iid, dirichlet, pathological,
natural); ``dirichlet-client`` (FedDecomp's protocol) and ``domain``
(Factorized-FL's domain-heterogeneous scenario) are written by hand.
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
from pflower.data import DataInfo, split_train_test

log = logging.getLogger(__name__)

IMAGE_COLUMNS = ("img", "image")
LABEL_COLUMNS = ("label", "fine_label", "labels")
SPLIT_COLUMN = "split"
ROW_COLUMN = "__row__"
DOMAIN_SHIFTS = ("identity", "grayscale", "rotate90", "colour-shift", "blur", "invert")
_STATS_ROWS = 2048  # rows used to compute per-channel normalisation statistics
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # torchvision's weights
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


# ----------------------------------------------------------------------------- sources


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


@dataclass
class _Source:
    """One loaded data set: labels in memory, inputs decoded on demand."""

    name: str
    labels: np.ndarray  # (n,) int64
    num_classes: int
    input_shape: tuple[int, ...]
    columns: dict[str, np.ndarray]  # other plain columns (split, partition-by ids)
    class_names: tuple[str, ...] = ()  # the label column's ClassLabel names, if any
    ds: Any = None  # datasets.Dataset with undecoded images (image sources)
    image_column: str | None = None
    mode: str = "RGB"
    dense: np.ndarray | None = None  # fully materialised float32 inputs (tabular/digits)
    tabular: bool = False  # a table: each site standardises with its own training rows
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    _cache: np.ndarray | None = None  # (n, C, H, W) uint8, decoded rows
    _done: np.ndarray | None = None  # (n,) bool, which rows are decoded
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
            if self._cache is None:
                self._cache = np.zeros((len(self.labels), *self.input_shape), dtype=np.uint8)
                self._done = np.zeros(len(self.labels), dtype=bool)
            todo = np.unique(idx[~self._done[idx]])
            if len(todo):
                cells = self.ds.select_columns([self.image_column])[todo.tolist()]
                for row, cell in zip(todo, cells[self.image_column], strict=True):
                    self._cache[row] = _decode(cell, self.mode, self.input_shape)
                self._done[todo] = True
            return self._cache[idx].astype(np.float32) / 255.0

    def normalise(self, x: np.ndarray, imagenet: bool = False) -> np.ndarray:
        """Per-channel standardisation: the data set's own statistics, or ImageNet's
        (what torchvision's pretrained weights were trained on) for 3-channel images."""
        shape = (1, -1, 1, 1) if self.is_image else (1, -1)
        mean, std = self.mean, self.std
        if imagenet and self.is_image and self.input_shape[0] == 3:
            mean, std = IMAGENET_MEAN, IMAGENET_STD
        return ((x - mean.reshape(shape)) / std.reshape(shape)).astype(np.float32)


def _decode(cell: Any, mode: str, shape: tuple[int, ...]) -> np.ndarray:
    from PIL import Image

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


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or name.endswith((".parquet", ".csv", ".arrow"))
        or name.count("/") > 1
    )


def _load_hf(name: str) -> Any:
    """The ``datasets.Dataset`` for a hub name or local path; splits become a column."""
    import datasets

    path = Path(name).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix not in (".parquet", ".csv"):
                raise ValueError(f"config key 'dataset': {name} is not a .parquet or .csv file")
            dd = datasets.load_dataset(path.suffix[1:], data_files=str(path))
        elif any(path.rglob("*.parquet")):
            files = sorted(str(p) for p in path.rglob("*.parquet"))
            by_split: dict[str, list[str]] = {}
            for f in files:
                rel = Path(f).relative_to(path).as_posix().lower()
                split = "test" if "test" in rel else "train"
                by_split.setdefault(split, []).append(f)
            dd = datasets.load_dataset("parquet", data_files=by_split)
        else:
            _refuse_folder_without_images(path, name)
            dd = datasets.load_dataset("imagefolder", data_dir=str(path))
        return _merge_splits(dd)
    if _looks_like_path(name):
        raise FileNotFoundError(
            f"config key 'dataset': local data set {name!r} does not exist "
            "(give an existing parquet file, parquet folder or image folder)"
        )
    hint = (
        "Without internet, pass a local path via dataset=<parquet file | parquet folder | "
        "image folder> (e.g. /data/cifar10.parquet) or "
        "dataset='sklearn-digits' (or set HF_HUB_OFFLINE=1 to use a copy already cached)."
    )
    if not datasets.config.HF_HUB_OFFLINE and not _hub_reachable():
        raise RuntimeError(
            f"config key 'dataset': {name!r} is not a local path and the Hugging Face hub "
            f"cannot be reached. {hint}"
        )
    try:
        return datasets.load_dataset(name, split="train")
    except Exception as err:  # offline, unknown name, gated...
        raise RuntimeError(
            f"config key 'dataset': could not load {name!r} from the Hugging Face hub "
            f"({type(err).__name__}: {err}). {hint}"
        ) from err


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _refuse_folder_without_images(path: Path, name: str) -> None:
    """ConfigError for a folder that is neither parquet nor images (``datasets`` would
    say 'Instruction "train" corresponds to no data!'): a folder of CSV files most often."""
    if any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.rglob("*") if p.is_file()):
        return
    tables = sorted(p.name for p in path.rglob("*.csv"))
    if tables:
        raise ConfigError(
            f"config key 'dataset': {name} is a folder of CSV files ({', '.join(tables[:3])}"
            f"{', ...' if len(tables) > 3 else ''}); give the one table itself, a .csv file"
        )
    raise ConfigError(
        f"config key 'dataset': {name} holds no parquet file and no images (an image "
        "folder has one sub-folder of images a class)"
    )


def _hub_reachable() -> bool:
    """Fast check (DNS only) so that an offline machine fails at once, not after retries."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(datasets_endpoint()).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def datasets_endpoint() -> str:
    """The hub endpoint the ``datasets`` library talks to."""
    import datasets

    return str(getattr(datasets.config, "HF_ENDPOINT", "https://huggingface.co"))


def _merge_splits(dd: Any) -> Any:
    import datasets

    if isinstance(dd, datasets.Dataset):
        return dd
    names = list(dd.keys())
    if len(names) == 1:
        return dd[names[0]]
    parts = []
    for split in names:
        part = dd[split]
        if SPLIT_COLUMN not in part.column_names:
            part = part.add_column(SPLIT_COLUMN, [split] * len(part))
        parts.append(part)
    return datasets.concatenate_datasets(parts)


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


def _is_id_column(name: str) -> bool:
    """Tabular columns that are ids (natural partitions, splits) or label groups
    (``coarse_label``: a feature made of it would leak the label), not features."""
    n = name.lower()
    ids = (SPLIT_COLUMN, "id", "client", "user", "writer", "domain", "coarse_label")
    return n in ids or n.endswith("_id")


def _num_classes(ds: Any, label_col: str, labels: np.ndarray) -> int:
    import datasets

    feat = ds.features[label_col]
    if isinstance(feat, datasets.ClassLabel):
        return int(feat.num_classes)
    return int(labels.max()) + 1 if len(labels) else 0


def source_from_dataset(
    ds: Any, name: str = "<in-memory>", tabular: Tabular = Tabular()
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
        src.ds, src.image_column, src.mode = raw, image_col, mode
        src.input_shape = (1 if mode == "L" else 3, h, w)
        src.columns = plain
    else:
        tabular_inputs(src, plain, name, tabular)
    return _finish(src)


def tabular_inputs(src: _Source, plain: dict[str, np.ndarray], name: str, tab: Tabular) -> None:
    """The feature matrix of a table: the declared (or every numeric) feature columns,
    then each categorical column's indicators; a missing value is refused."""
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
    src.dense = np.concatenate(parts, axis=1).astype(np.float32)
    src.input_shape = (src.dense.shape[1],)
    src.tabular = True
    used = {*feats, *categorical}
    src.columns = {c: v for c, v in plain.items() if c not in used}


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
def load_source(name_or_path: str, tabular: Tabular = Tabular()) -> _Source:
    """The data set behind a ``dataset`` value or a path (cached per process)."""
    if name_or_path == "sklearn-digits":
        return _digits()
    return source_from_dataset(_load_hf(name_or_path), name_or_path, tabular)


def hf_data_info(name_or_path: str, tabular: Tabular = Tabular()) -> DataInfo:
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


# ----------------------------------------------------------------------------- partitioners


def _light_dataset(src: _Source, extra: tuple[str, ...] = ()) -> Any:
    """Labels, row ids and the named columns only: partitioners never touch images."""
    import datasets

    cols: dict[str, Any] = {"label": src.labels, ROW_COLUMN: np.arange(len(src.labels))}
    for c in extra:
        if c != "label":
            cols[c] = src.columns[c]
    return datasets.Dataset.from_dict(cols)


def _rows(partitioner: Any, pid: int) -> np.ndarray:
    return _column(partitioner.load_partition(pid), ROW_COLUMN).astype(np.int64)


def library_partitions(
    src: _Source,
    partitioner: str,
    num_partitions: int,
    seed: int,
    alpha: float = 0.5,
    classes_per_client: int = 2,
) -> tuple[np.ndarray, ...]:
    """Row indices of every partition, from flwr-datasets' partitioners."""
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
    )

    ds = _light_dataset(src)
    n = len(src.labels)
    if partitioner == "iid":
        part = IidPartitioner(num_partitions)
        ds = ds.shuffle(seed=seed)  # IidPartitioner shards contiguously
    elif partitioner == "dirichlet":
        part = DirichletPartitioner(
            num_partitions,
            partition_by="label",
            alpha=alpha,
            min_partition_size=max(2, min(10, n // (2 * num_partitions))),
            self_balancing=False,
            seed=seed,
        )
    elif partitioner == "pathological":
        part = PathologicalPartitioner(
            num_partitions,
            partition_by="label",
            num_classes_per_partition=classes_per_client,
            # client i surely gets class i % C, so every class is used when N >= C
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    else:
        raise ValueError(f"config key 'partitioner': {partitioner!r} is not a library partitioner")
    part.dataset = ds
    try:
        return tuple(_rows(part, i) for i in range(num_partitions))
    except ValueError as err:
        key = {"dirichlet": "alpha", "pathological": "classes-per-client"}.get(
            partitioner, "partitioner"
        )
        raise ConfigError(
            f"config key '{key}': the {partitioner} partition of {n} rows into "
            f"{num_partitions} clients failed: {err}"
        ) from err


@lru_cache(maxsize=8)
def _cached_library_partitions(
    name: str,
    partitioner: str,
    num_partitions: int,
    seed: int,
    alpha: float,
    cpc: int,
    tabular: Tabular = Tabular(),
) -> tuple[np.ndarray, ...]:
    src = load_source(name, tabular)
    return library_partitions(src, partitioner, num_partitions, seed, alpha, cpc)


def natural_partition(src: _Source, partition_by: str, partition_id: int) -> np.ndarray:
    """Rows of the ``partition_id``-th id (sorted) of column ``partition_by``."""
    from flwr_datasets.partitioner import NaturalIdPartitioner

    if partition_by not in src.columns:
        raise ConfigError(
            f"config key 'partition-by': column {partition_by!r} is not in the data set "
            f"(plain columns: {sorted(src.columns)})"
        )
    part = NaturalIdPartitioner(partition_by=partition_by)
    part.dataset = _light_dataset(src, (partition_by,))
    if partition_id >= part.num_partitions:
        raise ConfigError(
            f"config key 'partition-by': column {partition_by!r} has {part.num_partitions} "
            f"ids, fewer than partition id {partition_id} + 1 (set num-supernodes to match)"
        )
    return _rows(part, partition_id)


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
    name: str, kind: str, num_partitions: int, key: tuple, tabular: Tabular = Tabular()
) -> tuple:
    src = load_source(name, tabular)
    if kind == "dirichlet-client":
        return dirichlet_client_partitions(src.labels, src.num_classes, num_partitions, *key)
    groups_kind, num_domains, seed = key
    groups = groups_for(src, groups_kind, num_domains, seed)
    return domain_partitions(src.labels, groups, num_partitions, seed)


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
                f"{sorted(set(values))[:5]}"
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
