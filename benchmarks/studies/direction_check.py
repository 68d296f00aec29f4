"""Answered (2026-11-26): the direction check taken in slices is 2.6-3.2x faster than the
whole stack and holds 28 MB, not 227-2,123 MB
(docs/notes/2026-11-26-where-a-client-round-goes-and-streamed-aggregation.md).

``python -m benchmarks.studies.direction_check [--replies 10 100] [--reps 3]``: the server's
direction check (a held round's, strategies/streaming.py ``bound_held``) beside the whole-stack
computation it replaced (every update flattened in float64, stacked whole,
``np.median`` down the stack), on uploads shaped like the 4-layer CNN's, in one
process: seconds (best of ``reps``, wall) and peak extra memory of each."""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from models.backbones import build_backbone
from strategies.replies import Reply
from strategies.robust import Bounds, NormHistory, lower_median
from strategies.streaming import bound_held


def whole_stack(uploads: list[list[np.ndarray]], reference: list[np.ndarray]) -> list[float]:
    """The cosines as before: float64 updates, stacked whole, np.median."""
    updates = [
        np.concatenate([(u.astype(np.float64) - r).ravel() for u, r in zip(up, reference)])
        for up in uploads
    ]
    centre = np.median(np.stack(updates), axis=0)
    unit = centre / np.linalg.norm(centre)
    lower_median([float(np.linalg.norm(d)) for d in updates])
    return [float(d @ unit) / float(np.linalg.norm(d)) for d in updates]


def direction_checked(uploads: list[list[np.ndarray]], reference: list[np.ndarray]) -> None:
    """A held round's direction check over ``uploads`` (every reply against ``reference``)."""
    replies = [Reply(f"c{i}", u, 1, {}) for i, u in enumerate(uploads)]
    bounds = Bounds(0.0, 0.0, direction_from=1, min_cosine=0.0)
    bound_held(1, replies, bounds, NormHistory(0), lambda key: reference, {})


def measure(run: Callable[[], object], reps: int) -> tuple[float, float]:
    """(best wall seconds, peak traced MB) over ``reps`` runs."""
    best, peak = float("inf"), 0.0
    for _ in range(reps):
        tracemalloc.start()
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        peak = max(peak, tracemalloc.get_traced_memory()[1] / 1e6)
        tracemalloc.stop()
    return best, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.direction_check")
    parser.add_argument("--replies", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    model = build_backbone("cnn4", (3, 32, 32), 10, 200)
    reference = [p.detach().numpy().copy() for p in model.state_dict().values()]
    rng = np.random.default_rng(0)
    print("| replies | whole stack: s | MB | in slices: s | MB | time ratio |")
    print("|---|---|---|---|---|---|")
    for n in args.replies:
        shared = [rng.normal(size=r.shape) * 0.01 for r in reference]  # the round's direction
        uploads = [
            [
                (r + g + 0.01 * rng.normal(size=r.shape)).astype(np.float32)
                for r, g in zip(reference, shared)
            ]
            for _ in range(n)
        ]
        before = measure(lambda u=uploads: whole_stack(u, reference), args.reps)
        after = measure(lambda u=uploads: direction_checked(u, reference), args.reps)
        print(
            f"| {n} | {before[0]:.3f} | {before[1]:.0f} | {after[0]:.3f} | {after[1]:.0f} "
            f"| {before[0] / after[0]:.1f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
