"""Factorized-FL benchmark: permuted-label CIFAR-10, alpha / beta vs FedAvg / Local.

    flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.factorized_fl

Every run is one ``simulate(...)`` in its own subprocess, with the same data
subset, partitions and seed for every method of a scenario. Writes
``docs/factorized_fl.md`` and ``docs/factorized_fl.png`` (``--tag X``: the
``factorized_fl-X`` pair, e.g. a longer run); the raw results go to
``outputs/bench-factorized-fl/<tag>/<scenario>/<method>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import CIFAR10_DEV

REPO = Path(__file__).resolve().parent.parent
SOURCE = CIFAR10_DEV
SUBSET = REPO / "outputs" / "data" / "cifar10-dev-subset.parquet"
RUNS = REPO / "outputs" / "bench-factorized-fl"
METHODS = ("factorized-fl-alpha", "factorized-fl-beta", "fedavg", "fedper", "local")
LABELS = {
    "factorized-fl-alpha": "Factorized-FL alpha",
    "factorized-fl-beta": "Factorized-FL beta",
    "fedavg": "FedAvg (head shared)",
    "fedper": "FedAvg, head personal (= paper's FedAvg here)",
    "local": "Local (Stand-Alone)",
}
SCENARIOS = {
    "permuted-non-iid": {"partitioner": "dirichlet", "alpha": 0.5, "permute-labels": True},
    "permuted-iid": {"partitioner": "iid", "permute-labels": True},
}
# Table 1 (top), CIFAR-10: accuracy [%] and cost per run [Gb]
PAPER = {
    "permuted-non-iid": {
        "factorized-fl-alpha": "50.24 / 0.32",
        "factorized-fl-beta": "56.61 / 18.25",
        "fedper": "48.90 / 20.39",
        "local": "46.06 / -",
    },
    "permuted-iid": {
        "factorized-fl-alpha": "67.91 / 0.32",
        "factorized-fl-beta": "70.59 / 18.25",
        "fedper": "65.31 / 20.39",
        "local": "63.93 / -",
    },
}


def make_subset(per_class: int, seed: int) -> Path:
    """A seeded, class-balanced subset of the dev parquet (same HF schema)."""
    import pyarrow.parquet as pq

    path = SUBSET.with_name(f"{SUBSET.stem}-{per_class}x10-seed{seed}.parquet")
    if path.exists():
        return path
    table = pq.read_table(SOURCE)
    labels = np.asarray(table.column("label").to_numpy())
    rng = np.random.default_rng(seed)
    rows = np.sort(
        np.concatenate(
            [rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in range(10)]
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.take(rows), path)
    return path


def run_one(config: dict, clients: int, out: Path) -> dict:
    """One simulation in a subprocess (a Ray failure loses only this run)."""
    results = out / "results.json"
    if results.exists():
        done = json.loads(results.read_text())
        if done.get("config", {}).get("num-server-rounds") == config["num-server-rounds"]:
            return done
    code = (
        "import json, sys; from server_app.simulate import simulate; "
        "simulate(json.loads(sys.argv[1]), int(sys.argv[2]))"
    )
    t0 = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-c", code, json.dumps(config), str(clients)],
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            check=True,
        )
    (out / "wall_seconds.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return json.loads(results.read_text())


def wall_seconds(out: Path) -> float:
    """The recorded wall time of one run (0 if it was not recorded)."""
    f = out / "wall_seconds.txt"
    return float(f.read_text()) if f.exists() else 0.0


def total_bytes(res: dict) -> int:
    return int(res["total_bytes_up"]) + int(res["total_bytes_down"])


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results) + 1, figsize=(5 * (len(results) + 1), 4))
    for ax, (scenario, by_method) in zip(axes, results.items()):
        for method, res in by_method.items():
            rounds = [r["round"] for r in res["rounds"]]
            acc = [100 * r["accuracy_mean"] for r in res["rounds"]]
            ax.plot(rounds, acc, marker="o", label=LABELS[method])
        ax.set_title(f"CIFAR-10 {scenario}")
        ax.set_xlabel("round")
        ax.set_ylabel("mean client test accuracy [%]")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    first = next(iter(results.values()))
    names = [m for m in first if m != "local"]
    ax.bar(
        [LABELS[m].split(" (")[0].replace(", head personal", "\nhead personal") for m in names],
        [total_bytes(first[m]) / 2**20 for m in names],
    )
    ax.set_yscale("log")
    ax.set_ylabel("bytes on the wire per run (fit up + down) [MiB]")
    ax.set_title("communication, one run")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_doc(
    results: dict, args: argparse.Namespace, command: str, seconds: float, stem: str
) -> str:
    lines = [
        "# Factorized-FL: permuted-label CIFAR-10",
        "",
        f"Produced by (runs' wall time {seconds:.0f} s in all, on the shared 2-core CPU):",
        "",
        "```",
        command,
        "```",
        "",
        f"Setting: CIFAR-10 from `{SOURCE}`, a seeded class-balanced subset of "
        f"{args.per_class * 10} images ({args.per_class} per class), {args.clients} clients "
        f"(all participate), {args.rounds} rounds x {args.epochs} local epoch(s), backbone "
        f"`{args.model}`, SGD lr {args.lr} momentum 0.9 weight decay 1e-6, batch "
        f"{args.batch_size}, seed {args.seed}; test split 20% of each client's data. Each "
        "client permutes its label ids with its own seeded permutation (`permute-labels`). "
        "Non-IID: Dirichlet(0.5) over labels. Factorized-FL: rank 1, l1 5e-4, mu threshold "
        "5e-4, tau 0, epsilon 1, min-aggr 10 (the reference's single-domain permuted values). "
        "Every method sees the same partitions. Accuracy = mean over clients of the "
        "personalised model's accuracy on its own test split, final round (best round in "
        "brackets). Bytes = serialized fit payloads up + down over the run.",
        "",
        "| scenario | method | final acc [%] (best) | bytes per run | vs FedAvg | "
        "paper acc [%] / Gb |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, by_method in results.items():
        base = total_bytes(by_method["fedavg"]) if "fedavg" in by_method else None
        for method, res in by_method.items():
            b = total_bytes(res)
            ratio = f"{100 * b / base:.2f}%" if base and b else "-"
            lines.append(
                f"| {scenario} | {LABELS[method]} | {100 * res['final_accuracy_mean']:.1f} "
                f"({100 * res['best_accuracy_mean']:.1f}) | {fmt_bytes(b) if b else '0'} | "
                f"{ratio} | {PAPER[scenario].get(method, '-')} |"
            )
    extra = []
    for scenario, by_method in results.items():
        for method in ("factorized-fl-alpha", "factorized-fl-beta"):
            if method not in by_method:
                continue
            last = by_method[method]["rounds"][-1]
            dens = last.get("ffl_mu_density")
            extra.append(
                f"- {scenario}, {LABELS[method]}: last round mean off-diagonal v similarity "
                f"{last['ffl_similarity_mean']:.3f}, clients kept per aggregate "
                f"{last['ffl_kept_mean']:.1f}"
                + (f", mu density sent {100 * dens:.1f}%" if dens is not None else "")
            )
    gaps = []
    for scenario, by_method in results.items():
        if "local" not in by_method:
            continue
        local = 100 * by_method["local"]["final_accuracy_mean"]
        parts = [
            f"{LABELS[m].split(' (')[0].split(',')[0] + (' (head personal)' if m == 'fedper' else '')}"
            f" {100 * r['final_accuracy_mean'] - local:+.1f}"
            for m, r in by_method.items()
            if m != "local"
        ]
        gaps.append(f"- {scenario}: final accuracy minus Local, in points: " + "; ".join(parts))
    lines += ["", "Server facts (from results.json):", "", *extra, ""]
    lines += ["Against Local (same run):", "", *gaps, "", f"![]({stem}.png)"]
    if stem == "factorized_fl":
        lines += ["", NOTES]
    return "\n".join(lines) + "\n"


NOTES = """## What the committed run shows (default arguments)

- The paper's claims, checked at this scale:
  - "Under permuted labels FedAvg falls toward Local": FedAvg with a shared
    head falls far *below* Local (17% vs 48% non-IID, 14% vs 34% IID): one head
    cannot serve clients that name the classes differently. With the head kept
    personal (the paper's FedAvg here) it stays 3-4 points under Local.
  - "Factorized-FL does not": **not reproduced at this budget.** alpha is on
    par with head-personal FedAvg in the non-IID setting (44.7 vs 45.1, both
    ~3 points under Local) and beta is 4 points lower; in the IID setting both
    variants trail head-personal FedAvg (25 vs 29) and Local (34). Every curve
    is still rising at round 8 (see the plot), and the factorized models start
    slower: with mu at zero, every conv filter of a layer is a multiple of the
    same rank-1 kernel until mu grows, which takes more than ~60 local steps
    per client. `factorized_fl-20rounds.md` repeats the IID setting for 20
    rounds (alpha, beta, head-personal FedAvg, Local): Local still leads
    (37.5%), beta (31.7%) passes head-personal FedAvg's final round (30.6%,
    best 34.7%) at half its bytes, alpha stalls near 26%. At ~240 training
    images per client the rank-1 factorized body (mu still ~75% below the
    threshold) is the bottleneck; the paper's clients hold 2,500 images.
  - "alpha costs about 2% of FedAvg's bytes": **reproduced** in kind: 2.9% of
    FedAvg's fit bytes with resnet8 (the paper: 0.32 / 20.39 Gb = 1.6%); most
    of it is the matching v (see below). beta sent ~21% of its mu entries and
    cost 40% of FedAvg's bytes (the paper: 18.25 / 20.39 Gb = 90%).
- Similarity matching: with tau = 0 and epsilon = 1 (the reference's
  single-domain values) every client keeps every other (6 of 6) and the
  softmax weights are nearly uniform (v similarities 0.98-0.997), so here
  alpha/beta aggregate almost like a plain mean of the factors. The matching
  matters in the domain scenario (tau 0.95, epsilon 20), not benchmarked here.

## How this differs from the paper, and why the numbers differ

- Scale. The paper trains 20 clients on all of CIFAR-10 (50,000 images) for 50
  rounds x 5 epochs (batch 256, SGD lr 1e-3, the reference's ResNet-9). This
  run is sized for a shared 2-core CPU (about 8-12 minutes for all runs): a
  1,800-image class-balanced subset of the dev set, 6 clients, 8 rounds x 1
  epoch, batch 32, and lr 0.01 (with lr 1e-3 nothing moves in ~60 steps per
  client). Absolute accuracies are therefore far below the paper's and the
  differences between methods are within a few points of noise: one seed, ~60
  test images per client. Read the table as a smoke-level comparison, not a
  reproduction of Table 1.
- Backbone. `resnet8` (BatchNorm) rather than `cnn4`: with a rank-1 factorized
  weight and no BatchNorm, cnn4 barely trained in a single-client check
  (lr 0.01: 17-19% vs 25% for the plain cnn4 after 10 epochs on 320 images),
  while factorized resnet8 trained close to plain resnet8 (27% vs 32% after 6
  epochs). The paper's ResNet-9 also has BatchNorm.
- Baselines. In the permuted settings the paper does not share the classifier
  for any method ("we do not share the classifier layers to ensure fairness"),
  so its FedAvg row corresponds to our "FedAvg, head personal" (`fedper`) row;
  the paper's numbers are printed there. Our plain FedAvg shares the head,
  which cannot work when every client names the classes differently.
- Bytes. Ours are the serialized fit payloads, both directions, counted by the
  strategy (Flower's `ndarrays_to_parameters`, npy headers included); the
  paper reports parameters sent in Gb. alpha's upload carries u, the conv/linear
  biases, the BatchNorm affine parameters and the matching vector v of the last
  3x3 conv (256 x 256 = 65,536 floats for resnet8), which dominates; its
  download has no v. beta sends mu as int32 indices + float32 values (8 bytes
  per kept entry), so once more than half of mu survives the 5e-4 threshold,
  beta costs more than FedAvg; the paper's beta (18.25 vs 20.39 Gb) does not
  say how its sparse mu is encoded.
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--per-class", type=int, default=180)
    p.add_argument("--model", default="resnet8")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    p.add_argument("--out", default=str(REPO / "docs"))
    p.add_argument("--tag", default="", help="write docs/factorized_fl-<tag>.md instead")
    args = p.parse_args()
    data = make_subset(args.per_class, args.seed)
    results: dict = {}
    for scenario in args.scenarios:
        results[scenario] = {}
        for method in args.methods:
            out = RUNS / (args.tag or "main") / scenario / method
            config = {
                "method": method,
                "dataset": str(data),
                "model": args.model,
                "num-server-rounds": args.rounds,
                "local-epochs": args.epochs,
                "batch-size": args.batch_size,
                "lr": args.lr,
                "momentum": 0.9,
                "weight-decay": 1e-6,
                "seed": args.seed,
                "output-dir": str(out.parent),
                "run-name": method,
                **SCENARIOS[scenario],
            }
            t0 = time.perf_counter()
            res = run_one(config, args.clients, out)
            results[scenario][method] = res
            print(
                f"{scenario:18s} {method:22s} acc {100 * res['final_accuracy_mean']:5.1f} "
                f"bytes {fmt_bytes(total_bytes(res)):>10s}  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    docs = Path(args.out)
    docs.mkdir(parents=True, exist_ok=True)
    stem = "factorized_fl" + (f"-{args.tag}" if args.tag else "")
    plot(results, docs / f"{stem}.png")
    command = (
        "flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.factorized_fl "
        + " ".join(sys.argv[1:])
    )
    seconds = sum(
        wall_seconds(RUNS / (args.tag or "main") / sc / m) for sc in results for m in results[sc]
    )
    doc = write_doc(results, args, command.strip(), seconds, stem)
    (docs / f"{stem}.md").write_text(doc)
    print(doc)


if __name__ == "__main__":
    main()
