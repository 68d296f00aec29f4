"""Answered (2026-11-28): torchvision's libpng decodes a CIFAR-10 PNG in about 0.6 of
PIL's time, the same pixels (written where it is used: pflower/data/hf.py ``_decode``).

A client's image decoding: the product's decoder (pflower/data/hf.py ``_decode``:
torchvision's libpng for an 8-bit PNG already in the wanted mode and size, PIL
otherwise) against PIL alone, side by side in one process, alternating, on the
CIFAR-10 dev set's PNGs; every image checked equal first.

    python -m benchmarks.studies.image_decode [--images 2000] [--repeats 3]

Prints milliseconds per image (best of the repeats) and the ratio.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def pil_decode(cell: dict[str, Any], mode: str, shape: tuple[int, ...]) -> np.ndarray:
    """The reference: PIL opens, converts and (if needed) resizes, as before."""
    from PIL import Image

    img = Image.open(io.BytesIO(cell["bytes"])).convert(mode)
    if img.size != (shape[2], shape[1]):
        img = img.resize((shape[2], shape[1]), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def per_image(decode: Callable[..., np.ndarray], cells: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    for cell in cells:
        decode(cell, "RGB", (3, 32, 32))
    return (time.perf_counter() - start) / len(cells)


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq
    import torch

    from benchmarks.presets import CIFAR10_DEV
    from pflower.data.hf import _decode

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.image_decode", description=__doc__
    )
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # a simulated client's thread
    cells = pq.read_table(CIFAR10_DEV, columns=["img"]).column("img").to_pylist()[: args.images]
    for cell in cells:  # the same pixels, or no timing at all
        np.testing.assert_array_equal(
            _decode(cell, "RGB", (3, 32, 32)), pil_decode(cell, "RGB", (3, 32, 32))
        )
    best = {"PIL": float("inf"), "product": float("inf")}
    for _ in range(args.repeats):
        best["PIL"] = min(best["PIL"], per_image(pil_decode, cells))
        best["product"] = min(best["product"], per_image(_decode, cells))
    print(f"{len(cells)} CIFAR-10 PNGs, the same pixels; ms per image, best of {args.repeats}:")
    print("| decoder | ms per image |\n|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds * 1000:.4f} |")
    print(f"product / PIL: {best['product'] / best['PIL']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
