"""Answered (2026-12-06): a streamed round's per-reply passes on ResNet-18 (issue #91):
the value check, the norm and the dot with the centre in one vectorized pass, 3x the
element-order passes it replaced, the norm and the dot within float64's rounding of an
exactly rounded sum (docs/notes/2026-12-06-the-client-paths-cpu-and-cnn4-as-a-cohort.md).

The server's fold of one reply (strategies/streaming.py): before, the value check
(``kernels.value_range``: finite, largest magnitude) and the moments (squares and dot
summed in element order) were a pass each, and a reply that waited for the reservoir
had its moments taken twice; now ``kernels.reply_moments`` does the check and both
sums in one pass, its sums reassociated so they vectorize; the double-double sum is
the second pass either way. On ResNet-18's float tensors (FedPer's upload, 11M
floats), best of the repeats, CPU ms a reply; then each sum's distance from
``math.fsum`` of the same float64 terms (exactly rounded), relative.

    python -m benchmarks.studies.fold_pass [--repeats 5] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Callable

import numpy as np

from strategies import kernels


@functools.cache
def element_order() -> Callable[..., tuple[float, float]]:
    """The moments as they were (reference for this study): squares and dot summed in
    element order, no fast-math."""

    @kernels._njit()
    def moments(
        upload: np.ndarray, reference: np.ndarray, unit: np.ndarray, at: int
    ) -> tuple[float, float]:
        squares, dot = 0.0, 0.0
        for i in range(upload.size):
            d = np.float64(upload[i]) - np.float64(reference[i])
            squares += d * d
            dot += d * unit[at + i]
        return squares, dot

    return moments


def resnet18_sizes(scale: float) -> list[int]:
    """The sizes of ResNet-18's float tensors but its head (FedPer's upload), scaled."""
    from torchvision.models import resnet18

    sizes = [
        int(v.numel()) for k, v in resnet18().state_dict().items()
        if v.is_floating_point() and not k.startswith("fc.")
    ]  # fmt: skip
    return [max(1, int(n * scale)) for n in sizes]


def _best(call: Callable[[], object], repeats: int) -> float:
    call()
    best = math.inf
    for _ in range(repeats):
        start = time.thread_time()
        call()
        best = min(best, time.thread_time() - start)
    return 1000 * best


def main(argv: list[str] | None = None) -> int:
    """Prints the two tables; 0, or 1 where a pass's verdict or a sum is off."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="of each tensor's size")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    sizes = resnet18_sizes(args.scale)
    reference = [rng.normal(scale=0.05, size=n).astype(np.float32) for n in sizes]
    upload = [(r + rng.normal(scale=1e-3, size=r.size)).astype(np.float32) for r in reference]
    unit = rng.normal(size=sum(sizes))
    unit /= np.linalg.norm(unit)
    check, old, new = kernels.value_range(), element_order(), kernels.reply_moments()

    def before(times: int) -> tuple[float, float]:
        for u in upload:
            check(u)
        for _ in range(times):
            squares, dot, at = 0.0, 0.0, 0
            for u, r in zip(upload, reference):
                s, d = old(u, r, unit, at)
                squares, dot, at = squares + s, dot + d, at + u.size
        return squares, dot

    def after() -> tuple[int, float, float]:
        outside, squares, dot, at = 0, 0.0, 0.0, 0
        for u, r in zip(upload, reference):
            o, s, d = new(u, r, unit[at : at + u.size], 1e6)
            outside, squares, dot, at = outside + o, squares + s, dot + d, at + u.size
        return outside, squares, dot

    rows = {
        "before: check, then moments (a reply judged on arrival)": _best(
            lambda: before(1), args.repeats
        ),
        "before: check, then moments twice (a reply that waited)": _best(
            lambda: before(2), args.repeats
        ),
        "after: check and moments in one pass": _best(after, args.repeats),
    }
    total = kernels.two_sum()
    hi, lo = np.zeros(max(sizes)), np.zeros(max(sizes))
    rows["either: the sum (double-double)"] = _best(
        lambda: [total(u, 32.0, hi[: u.size], lo[: u.size]) for u in upload], args.repeats
    )
    print(f"ResNet-18's upload: {sum(sizes):,} floats, best of {args.repeats}")
    print("| pass | CPU ms a reply |")
    print("|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} |")

    d = np.concatenate([u.astype(np.float64) - r for u, r in zip(upload, reference)])
    exact = {"squares": math.fsum(d * d), "dot": math.fsum(d * unit)}
    outside, *mine = after()
    sums = {
        "element order (before)": before(1),
        "reassociated (after)": tuple(mine),
        "numpy (pairwise)": (float(np.sum(d * d)), float(np.sum(d * unit))),
    }
    print("| sum | squares: relative to fsum | dot: relative to fsum |")
    print("|---|---|---|")
    worst = 0.0
    for name, (s, t) in sums.items():
        rel = [
            abs(s - exact["squares"]) / exact["squares"],
            abs(t - exact["dot"]) / abs(exact["dot"]),
        ]
        worst = max(worst, *rel) if name.startswith("reassociated") else worst
        print(f"| {name} | {rel[0]:.1e} | {rel[1]:.1e} |")
    bad = [u.copy() for u in upload]
    bad[0][-1] = np.nan
    flagged = sum(new(b, r, np.zeros(0), 1e6)[0] for b, r in zip(bad, reference))
    print(f"values outside found: {outside} (clean), {flagged} (one NaN)")
    return 0 if outside == 0 and flagged == 1 and worst < 1e-9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
