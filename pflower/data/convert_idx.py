"""Convert MNIST-style idx files (e.g. Debian's ``dataset-fashion-mnist``) to parquet.

    apt-get install -y dataset-fashion-mnist
    python -m pflower.data.convert_idx /usr/share/datasets/fashion-mnist fashion-mnist.parquet

Writes a Hugging Face parquet with ``image`` (PNG bytes in the Image struct),
``label`` and ``split`` (train/test, from the idx file names), loadable with
``dataset=<out.parquet>``.
"""

from __future__ import annotations

import gzip
import io
import struct
import sys
from pathlib import Path

import numpy as np

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def read_idx(path: Path) -> np.ndarray:
    """An idx file (optionally gzipped) as a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(folder: Path, prefix: str, kind: str) -> Path | None:
    hits = sorted(folder.glob(f"{prefix}-{kind}-idx*"))
    return hits[0] if hits else None


def convert(folder: str | Path, out: str | Path) -> int:
    """Write ``out`` from the train/t10k idx pairs in ``folder``; returns the row count."""
    import datasets
    from PIL import Image

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of idx files")
    images, labels, splits = [], [], []
    for prefix, split in (("train", "train"), ("t10k", "test")):
        img_path, lab_path = _find(folder, prefix, "images"), _find(folder, prefix, "labels")
        if img_path is None or lab_path is None:
            continue
        x, y = read_idx(img_path), read_idx(lab_path)
        for img in x:
            buf = io.BytesIO()
            Image.fromarray(img, mode="L").save(buf, format="PNG")
            images.append({"bytes": buf.getvalue(), "path": None})
        labels += [int(v) for v in y]
        splits += [split] * len(y)
    if not labels:
        raise FileNotFoundError(f"no '*-images-idx*' / '*-labels-idx*' pairs in {folder}")
    num_classes = max(labels) + 1
    names = (
        list(FASHION_MNIST_CLASSES) if num_classes == 10 else [str(i) for i in range(num_classes)]
    )
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=names),
            "split": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"image": images, "label": labels, "split": splits}, features=features
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(out))
    return len(ds)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m pflower.data.convert_idx <idx-dir> <out.parquet>``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit(
            "usage: python -m pflower.data.convert_idx <dir-with-idx-files> <out.parquet>"
        )
    n = convert(args[0], args[1])
    print(f"wrote {n} rows to {args[1]}")


if __name__ == "__main__":
    main()
