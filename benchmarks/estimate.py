"""A preset's device time, estimated before it starts from a measured rate.

For each distinct (method, model, batch size, input shape) of the cells left to run,
the rate is measured where the cells will train (CUDA when there is one, else this
CPU): the method's own model (its transform included: Factorized-FL's factors,
FedFac's wire aside) trained on random inputs of the data's shape, a few seconds of
optimizer steps after a warm-up, in images a second. The work is counted from the
cells' configs and their clients' partitions (rows only; no image is decoded):
every round, each sampled client's training images times its local epochs, and its
test images (scored at a third of a training step's cost). Local training is the
bulk of a round for every method here; the server's work (Factorized-FL's per-client
mixtures, FedFac's factor analysis) and start-up are not counted, so the estimate is
a floor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.presets import Cell
from benchmarks.runner import resume_point

EVAL_COST = 1 / 3  # a scored image, against a training step's image (forward only)


@dataclass(frozen=True)
class Work:
    """One cell's images a run: trained (image-steps) and scored."""

    trained: float
    scored: float


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def measure_rate(config: dict[str, Any], seconds: float = 3.0, warmup: int = 2) -> float:
    """Training images a second of the cell's model and optimizer at its batch size,
    on the device the cells use."""
    import torch
    import torch.nn.functional as F

    from client_app.train import make_optimizer
    from methods import get_method, parse_run_config
    from pflower.data import data_info

    cfg = parse_run_config(config)
    info = data_info(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = get_method(cfg.method).build_model(cfg, info).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg)
    x = torch.randn(cfg.batch_size, *info.input_shape, device=device)
    y = torch.randint(0, info.num_classes, (cfg.batch_size,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or done == 0:
        step()
        done += cfg.batch_size
        if device.type == "cuda" and done % (cfg.batch_size * 8) == 0:
            torch.cuda.synchronize()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return done / (time.perf_counter() - start)


def cell_work(cell: Cell, rounds: int | None = None) -> Work:
    """The images ``cell`` trains and scores in ``rounds`` (default: all of its
    rounds), from its config and its clients' partitions."""
    from methods import parse_run_config
    from pflower.data.hf import load_source
    from pflower.data.partitions import _partition

    cfg = parse_run_config(cell.config)
    if cfg.dataset == "synthetic":  # the generated study: every client alike, made at once
        from pflower.data import load_client_data

        d = load_client_data(cfg, 0, cell.clients)
        sizes = [(d.y_train, d.y_test)] * cell.clients
    else:
        src = load_source(cfg.dataset)
        sizes = [_partition(cfg, src, i, cell.clients)[:2] for i in range(cell.clients)]
    train = sum(len(tr) for tr, _ in sizes) / cell.clients  # a client's mean
    test = sum(len(te) for _, te in sizes) / cell.clients
    sampled = max(1, math.ceil(cfg.fraction_fit * cell.clients))
    rounds = cell.rounds if rounds is None else rounds
    steps = cfg.local_steps * cfg.batch_size if cfg.local_steps > 0 else train
    return Work(
        trained=rounds * sampled * cfg.local_epochs * steps,
        scored=rounds * cell.clients * test,
    )


def rate_key(cell: Cell) -> tuple[Any, ...]:
    c = cell.config
    return (c["method"], c.get("model"), c.get("batch-size"), c.get("profile"), c.get("dataset"))


def estimate(cells: list[Cell], seconds: float = 3.0) -> tuple[float, list[str]]:
    """(estimated device seconds of ``cells``, one line for each measured rate)."""
    rates: dict[tuple[Any, ...], float] = {}
    lines, total = [], 0.0
    for cell in cells:
        key = rate_key(cell)
        if key not in rates:
            rates[key] = measure_rate(cell.config, seconds)
            c = cell.config
            lines.append(
                f"  {c['method']} on {c.get('model')} at batch {c.get('batch-size', 'auto')}: "
                f"{rates[key]:,.0f} img/s"
            )
        work = cell_work(cell, cell.rounds - resume_point(cell))  # a stopped cell: the rest
        total += (work.trained + EVAL_COST * work.scored) / rates[key]
    return total, lines


def report(cells: list[Cell], max_minutes: float = 0.0, seconds: float = 3.0) -> str:
    """What ``python -m benchmarks run`` prints before a GPU preset starts."""
    if not cells:
        return "estimated device time: nothing left to run"
    total, lines = estimate(cells, seconds)
    out = [
        f"estimated device time: {total / 60:,.1f} min for {len(cells)} cell(s) left, "
        f"local training and scoring only (measured on {device_name()}):",
        *lines,
    ]
    if max_minutes > 0:
        out.append(
            f"--max-minutes {max_minutes:g}: each cell stops cleanly after the round that "
            "passes it (checkpoint written); the same command again goes on from there"
        )
    return "\n".join(out)
