"""A site-local cache of one client's decoded, normalised arrays.

A cold deployed ClientApp runs in a fresh process for every message and would
decode the site's images again each time. A site that asks for it (node config
``data-cache="disk"``, ``deploy.site --data-cache``) has the first message write the
four arrays as .npy files under ``<state-dir>/data-cache/<key>/``, owner-only (0700
folders, 0600 files: a copy of the site's records); later messages memory-map them. The key hashes
the data's fingerprint (for every file under the data path: relative name, size
and modification time) and every config key that shapes a client's data, so a
changed data set or config gets a new entry. A cache that fails its checksum or
does not load is rebuilt, and the log says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pflower.config.schema import RunConfig

log = logging.getLogger("flwr.pflower")

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
NAMES = ("x_train", "y_train", "x_test", "y_test")
# The keys that decide what one client's arrays are (everything else trains them).
SHAPING_KEYS = (
    "dataset",
    "label-column",
    "split-column",
    "feature-columns",
    "categorical-columns",
    "partitioner",
    "alpha",
    "classes-per-client",
    "partition-by",
    "test-fraction",
    "train-per-client",
    "test-per-client",
    "permute-labels",
    "num-domains",
    "domain-groups",
    "domain-shift",
    "client-data-paths",
    "seed",
    "sim-samples",
    "sim-dim",
    "hidden-dim",
    "sim-shared-neurons",
    "sim-shared-covariates",
    "sim-noise",
    "sim-client-streams",
    "pretrained-weights",  # ImageNet normalisation
)


def fingerprint(path: str) -> list[tuple[str, int, int]]:
    """(relative name, size, mtime in ns) of every file under ``path`` (or of it)."""
    root = Path(path).expanduser()
    if not root.exists():
        return []
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f.relative_to(root)) if f != root else f.name, st.st_size, st.st_mtime_ns))
    return out


def cache_key(cfg: RunConfig, partition_id: int, num_partitions: int, data_path: str) -> str:
    config = cfg.as_dict()
    paths = [data_path] if data_path else [cfg.dataset]
    paths += [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    payload = {
        "config": {k: config[k] for k in SHAPING_KEYS},
        "partition": [partition_id, num_partitions, data_path],
        "data": {p: fingerprint(p) for p in paths},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def info_key(cfg: RunConfig, data_path: str) -> str:
    """What decides a data set's input shape and class count: the data and its transform."""
    paths = [data_path] if data_path else [cfg.dataset]
    paths += [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    payload = {
        "config": [cfg.dataset, cfg.client_data_paths, cfg.pretrained_weights]
        + [cfg.label_column, cfg.feature_columns, cfg.categorical_columns, cfg.partition_by],
        "data": {p: fingerprint(p) for p in paths},
    }
    return "info-" + hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def cached_info(
    cache_root: Path, key: str, build: Callable[[], tuple[tuple[int, ...], int, tuple[str, ...]]]
) -> tuple[tuple[int, ...], int, tuple[str, ...]]:
    """(input shape, number of classes, class names) from ``cache_root/key.json``, else
    built (which decodes the data set) and written; an unreadable or older entry is
    rebuilt."""
    path = cache_root / f"{key}.json"
    if path.exists():
        try:
            saved = json.loads(path.read_text())
            shape, classes = tuple(int(d) for d in saved["input_shape"]), int(saved["num_classes"])
            names = tuple(str(n) for n in saved["class_names"])
            if not shape or classes < 1:
                raise ValueError(f"implausible entry {saved}")
            return shape, classes, names
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("data cache: %s is unusable (%s); rebuilding it", path, err)
    shape, classes, names = build()
    try:
        private_folder(cache_root)
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        entry = {"input_shape": list(shape), "num_classes": classes, "class_names": list(names)}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(entry))
        os.replace(tmp, path)  # atomic, as the arrays' entries
    except OSError as err:
        log.info("data cache: %s not written (%s)", path, err)
    return shape, classes, names


def private_folder(path: Path) -> None:
    """``path`` (and its missing parents) made, readable by this user only."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _digest(arrays: Arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def cached_arrays(
    cache_root: Path,
    key: str,
    build: Callable[[], Arrays],
) -> Arrays:
    """The arrays under ``cache_root/key`` (memory-mapped), built and written the
    first time, rebuilt when the entry is corrupt."""
    entry = cache_root / key
    meta = entry / "meta.json"
    if meta.exists():
        try:
            arrays = tuple(np.load(entry / f"{n}.npy", mmap_mode="r") for n in NAMES)
            if json.loads(meta.read_text())["sha256"] != _digest(arrays):
                raise ValueError("checksum mismatch")
            log.info("data cache: loaded %s", entry)
            return arrays  # type: ignore[return-value]
        except (OSError, ValueError, KeyError) as err:
            log.warning("data cache: %s is unusable (%s); rebuilding it", entry, err)
            shutil.rmtree(entry, ignore_errors=True)
    arrays = build()
    private_folder(cache_root)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".tmp-"))  # 0700
    try:
        for name, a in zip(NAMES, arrays):
            with open(os.open(tmp / f"{name}.npy", os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
                np.save(out, np.ascontiguousarray(a), allow_pickle=False)
        (tmp / "meta.json").write_text(json.dumps({"sha256": _digest(arrays)}))
        os.replace(tmp, entry)  # atomic: another process sees all of it or none
        log.info("data cache: wrote %s", entry)
    except OSError as err:  # e.g. a concurrent writer won the rename: theirs is equal
        log.info("data cache: not written (%s)", err)
        shutil.rmtree(tmp, ignore_errors=True)
    return arrays
