"""How fast the machine is around each cell: one fixed workload, timed alone.

A ratio between two rows of one run compares cells run minutes apart. On a shared
machine the same work can take a third longer from one cell to the next (measured
2026-12-03: pfl-research's CPU a client-round 42-56 ms in one setting across two runs,
the engines' code unchanged), so a ratio mixes the engines' difference with the
machine's. The runner times this workload just before and just after each cell of a
preset whose ``[report]`` sets ``machine-reference = true``; the report prints it
beside each row, and the spread over a setting's cells says how far its ratios can
be the machine's.

The workload is the side-by-side's own step: CNN4's forward, backward and SGD step on a
batch of 16 CIFAR-sized images, channels-last, on one torch thread; the median of
``steps`` steps after ``warmup``, in milliseconds (about 0.5 s in all).
"""

from __future__ import annotations

from collections.abc import Iterable

_warmed = False  # a process's first timing runs about 1.5x slow, at any warm-up: not kept


def reference_ms(steps: int = 40, warmup: int = 5) -> float:
    """The median milliseconds of one reference step (torch's thread count restored)."""
    global _warmed
    if not _warmed:
        _warmed = True
        _timed(steps, warmup)
    return _timed(steps, warmup)


def _timed(steps: int, warmup: int) -> float:
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    from models.backbones import CNN4

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        model = CNN4(3, 32, 10).to(memory_format=torch.channels_last)
        x = torch.randn(16, 3, 32, 32, generator=gen).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (16,), generator=gen)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        times = []
        for n in range(warmup + steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if n >= warmup:
                times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def spread(values: Iterable[float]) -> float:
    """The largest over the smallest, minus one (0.25: a quarter slower at worst)."""
    kept = [v for v in values if v > 0]
    return max(kept) / min(kept) - 1 if kept else 0.0
