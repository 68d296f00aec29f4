"""Where an engine's CPU goes, per client-round: the training step against
everything else, the code before a change and after it side by side in one run.

    python -m benchmarks.client_cpu [--base COMMIT] [--models resnet18 cnn4]
        [--engines per-client cohort] [--repeats 1] [--out docs/results/client-cpu.md]

Each cell (code tree, model, engine) is its own process of the in-process engine
(pflower/engine/inprocess.py: Flower's round loop, the real strategy, with its default
bounds and checkpoint) on the CIFAR-10 dev set, FedPer, every client a round, one
torch thread a worker. The process's CPU (all its threads) is read at the start and
end of each of Flower's rounds (``Server.fit_round``, the same in any tree); the
training step's CPU (forward, backward and optimizer steps over the minibatches:
``client_app.train.train_epochs``, the cohort's batched steps) is the thread CPU spent
inside it, and the scoring's (``client_app.train.evaluate``, the eval-in-fit score of
the last round's model) likewise. Everything else (the client's build, the shared and
personal tensors in and out, the Message and its serialization, the server's checks,
bounds, sum and checkpoint) is the rest. Rounds 2 to the last; the first builds what
later rounds reuse.

The code before: ``git archive COMMIT`` unpacked outside the checkout (default
``outputs/client-cpu/base-COMMIT``), its cells started with that tree first on
``PYTHONPATH`` and as their working directory, so they import its modules and not
this checkout's (each cell prints the file it imported; the report names both). The
hooks above are looked up by name in either tree, so the split is the same
accounting on both sides. Cells alternate between the trees (before, after, before,
...) so a drift in the machine's speed falls on both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
DEV = REPO.parent / "shared" / "data" / "cifar10-dev-12k.parquet"

# the workloads: ResNet-18 (11M parameters: the per-byte costs show) and CNN4
WORKLOADS: dict[str, dict[str, Any]] = {
    "resnet18": {
        "model": "resnet18",
        "train-per-client": 32,
        "test-per-client": 8,
        "batch-size": 32,
        "optimizer": "adam",
        "lr": 1e-3,
        "clients": 10,
        "num-server-rounds": 4,
    },
    "cnn4": {
        "model": "cnn4",
        "train-per-client": 48,
        "test-per-client": 12,
        "batch-size": 16,
        "optimizer": "sgd",
        "lr": 0.05,
        "clients": 40,
        "num-server-rounds": 4,
    },
}
COMMON = {"method": "fedper", "partitioner": "dirichlet-client", "alpha": 0.5}

# (module, name) of the training step and the scoring in either tree; missing ones skipped
TRAINING = [
    ("client_app.train", "train_epochs"),
    ("client_app.batched", "train_at_once"),
    ("client_app.batched", "train_cohort"),
]
SCORING = [("client_app.train", "evaluate")]
CHECKPOINT = [("strategies.checkpoint", "save_server_state")]  # on a thread of its own


# ---------------------------------------------------------------------------- one cell


class Meter:
    """Thread CPU inside the wrapped functions (the outermost call of a thread only)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.lock = threading.Lock()
        self.depth = threading.local()

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self.depth, "n", 0)
            self.depth.n = depth + 1
            start = time.thread_time() if depth == 0 else 0.0
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth.n = depth
                if depth == 0:
                    with self.lock:
                        self.spent += time.thread_time() - start

        timed._client_cpu_original = fn  # type: ignore[attr-defined]
        return timed


def _hook(targets: list[tuple[str, str]], meter: Meter) -> list[str]:
    """Replace each target, wherever a loaded module holds it by that object."""
    import importlib

    import methods  # every method's client module, so their imported names are seen

    methods.method_names()
    hooked = []
    for module_name, name in targets:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, name, None)
        if original is None:
            continue
        wrapped = meter.wrap(original)
        for mod in list(sys.modules.values()):
            for attr, value in list(getattr(mod, "__dict__", {}).items()):
                if value is original:
                    setattr(mod, attr, wrapped)
        hooked.append(f"{module_name}.{name}")
    return hooked


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """One run of the in-process engine; its CPU by round (this process)."""
    from flwr.server import Server

    import client_app

    try:
        from pflower.engine.inprocess import run_inprocess
    except ImportError:  # a code tree from before the engine left server_app/ (the base)
        from server_app.inprocess import run_inprocess  # type: ignore[no-redef]

    training, scoring, checkpoint = Meter(), Meter(), Meter()
    hooked = _hook(TRAINING, training) + _hook(SCORING, scoring) + _hook(CHECKPOINT, checkpoint)
    rounds: list[dict[str, float]] = []
    fit_round = Server.fit_round

    def timed_round(self: Any, server_round: int, timeout: Any) -> Any:
        meters = (training, scoring, checkpoint)
        before = (time.process_time(), *(m.spent for m in meters), time.perf_counter())
        out = fit_round(self, server_round=server_round, timeout=timeout)
        after = (time.process_time(), *(m.spent for m in meters), time.perf_counter())
        results = out[2][0] if out is not None else []
        parts = ("cpu", "training", "scoring", "checkpoint", "wall")
        row = {k: b - a for k, a, b in zip(parts, before, after)}
        rounds.append({"round": server_round, "clients": len(results), **row})
        return out

    Server.fit_round = timed_round  # type: ignore[method-assign]
    config = {**COMMON, **spec["config"]}
    clients = int(config.pop("clients"))
    run_inprocess(config, clients, parallel=spec.get("parallel", 0))
    return {"imported": client_app.__file__, "hooked": hooked, "rounds": rounds}


# ---------------------------------------------------------------------------- the runner


def base_tree(commit: str, where: Path) -> Path:
    """``commit``'s files, unpacked once (no git worktree: nothing of the repo changes)."""
    if (where / "client_app").is_dir():
        return where
    where.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def cell(tree: Path, model: str, engine: str, out_dir: Path, code: str) -> dict[str, Any]:
    """One cell in its own process, ``tree`` first on its path."""
    config = {**WORKLOADS[model], "dataset": str(DEV), "local-training": engine}
    name = f"{code}-{model}-{engine}"
    config |= {"output-dir": str(out_dir), "run-name": name}
    spec = {"config": config}
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        cmd = [sys.executable, str(HERE), "--cell", json.dumps(spec), "--result", result.name]
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"cell {name} failed:\n{done.stderr[-3000:]}")
        return json.loads(Path(result.name).read_text())


def per_client_round(result: dict[str, Any]) -> dict[str, float]:
    """ms of CPU a client-round (rounds 2 on), split; wall s a client-round."""
    later = [r for r in result["rounds"] if r["round"] >= 2]
    n = sum(r["clients"] for r in later)
    parts = ("cpu", "training", "scoring", "checkpoint", "wall")
    total = {k: sum(r[k] for r in later) for k in parts}
    ms = {k: 1000 * v / n for k, v in total.items() if k != "wall"}
    ms["rest"] = ms["cpu"] - ms["training"] - ms["scoring"] - ms["checkpoint"]
    ms["wall"] = total["wall"] / n
    return ms


COMPARED = ("per_client_accuracy", "per_client_train_loss")


def agreement(before: Path, after: Path) -> dict[str, float]:
    """The largest absolute difference, over every round and client, between two
    runs' per-client accuracies and train losses (results.json)."""
    a, b = (json.loads(p.read_text())["rounds"] for p in (before, after))
    worst = dict.fromkeys(COMPARED, 0.0)
    for ra, rb in zip(a, b, strict=True):
        for key in COMPARED:
            for client, x in ra.get(key, {}).items():
                worst[key] = max(worst[key], abs(x - rb[key][client]))
    return worst


def report(cells: list[dict[str, Any]], args: argparse.Namespace, meta: dict[str, Any]) -> str:
    lines = [
        "# client-cpu",
        "",
        "Where the in-process engines' CPU goes per client-round, the code before "
        f"(`{args.base}`) and after (this checkout, `{meta['head']}`) side by side in one "
        "run (benchmarks/client_cpu.py says how). FedPer on the CIFAR-10 dev set, "
        "Dirichlet 0.5 per client, every client a round, the default bounds and "
        "checkpoint; rounds 2 on. resnet18: torchvision's ResNet-18 (11M parameters), "
        f"{WORKLOADS['resnet18']['clients']} clients, 32 train images a client (one "
        "batch of 32), Adam 1e-3; cnn4: the 4-layer CNN, "
        f"{WORKLOADS['cnn4']['clients']} clients, 48 train images, batch 16, SGD 0.05.",
        "",
        "Made with:",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"{meta['date']}, {meta['machine']}; load average before / after: "
        f"{meta['load_before']} / {meta['load_after']}. Repeats: {args.repeats} "
        "(each figure the median over them).",
        "",
        "CPU a client-round, ms (median over repeats); *rest* = all - training step - "
        "scoring - checkpoint (the server's checkpoint is written on a thread of its own, "
        "every round by default: its CPU is the thread's over the round's clients):",
        "",
        "| model | engine | code | all | training step | scoring | checkpoint | rest | rest, "
        "after / before | rest + checkpoint, after / before | s/client-round (wall) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    grouped: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for c in cells:
        grouped.setdefault((c["model"], c["engine"], c["code"]), []).append(c["ms"])
    med = {k: {m: statistics.median(v[m] for v in vs) for m in vs[0]} for k, vs in grouped.items()}
    for model in args.models:
        for engine in args.engines:
            before = med.get((model, engine, "before"))
            for code in ("before", "after"):
                m = med.get((model, engine, code))
                if m is None:
                    continue
                ratio = both = ""
                if before and code == "after":
                    ratio = f"**{m['rest'] / before['rest']:.2f}**"
                    plus = before["rest"] + before["checkpoint"]
                    both = f"{(m['rest'] + m['checkpoint']) / plus:.2f}"
                lines.append(
                    f"| {model} | {engine} | {code} | {m['cpu']:.1f} | {m['training']:.1f} | "
                    f"{m['scoring']:.1f} | {m['checkpoint']:.1f} | {m['rest']:.1f} | {ratio} | "
                    f"{both} | {m['wall']:.4f} |"
                )
    lines += [
        "",
        "Agreement, before and after (the same seeds, data and batches): the largest "
        "difference of any client's accuracy and train loss over the rounds (first repeat):",
        "",
        "| model | engine | accuracy | train loss |",
        "|---|---|---|---|",
    ]
    for (model, engine), worst in meta["agreement"].items():
        lines.append(
            f"| {model} | {engine} | {worst['per_client_accuracy']:.3g} | "
            f"{worst['per_client_train_loss']:.3g} |"
        )
    lines += ["", "Imported by the cells: " + "; ".join(sorted(meta["imported"])), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client_cpu", description=__doc__)
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--base", default="4e71c78", help="the commit before the change")
    parser.add_argument("--base-dir", type=Path, help="where its files go")
    parser.add_argument("--models", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--engines", nargs="+", default=["per-client", "cohort"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--code", nargs="+", default=["before", "after"], help="which trees")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "client-cpu.md")
    args = parser.parse_args(argv)
    if args.cell:
        Path(args.result).write_text(json.dumps(run_cell(json.loads(args.cell))))
        return 0
    where = args.base_dir or Path(tempfile.gettempdir()) / f"pflower-client-cpu-base-{args.base}"
    base = base_tree(args.base, where)
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    meta = {
        "head": head + ("+changes" if dirty else ""),
        "command": "python -m benchmarks.client_cpu " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "imported": set(),
    }
    out_dir = REPO / "outputs" / "client-cpu" / "runs"
    cells = []
    for _ in range(args.repeats):
        for model in args.models:
            for engine in args.engines:
                for code, tree in (("before", base), ("after", REPO)):
                    if code not in args.code:
                        continue
                    result = cell(tree, model, engine, out_dir, code)
                    meta["imported"].add(f"{code}: {Path(result['imported']).parent.parent}")
                    ms = per_client_round(result)
                    cells.append({"model": model, "engine": engine, "code": code, "ms": ms})
                    print(f"{model} {engine} {code}: " + json.dumps(
                        {k: round(v, 4) for k, v in ms.items()}), flush=True)  # fmt: skip
    meta["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    meta["agreement"] = {
        (model, engine): agreement(
            *(out_dir / f"{code}-{model}-{engine}" / "results.json" for code in ("before", "after"))
        )
        for model in args.models
        for engine in args.engines
        if {"before", "after"} <= set(args.code)
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(cells, args, meta))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
