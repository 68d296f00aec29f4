"""Answered (2026-11-29): channels-last makes CNN4's CPU training step 1.45x faster and
ResNet-8's and ResNet-10's none, so only CNN4 takes it on a CPU
(docs/notes/2026-11-29-cnn4-channels-last.md).

Image batches in channels-last memory against the default layout, per backbone:
a training step (SGD, momentum 0.9) and an evaluation pass on one torch thread (a
simulated client's), the two layouts alternating in one process, best of the
repeats. It decides which backbones run their input channels-last on a CPU
(models/backbones.py ``ChannelsLastOnCPU``).

    python -m benchmarks.studies.channels_last [--steps 60] [--repeats 3] [--batch 16]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("cnn4", "resnet8", "resnet10")


def step_ms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> tuple[float, float]:
    """(training step, evaluation) milliseconds, the layers run as a plain Sequential
    (the layout is the input's own)."""

    def forward(inputs: torch.Tensor) -> torch.Tensor:
        return model.head(nn.Sequential.forward(model.features, inputs))

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for i in range(steps + 2):  # two to warm up
        if i == 2:
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(x), y).backward()
        opt.step()
    train = (time.perf_counter() - start) / steps
    model.eval()
    with torch.no_grad():
        forward(x)
        start = time.perf_counter()
        for _ in range(steps):
            forward(x)
    return train * 1e3, (time.perf_counter() - start) / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    from models.backbones import build_backbone

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.channels_last", description=__doc__
    )
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--models", default=",".join(MODELS))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CIFAR-sized batches of {args.batch}, one thread; ms, best of {args.repeats}:")
    print(
        "| model | train, default | train, channels-last | ratio | eval, default "
        "| eval, channels-last | ratio |\n|---|---|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        torch.manual_seed(0)
        x = torch.randn(args.batch, 3, 32, 32)
        y = torch.randint(0, 10, (args.batch,))
        inputs = {"default": x, "channels-last": x.contiguous(memory_format=torch.channels_last)}
        best = {k: (float("inf"), float("inf")) for k in inputs}
        for _ in range(args.repeats):
            for layout, batch in inputs.items():
                torch.manual_seed(0)  # the same model for both layouts
                model = build_backbone(name, (3, 32, 32), 10)
                t, e = step_ms(model, batch, y, args.steps)
                best[layout] = (min(best[layout][0], t), min(best[layout][1], e))
        (td, ed), (tc, ec) = best["default"], best["channels-last"]
        print(
            f"| {name} | {td:.2f} | {tc:.2f} | {td / tc:.2f}x | {ed:.2f} | {ec:.2f} | {ed / ec:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
