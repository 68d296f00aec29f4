"""Where a data set comes from: a local parquet or CSV file, a folder of parquet
files, an image folder, or a Hugging Face hub name (with a clear message offline).
Every source becomes one ``datasets.Dataset`` whose splits are a column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pflower.config.schema import ConfigError
from pflower.data.tables import SPLIT_COLUMN


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
