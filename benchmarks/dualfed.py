"""DualFed vs FedAvg / FedPer / FedBN on a domain-shift CIFAR-10 scenario (CPU-sized).

    flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.dualfed \
        [--clients 12] [--rounds 20] [--model resnet8] [--runs outputs/dualfed-bench] [--out docs]

A seeded 4000-row subset of the 12k CIFAR-10 dev set, ``domain-shift=true``,
``num-domains`` 4: client i's images pass through fixed transform i % 4 (identity,
grayscale, rotate-90, colour-shift), so 12 clients = 3 per domain. Labels per client
from the per-client Dirichlet protocol with alpha = 100 (near-balanced classes: the
shift is in the features, as in the paper's PACS/DomainNet setting), 150 train + 100
test images each. Every method: same model, partition, seed, SGD, batch, local epochs. Each run
is one ``simulate`` in its own subprocess (the harness's cell runner); a finished
run with the same config is reused. Writes ``docs/dualfed.md`` and ``docs/dualfed.png``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import subset_parquet
from benchmarks.harness import Cell, Setting, is_complete, load_results, run_cell

REPO = Path(__file__).resolve().parent.parent
METHODS = ("dualfed", "dualfed-simultaneous", "fedavg", "fedper", "fedbn")
# a benchmark variant -> (registered method, extra config)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dualfed-simultaneous": ("dualfed", {"dual-schedule": "simultaneous"}),
}
# DualFed paper (ACM MM 2024), best-round accuracy, mean of 5 seeds, ImageNet ResNet-18,
# one client per domain, 300 rounds: Tables 1 and 2, "Avg." column.
PAPER = {
    "PACS": {"fedavg": 91.82, "fedper": 92.58, "fedbn": 92.45, "dualfed": 95.01},
    "DomainNet": {"fedavg": 82.46, "fedper": 83.76, "fedbn": 83.20, "dualfed": 86.14},
}


NOTES_MARKER = "<!-- discussion: kept across reruns -->"


def run_config(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    method, extra = VARIANTS.get(variant, (variant, {}))
    return {
        "method": method,
        "dataset": subset_parquet(args.rows, args.seed, args.runs.resolve()),
        "partitioner": "dirichlet-client",
        "alpha": 100.0,
        "train-per-client": args.train_per_client,
        "test-per-client": 100,
        "domain-shift": True,
        "num-domains": 4,
        "model": args.model,
        "lr": args.lr,
        "momentum": 0.5,
        "batch-size": args.batch_size,
        "local-epochs": 1,
        "supcon-lambda": args.supcon_lambda,
        "supcon-temperature": 0.2,
        "seed": args.seed,
        "num-server-rounds": args.rounds,
        "output-dir": str((args.runs / args.model).resolve()),
        "run-name": variant,
        **extra,
    }


def curve(res: dict[str, Any], key: str) -> list[float]:
    return [r[key] for r in res["rounds"] if key in r]


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method, res in results.items():
        acc = curve(res, "accuracy_mean")
        if not acc:
            continue
        (line,) = ax.plot(range(1, len(acc) + 1), [100 * a for a in acc], marker="o", ms=3)
        line.set_label(f"{method} (combined)" if method == "dualfed" else method)
        if method == "dualfed":
            for key, style, name in (
                ("accuracy_global_mean", "--", "global-only h_s(z)"),
                ("accuracy_personal_mean", ":", "personal-only h_p(u)"),
            ):
                vals = curve(res, key)
                ax.plot(
                    range(1, len(vals) + 1),
                    [100 * v for v in vals],
                    style,
                    color=line.get_color(),
                    label=f"dualfed {name}",
                )
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy, mean over clients (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_doc(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    command: str,
    failed: dict[str, str],
) -> Path:
    rows = []
    for method in METHODS:
        if method not in results:
            rows.append(f"| {method} | failed: {failed.get(method, 'not run')[:100]} |||||||||")
            continue
        res = results[method]
        last = res["rounds"][-1]
        best = max(curve(res, "accuracy_mean"))
        g = last.get("accuracy_global_mean")
        p = last.get("accuracy_personal_mean")
        paper = " / ".join(f"{PAPER[k][method]:.2f}" for k in PAPER if method in PAPER[k])
        rows.append(
            f"| {method} | {fmt(last['accuracy_mean'])} | {fmt(best)} | {fmt(g)} | {fmt(p)} "
            f"| {fmt(last['accuracy_pooled'])} | {res['total_bytes_up'] / 1e6:.2f} "
            f"| {res['total_seconds']:.0f} | {paper} |"
        )
    cfg = run_config(args, "dualfed")
    shown = ", ".join(
        f"{k}={v}" for k, v in cfg.items() if k not in ("method", "output-dir", "run-name")
    )
    lines = [
        "# DualFed on a domain-shift CIFAR-10 scenario",
        "",
        "Produced by (on the shared 2-core CPU, under the benchmark lock):",
        "",
        "```",
        command,
        "```",
        "",
        f"Setting: {args.clients} clients, {args.rounds} rounds, seed {args.seed}, every client "
        "every round; " + shown + ".",
        "Client i's images (train and test) pass through domain transform i % 4: identity, "
        "grayscale, rotate-90, colour-shift (`pfl_data/hf.py` DOMAIN_SHIFTS), so "
        f"{args.clients // 4} clients per domain. All methods see the same partition.",
        "",
        "Accuracy = mean over clients of each client's accuracy on its own test split, "
        "evaluated after every round. *combined* is the method's own prediction (for DualFed "
        "h_p(u) + h_s(z)); *global-only* and *personal-only* are DualFed's two heads alone. "
        "*final* is the last round, *best* the best round (the paper reports best). "
        "MB up = serialized client uploads over the run.",
        "",
        "| method | combined, final (%) | combined, best (%) | global-only h_s, final (%) "
        "| personal-only h_p, final (%) | pooled, final (%) | MB up | time (s) "
        "| paper PACS / DomainNet avg (%) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "![accuracy per round](dualfed.png)",
        "",
    ]
    doc = args.out / "dualfed.md"
    # the hand-written discussion below the marker survives a rerun
    old = doc.read_text() if doc.exists() else ""
    lines.append(NOTES_MARKER + old.split(NOTES_MARKER, 1)[1] if NOTES_MARKER in old else "")
    doc.write_text("\n".join(lines).rstrip() + "\n")
    return doc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--model", default="resnet8", choices=("cnn4", "resnet8", "resnet18"))
    parser.add_argument("--train-per-client", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--supcon-lambda", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=4000, help="dev-set subset (0 = all 12k)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--runs", type=Path, default=REPO / "outputs" / "dualfed-bench")
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--cell-timeout", type=float, default=None)
    args = parser.parse_args(argv)
    command = "flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.dualfed " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    setting = Setting(f"domain-shift-{args.clients}c", args.clients, {})
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    t0 = time.perf_counter()
    for method in args.methods:
        cell = Cell(
            "dualfed", setting, method, args.seed, args.rounds, run_config(args, method), 1.0
        )
        if not is_complete(cell):
            print(f"{method}: running ...", flush=True)
            ok, seconds, reason = run_cell(cell, args.cell_timeout)
            print(f"{method}: {'ok' if ok else 'FAILED ' + reason} in {seconds:.0f}s", flush=True)
            if not ok:
                failed[method] = reason
        res = load_results(cell)
        if res is not None and res.get("rounds"):
            results[method] = res
            print(f"{method}: final accuracy {res['rounds'][-1]['accuracy_mean']:.4f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(
        results,
        args.out / "dualfed.png",
        f"domain-shift CIFAR-10, {args.clients} clients / 4 domains, {args.model}",
    )
    doc = write_doc(args, results, command, failed)
    print(f"wrote {doc} in {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
