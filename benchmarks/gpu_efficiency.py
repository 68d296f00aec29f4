"""The GPU kit's ``gpu-efficiency`` step: how close the engines come to a plain loop
on one device (issue #91's table), each workload measured four ways on the same
device, data, model, batch and optimizer:

* ``plain``: a plain PyTorch loop: the round's clients trained one after another from
  the same weights, data already on the device, a fresh optimizer a client;
* ``vmap``: a bare ``torch.func`` step of the same clients at once (their weights
  stacked, ``vmap`` of ``grad`` over the clients, Adam or SGD on the stacked tensors;
  BatchNorm on batch statistics), outside any engine: what per-client weights cost;
* ``per-client``: the in-process engine (pflower/engine/inprocess.py: Flower's round loop,
  a real Message through the ClientApp a client, node config ``device``);
* ``cohort``: the in-process engine with ``local-training = "cohort"``.

Images a second are training images over wall seconds (the engines: the median round
after the first, its scoring and server work included, as a user waits for them); GPU
utilisation is sampled every 0.5 s while each runs (``nvidia-smi``; "n/a" without a
GPU). Workloads: ``resnet18``: FedPer, ResNet-18, 100 clients, 10% a round, 96 train
images each, batch 32, 1 epoch, Adam 1e-3 (the FedFac preset's); ``cnn4``: FedPer, the
4-layer CNN, 20 clients all, 480 train images each, 5 epochs, batch 256, SGD 0.05 (the
Factorized-FL preset's). The dry run (``dry-run gpu-efficiency``, a CI test) shrinks
both to a few clients and images on the CPU.

    bash scripts/gpu_kit.sh device gpu-efficiency     # on the device, about 2 minutes
    bash scripts/gpu_kit.sh dry-run gpu-efficiency    # here, on the CPU, seconds
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

STEP = "gpu-efficiency"

WORKLOADS: dict[str, dict[str, Any]] = {
    "resnet18": {
        "method": "fedper",
        "model": "resnet18",
        "clients": 100,
        "fraction-fit": 0.1,
        "train-per-client": 96,
        "test-per-client": 24,
        "batch-size": 32,
        "local-epochs": 1,
        "optimizer": "adam",
        "lr": 1e-3,
        "num-server-rounds": 4,
    },
    "cnn4": {
        "method": "fedper",
        "model": "cnn4",
        "clients": 20,
        "fraction-fit": 1.0,
        "train-per-client": 480,
        "test-per-client": 100,
        "batch-size": 256,
        "local-epochs": 5,
        "optimizer": "sgd",
        "lr": 0.05,
        "num-server-rounds": 4,
    },
}
# the dry run: the same steps, a few clients and images, on the CPU
DRY: dict[str, dict[str, Any]] = {
    "resnet18": {"clients": 2, "fraction-fit": 1.0, "train-per-client": 4, "test-per-client": 2}
    | {"batch-size": 2, "num-server-rounds": 2},
    "cnn4": {"clients": 2, "train-per-client": 8, "test-per-client": 2, "batch-size": 4}
    | {"local-epochs": 1, "num-server-rounds": 2},
}
COMMON = {"partitioner": "dirichlet-client", "alpha": 0.5, "evaluate-every": 1000}


class Utilisation:
    """GPU utilisation (%) sampled every ``every`` seconds by ``nvidia-smi`` while the
    block runs; no samples where there is no ``nvidia-smi`` or no GPU."""

    def __init__(self, every: float = 0.5) -> None:
        self.every, self.samples = every, []
        self.stop = threading.Event()
        self.tool = shutil.which("nvidia-smi")

    def _sample(self) -> None:
        query = [self.tool, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self.stop.wait(self.every):
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
                self.samples.append(float(out.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return

    def __enter__(self) -> Utilisation:
        if self.tool:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.tool:
            self.thread.join(timeout=10)

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"util_mean": None, "util_peak": None, "util_samples": 0}
        s = self.samples
        return {"util_mean": statistics.mean(s), "util_peak": max(s), "util_samples": len(s)}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _setup(config: dict[str, Any], device: Any) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """(cfg, the model on ``device``, the first round's clients' (x, y) on it)."""
    from methods import get_method, parse_run_config
    from pflower.data import data_info, load_client_data

    cfg = parse_run_config({k: v for k, v in config.items() if k != "clients"})
    model = get_method(cfg.method).build_model(cfg, data_info(cfg)).to(device)
    clients = int(config["clients"])
    trained = max(1, round(clients * cfg.fraction_fit))
    data = []
    for i in range(trained):
        d = load_client_data(cfg, i, clients)
        data.append((d.x_train.to(device), d.y_train.to(device)))
    return cfg, model, data


def plain(config: dict[str, Any], device: Any, repeats: int = 2) -> dict[str, Any]:
    """A round's clients one after another, from the same weights: img/s (the best of
    ``repeats`` rounds after a warm-up round)."""
    import torch

    from client_app.train import make_optimizer, train_epochs

    cfg, model, data = _setup(config, device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    images = sum(int(y.shape[0]) for _, y in data) * cfg.local_epochs
    times = []
    with Utilisation() as util:
        for rep in range(repeats + 1):
            _sync(device)
            t0 = time.perf_counter()
            for i, (x, y) in enumerate(data):
                model.load_state_dict(start)
                params = list(model.parameters())
                gen = torch.Generator().manual_seed(rep * 1000 + i)
                opt = make_optimizer(params, cfg)
                train_epochs(model, params, x, y, cfg.local_epochs, cfg, gen, optimizer=opt)
            _sync(device)
            if rep:
                times.append(time.perf_counter() - t0)
    return {"img_s": images / min(times), "clients": len(data)} | util.summary()


def bare_vmap(config: dict[str, Any], device: Any, repeats: int = 2) -> dict[str, Any]:
    """The same clients' steps at once under ``vmap`` (weights stacked), outside any
    engine: img/s of the best of ``repeats`` rounds after a warm-up."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad_and_value, replace_all_batch_norm_modules_, vmap

    from client_app.batched import _adam, _sgd
    from models.backbones import ChannelsLastOnCPU

    cfg, model, data = _setup(config, device)
    net = replace_all_batch_norm_modules_(copy.deepcopy(model))  # batch statistics
    for module in net.modules():  # no channels-last inside vmap (torch refuses it)
        if isinstance(module, ChannelsLastOnCPU):
            module.__class__ = torch.nn.Sequential
    net.train()
    n = min(int(y.shape[0]) for _, y in data)  # as many samples each (the stacked batch)
    xs = torch.stack([x[:n] for x, _ in data])
    ys = torch.stack([y[:n] for _, y in data])
    buffers = {k: v for k, v in net.named_buffers()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(net, (p, buffers), (x,)), y)

    step = vmap(grad_and_value(loss))
    images = n * len(data) * cfg.local_epochs
    times = []
    with Utilisation() as util:
        for rep in range(repeats + 1):
            params = {
                k: v.detach().unsqueeze(0).repeat(len(data), *[1] * v.dim()).clone()
                for k, v in net.named_parameters()
            }
            update = _sgd(cfg) if cfg.optimizer == "sgd" else _adam(cfg)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(cfg.local_epochs):
                for first in range(0, n, cfg.batch_size):
                    grads, _ = step(
                        params,
                        xs[:, first : first + cfg.batch_size],
                        ys[:, first : first + cfg.batch_size],
                    )
                    update(params, grads)
            _sync(device)
            if rep:
                times.append(time.perf_counter() - t0)
    return {"img_s": images / min(times), "clients": len(data)} | util.summary()


def engine(config: dict[str, Any], device: Any, mode: str, work: Path) -> dict[str, Any]:
    """The in-process engine (``mode``: per-client or cohort) on ``device``: img/s of
    the median round after the first (its server work and scoring included)."""
    from flwr.server import Server

    from pflower.engine.inprocess import run_inprocess

    clients = int(config["clients"])
    cfg = {k: v for k, v in config.items() if k != "clients"}
    cfg |= {"local-training": mode, "output-dir": str(work), "run-name": f"{STEP}-{mode}"}
    rounds: list[tuple[float, int]] = []
    fit_round = Server.fit_round

    def timed(self: Any, server_round: int, timeout: Any) -> Any:
        t0 = time.perf_counter()
        out = fit_round(self, server_round=server_round, timeout=timeout)
        trained = out[2][0] if out is not None else []
        images = sum(int(res.num_examples) for _, res in trained)
        rounds.append((time.perf_counter() - t0, images))
        return out

    Server.fit_round = timed  # type: ignore[method-assign]
    try:
        with Utilisation() as util:
            run_inprocess(cfg, clients, node_configs=[{"device": device.type}] * clients)
    finally:
        Server.fit_round = fit_round  # type: ignore[method-assign]
    later = rounds[1:] or rounds
    seconds = statistics.median(s for s, _ in later)
    images = statistics.median(n for _, n in later) * int(config["local-epochs"])
    return {"img_s": images / seconds, "s_round": seconds} | util.summary()


def run(out: Path, work: Path, dry_run: bool, info: dict[str, Any]) -> Path:
    """Every workload four ways; the report (markdown and JSON) into ``out``."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not dry_run else "cpu")

    repeats = 1 if dry_run else 2
    threads = torch.get_num_threads()
    if dry_run:  # a CPU shared with whatever else runs: one thread, no spinning
        torch.set_num_threads(1)
    try:
        results = _measure(device, dry_run, repeats, work)
    finally:
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{STEP}.json").write_text(json.dumps({"device": info, "results": results}, indent=1))
    path = out / f"{STEP}.md"
    path.write_text(report(results, info, dry_run))
    return path


def _measure(device: Any, dry_run: bool, repeats: int, work: Path) -> dict[str, dict[str, Any]]:
    from benchmarks import presets

    results: dict[str, dict[str, Any]] = {}
    for name, base in WORKLOADS.items():
        config = {**COMMON, **base, **(DRY[name] if dry_run else {})}
        config["dataset"] = str(presets.CIFAR10_DEV)
        rows = {
            "plain": plain(config, device, repeats),
            "vmap": bare_vmap(config, device, repeats),
            "per-client": engine(config, device, "per-client", work),
            "cohort": engine(config, device, "cohort", work),
        }
        results[name] = {"config": config, "rows": rows}
    return results


def _util(row: dict[str, Any]) -> str:
    if row.get("util_mean") is None:
        return "n/a"
    return f"{row['util_mean']:.0f}% / {row['util_peak']:.0f}%"


def report(results: dict[str, Any], info: dict[str, Any], dry_run: bool) -> str:
    where = info.get("gpu") or "CPU (no GPU)"
    lines = [
        "# gpu-efficiency",
        "",
        "The plain loop, a bare `vmap` step and each engine on the same device, data, "
        "model, batch and optimizer (benchmarks/gpu_efficiency.py says how).",
        "",
        "Made with:",
        "",
        "```",
        f"bash scripts/gpu_kit.sh {'dry-run' if dry_run else 'device'} {STEP}",
        "```",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; device: {where}; torch "
        f"{info.get('torch', '?')}."
        + (
            " A dry run: a few clients and images, on the CPU; not a measurement."
            if dry_run
            else ""
        ),
        "",
        "| workload | way | img/s | x the plain loop | GPU utilisation, mean / peak |",
        "|---|---|---|---|---|",
    ]
    for name, res in results.items():
        rows = res["rows"]
        floor = rows["plain"]["img_s"]
        for way, row in rows.items():
            lines.append(
                f"| {name} | {way} | {row['img_s']:,.0f} | {row['img_s'] / floor:.2f} | "
                f"{_util(row)} |"
            )
    lines += [""]
    for name, res in results.items():
        shown = {k: v for k, v in res["config"].items() if k != "dataset"}
        lines.append(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    return "\n".join(lines) + "\n"
