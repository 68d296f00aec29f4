"""Answered (2026-12-02): under ``vmap`` CNN4 trains 1.3x slower on a CPU and the MLP 2-4x
faster (docs/notes/2026-12-02-many-clients-at-once-with-vmap.md); the cohort
engine (client_app/batched.py) now trains the MLP so.

Many small clients trained at once with ``torch.func`` (``vmap`` over the clients)
against one client after another as our engines train them, per backbone: FedAvg's
local schedule (SGD, momentum, a fresh optimizer a client), a cohort of clients that
start from the same weights, each on its own batches. It decides whether a batched
engine for plain methods is worth building (issue #60; docs/PERFORMANCE.md).

Both sides do the same work: the batched side's weights after training are checked
against the sequential side's (``max |diff|`` in the table; float rounding only).
One after another, CNN4 runs channels-last as models/backbones.py has it on a CPU;
under ``vmap`` it cannot (torch has no channels-last copy inside ``vmap``), so the
batched side runs the same layers in the default layout.

    python -m benchmarks.studies.vmap_clients [--clients 10] [--steps 3] [--batch 16]
        [--threads 1] [--repeats 3] [--models cnn4,mlp]
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

MODELS = ("cnn4", "mlp")
# (input shape, classes): CIFAR-10 images for CNN4; the embedded study's vectors for MLP
INPUTS = {"cnn4": ((3, 32, 32), 10), "mlp": ((100,), 2)}


def one_after_another(
    model: nn.Module, xs: torch.Tensor, ys: torch.Tensor, lr: float, momentum: float
) -> list[dict[str, torch.Tensor]]:
    """Each client's weights after its local steps, a client at a time (a copy of the
    model and a fresh optimizer each, as the engines do)."""
    out = []
    for x, y in zip(xs, ys):
        mine = copy.deepcopy(model)
        opt = torch.optim.SGD(mine.parameters(), lr=lr, momentum=momentum)
        for bx, by in zip(x, y):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(mine(bx), by).backward()
            opt.step()
        out.append({k: v.detach() for k, v in mine.named_parameters()})
    return out


def at_once(
    model: nn.Module, xs: torch.Tensor, ys: torch.Tensor, lr: float, momentum: float
) -> dict[str, torch.Tensor]:
    """Every client's weights after its local steps, stacked (clients first), trained
    together: ``vmap`` of ``grad`` over the stacked weights, then SGD with momentum
    (torch's update: ``buf = momentum * buf + grad``, the first step ``buf = grad``)."""
    plain = copy.deepcopy(model)
    for module in plain.modules():  # channels-last has no copy inside vmap
        if type(module).__name__ == "ChannelsLastOnCPU":
            module.__class__ = nn.Sequential

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(plain, params, (x,)), y)

    grads_of = vmap(grad(loss))
    clients = xs.shape[0]
    params = {k: v.detach().expand(clients, *v.shape).clone() for k, v in plain.named_parameters()}
    buffers: dict[str, torch.Tensor] = {}
    for step in range(xs.shape[1]):
        grads = grads_of(params, xs[:, step], ys[:, step])
        for k, g in grads.items():
            buffers[k] = g if k not in buffers else buffers[k].mul_(momentum).add_(g)
            params[k] = params[k] - lr * buffers[k]
    return params


def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(seconds, result) of ``fn(*args)``."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    from models.backbones import build_backbone

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.vmap_clients", description=__doc__
    )
    p.add_argument("--clients", type=int, default=10, help="clients trained at once")
    p.add_argument("--steps", type=int, default=3, help="local steps a client")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"{args.clients} clients of {args.steps} steps of {args.batch}, {args.threads} torch "
        f"thread(s); ms a client, best of {args.repeats} (after one to warm up):"
    )
    print(
        "| model | one after another | at once (vmap) | at once / one after another "
        "| max abs diff of the weights |\n|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        shape, classes = INPUTS[name]
        torch.manual_seed(0)
        model = build_backbone(name, shape, classes)
        xs = torch.randn(args.clients, args.steps, args.batch, *shape)
        ys = torch.randint(0, classes, (args.clients, args.steps, args.batch))
        run = (model, xs, ys, args.lr, args.momentum)
        best = {"seq": float("inf"), "vmap": float("inf")}
        for _ in range(args.repeats + 1):  # the first warms oneDNN's kernels up
            seconds, sequential = timed(one_after_another, *run)
            best["seq"] = min(best["seq"], seconds)
            seconds, stacked = timed(at_once, *run)
            best["vmap"] = min(best["vmap"], seconds)
        diff = max(
            float((stacked[k][c] - weights[k]).abs().max())
            for c, weights in enumerate(sequential)
            for k in weights
        )
        seq, vm = (best[k] / args.clients * 1e3 for k in ("seq", "vmap"))
        print(f"| {name} | {seq:.2f} | {vm:.2f} | {vm / seq:.2f}x | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
