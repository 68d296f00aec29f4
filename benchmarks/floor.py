"""The floor of a FedAvg round on this machine (``engine = "floor"`` in a preset): the
cell's local training on every core and nothing else.

One process a core, one torch thread each (as our engines' clients), each with every
client's data decoded before the first round. A round: the parent samples the cohort,
hands each process its share and the global weights, each trains its clients one after
another from those weights (client_app.train's loop, a fresh optimizer a client) and
returns its clients' sample-weighted sum; the parent's mean is the next global. No
Flower, no messages, no serialization beyond the pipe, no bounds, no checkpoint, no
scoring until the last round: what any engine with one client a core must at least
spend, the line beside which pfl-research's rows and ours are read
(docs/PERFORMANCE.md). Multiprocessing rather than a pool library: the two-message
protocol below is all it needs, and each process must keep its data between rounds.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import random
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

# a round's record until the last round's scores (no bytes: nothing is sent)
UNSCORED = {"accuracy_mean": float("nan"), "accuracy_pooled": float("nan")}
UNSCORED |= {"bytes_up": 0, "bytes_down": 0}


def _worker(conn: Connection, config: dict[str, Any], clients: int) -> None:
    """One core's process: builds the model and every client's data, then answers
    ``("train", round, weights, ids)`` with (the ids' sample-weighted sum, samples) and
    ``("score", weights, ids)`` with each id's (correct, total); ``None`` ends it."""
    import torch

    torch.set_num_threads(1)  # one client a core, as our engines' clients
    from client_app.train import train_epochs
    from methods import get_method, parse_run_config
    from pflower.data import data_info, load_client_data

    cfg = parse_run_config(config)
    model = get_method("fedavg").build_model(cfg, data_info(cfg))
    data = [load_client_data(cfg, i, clients) for i in range(clients)]
    params = list(model.parameters())
    entries = list(model.state_dict().values())
    conn.send("ready")
    while (task := conn.recv()) is not None:
        if task[0] == "train":
            _, rnd, weights, ids = task
            total = [np.zeros(w.shape, np.float64) for w in weights]
            samples = 0
            for i in ids:
                with torch.no_grad():
                    for entry, w in zip(entries, weights):
                        entry.copy_(torch.from_numpy(w))
                gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rnd * 7919 + i)
                d = data[i]
                train_epochs(model, params, d.x_train, d.y_train, cfg.local_epochs, cfg, gen)
                n = len(d.y_train)
                for acc, entry in zip(total, entries):
                    # the product in float32, then summed in float64: a floor's mean, not
                    # our engines' exact one (strategies/robust.py RunningMean)
                    acc += n * entry.detach().numpy()
                samples += n
            conn.send((total, samples))
        else:
            _, weights, ids = task
            with torch.no_grad():
                for entry, w in zip(entries, weights):
                    entry.copy_(torch.from_numpy(w))
            model.eval()
            scores = {}
            with torch.no_grad():
                for i in ids:
                    d = data[i]
                    right = float((model(d.x_test).argmax(1) == d.y_test).sum())
                    scores[i] = (right, len(d.y_test))
            model.train()
            conn.send(scores)


def run_floor(config: dict[str, Any], clients: int, out_dir: Path, cores: int = 0) -> None:
    """FedAvg of ``config`` over ``clients`` on ``cores`` processes (0: every core this
    process may use); writes ``out_dir/results.json`` after every round, as a run does
    (benchmarks/machine.py times the rounds between those writes)."""
    import torch

    from methods import get_method, parse_run_config
    from pflower.data import data_info

    cfg = parse_run_config(config)
    cores = cores or len(os.sched_getaffinity(0))
    torch.manual_seed(cfg.seed)  # the initial weights, as our engines build them
    model = get_method("fedavg").build_model(cfg, data_info(cfg))
    weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
    integral = [not np.issubdtype(w.dtype, np.floating) for w in weights]
    ctx = mp.get_context("spawn")  # torch's thread pools do not survive a fork
    pipes, procs = [], []
    for _ in range(cores):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, config, clients), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        for conn in pipes:
            try:
                conn.recv()  # "ready"
            except EOFError:
                raise RuntimeError(
                    "a floor process ended as it started (its error is above)"
                ) from None
        cohort = max(1, math.ceil(cfg.fraction_fit * clients))  # as our sampler
        rng = random.Random(cfg.seed)
        rounds: list[dict[str, Any]] = []
        out_dir.mkdir(parents=True, exist_ok=True)
        results = out_dir / "results.json"
        t_start = time.perf_counter()
        for rnd in range(1, cfg.num_server_rounds + 1):
            t0 = time.perf_counter()
            ids = rng.sample(range(clients), cohort)
            for k, conn in enumerate(pipes):
                conn.send(("train", rnd, weights, ids[k::cores]))
            replies = [conn.recv() for conn in pipes]
            samples = sum(n for _, n in replies)
            weights = [
                w if keep else (sum(r[0][j] for r in replies) / samples).astype(w.dtype)
                for j, (w, keep) in enumerate(zip(weights, integral))
            ]
            seconds = time.perf_counter() - t0
            rounds.append({"round": rnd, "seconds": seconds, "replies": cohort, **UNSCORED})
            results.write_text(json.dumps({"rounds": rounds}))  # the round's mark
        total_seconds = time.perf_counter() - t_start
        everyone = list(range(clients))
        for k, conn in enumerate(pipes):
            conn.send(("score", weights, everyone[k::cores]))
        scores: dict[int, tuple[float, int]] = {}
        for conn in pipes:
            scores.update(conn.recv())
    finally:
        for conn in pipes:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in procs:
            proc.join(timeout=10)
    accs = {f"client-{i}": right / n for i, (right, n) in sorted(scores.items())}
    final = float(np.mean(list(accs.values())))
    pooled = sum(r for r, _ in scores.values()) / sum(n for _, n in scores.values())
    rounds[-1].update(accuracy_mean=final, accuracy_pooled=pooled, per_client_accuracy=accs)
    res = {
        "method": "fedavg",
        "engine": f"floor ({cores} process{'es' if cores > 1 else ''}, one torch thread each)",
        "config": config,
        "rounds": rounds,
        "best_accuracy_mean": final,
        "final_accuracy_mean": final,
        "best_accuracy_pooled": pooled,
        "final_accuracy_pooled": pooled,
        "federation_size": clients,
        "total_bytes_up": 0,
        "total_bytes_down": 0,
        "total_seconds": total_seconds,
    }
    results.write_text(json.dumps(res, indent=1))
