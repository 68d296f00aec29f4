"""Answered (2026-12-01, 2026-12-03): the compiled double-double sum is 5.9x numpy's with
the same bits; reused buffers and a compiled mean save a few ms a round
(docs/notes/2026-12-01-compiled-running-sum-and-projection.md,
docs/notes/2026-12-03-reused-sum-buffers-and-a-compiled-mean.md).

The server's running double-double sum (strategies/robust.py ``RunningMean``):
the compiled kernel against the numpy TwoSum it replaced (nine passes over 16k-element
chunks, each a numpy call), on CNN4's tensors (FedAvg's upload), the
two alternating in one process, best of the repeats; the same bits are checked. Also
what the compiler costs: its first call and the resident memory numba adds.

    python -m benchmarks.studies.running_sum [--replies 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psutil

from models.backbones import CNN4
from strategies.robust import RunningMean

CHUNK = 16384  # the numpy sum's chunk: its passes stay in the core's cache


class NumpyTwoSum:
    """The sum as it was before the compiled kernel (reference for this benchmark)."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        self.hi = [np.zeros(s) for s in shapes]
        self.lo = [np.zeros(s) for s in shapes]
        self.scratch = np.empty((3, CHUNK))

    def add(self, arrays: list[np.ndarray], weight: float) -> None:
        for a, hi_all, lo_all in zip(arrays, self.hi, self.lo):
            flat, hi_flat, lo_flat = a.reshape(-1), hi_all.reshape(-1), lo_all.reshape(-1)
            for at in range(0, flat.size, CHUNK):
                n = min(CHUNK, flat.size - at)
                x, s, back = (row[:n] for row in self.scratch)
                hi, lo = hi_flat[at : at + n], lo_flat[at : at + n]
                np.multiply(flat[at : at + n], weight, out=x, dtype=np.float64)
                np.add(hi, x, out=s)
                np.subtract(s, hi, out=back)
                np.subtract(x, back, out=x)
                np.subtract(s, back, out=back)
                np.subtract(hi, back, out=back)
                np.add(back, x, out=back)
                np.add(lo, back, out=lo)
                hi[...] = s


def main(argv: list[str] | None = None) -> int:
    """Prints the table; 0, or 1 where the two sums' bits differ."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    shapes = [tuple(p.shape) for p in CNN4(3, 32, 10).state_dict().values()]
    uploads = [
        [rng.normal(scale=0.05, size=s).astype(np.float32) for s in shapes]
        for _ in range(args.replies)
    ]
    weights = [float(w) for w in rng.integers(1, 100, size=args.replies)]
    process = psutil.Process()
    before = process.memory_info().rss
    start = time.perf_counter()
    RunningMean().add(uploads[0], 1.0)  # imports numba, compiles for float32
    first_call = time.perf_counter() - start
    compiler_mb = (process.memory_info().rss - before) / 2**20

    best = {"numpy": float("inf"), "compiled": float("inf")}
    same = True
    for _ in range(args.repeats):
        for name in best:
            total = NumpyTwoSum(shapes) if name == "numpy" else RunningMean()
            start = time.perf_counter()
            for arrays, w in zip(uploads, weights):
                total.add(arrays, w)
            best[name] = min(best[name], (time.perf_counter() - start) / args.replies)
            if name == "numpy":
                reference = total
            else:
                pairs = zip(total.hi + total.lo, reference.hi + reference.lo)
                same = same and all(np.array_equal(a, b) for a, b in pairs)
    floats = sum(int(np.prod(s)) for s in shapes)
    print(f"CNN4 upload: {floats:,} floats, {args.replies} replies, best of {args.repeats}")
    print("| sum | ms a reply | numpy / this |")
    print("|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {1000 * seconds:.3f} | {best['numpy'] / seconds:.1f}x |")
    print(f"same bits: {same}")
    # in a process that had compiled it already, both are about nothing
    print(f"first call (import numba, compile): {first_call:.2f} s, resident +{compiler_mb:.0f} MB")
    round_start, same_mean = _round_edges(uploads[0], weights[0], 10 * args.repeats)
    print("| a round's edge | ms of CPU (median) |")
    print("|---|---|")
    for name, ms in round_start.items():
        print(f"| {name} | {ms:.2f} |")
    print(f"mean: same bits as numpy's: {same_mean}")
    return 0 if same and same_mean else 1


def _round_edges(
    arrays: list[np.ndarray], weight: float, times: int
) -> tuple[dict[str, float], bool]:
    """CPU ms of a round's first reply (fresh buffers, or the last sum's reused) and of
    its mean (compiled, or numpy's expression), medians of ``times`` alternations."""
    spare = RunningMean()
    spare.add(arrays, weight)
    buffers = spare.release()

    def first_reply(reuse: bool) -> RunningMean:
        total = RunningMean(buffers if reuse else None)
        total.add(arrays, weight)
        return total

    done = first_reply(True)
    calls = {
        "first reply, fresh buffers": lambda: first_reply(False),
        "first reply, buffers reused": lambda: first_reply(True),
        "mean, numpy's expression": lambda: [
            ((h + lo) / done.total).astype(d) for h, lo, d in zip(done.hi, done.lo, done.dtypes)
        ],
        "mean, compiled": done.mean,
    }
    spent: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(times):
        for name, call in calls.items():
            start = time.process_time()
            result = call()
            spent[name].append(time.process_time() - start)
            del result  # a fresh sum's buffers are freed before the next call, as a round's
    same = all(
        np.array_equal(a, b) for a, b in zip(done.mean(), calls["mean, numpy's expression"]())
    )
    return {name: 1000 * float(np.median(v)) for name, v in spent.items()}, same


if __name__ == "__main__":
    raise SystemExit(main())
