"""FedDecomp vs FedAvg vs Local on the CIFAR-10 dev set (CPU-sized), plus an
E_lora sweep and alternating vs simultaneous training.

    flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.feddecomp \
        [--clients 10] [--rounds 10] [--long-rounds 20] [--train 100] [--runs outputs/feddecomp-bench] [--out docs]

FedDecomp's per-client Dirichlet protocol (``partitioner = dirichlet-client``,
alpha 0.1: each client draws q_i ~ Dir(alpha), then train and test rows with
the same q_i), every run on the same partition and seed, 4-layer CNN, E = 5
local epochs, SGD momentum 0.9. Each run is one ``server_app.simulate.simulate``
(the real Flower path), one after another in this process; a finished run
(complete results.json, same config) is reused. Writes ``docs/feddecomp.md``
and ``docs/feddecomp.png``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CIFAR10_DEV, run_one

REPO = Path(__file__).resolve().parent.parent

# (label, method, FedDecomp keys): the main comparison first, then the ablations
RUNS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("FedDecomp", "feddecomp", {"lora-epochs": 2}),
    ("FedAvg", "fedavg", {}),
    ("Local", "local", {}),
    ("FedDecomp E_lora=0", "feddecomp", {"lora-epochs": 0}),
    ("FedDecomp E_lora=1", "feddecomp", {"lora-epochs": 1}),
    ("FedDecomp E_lora=3", "feddecomp", {"lora-epochs": 3}),
    ("FedDecomp simultaneous", "feddecomp", {"decomp-schedule": "simultaneous"}),
)
MAIN = ("FedDecomp", "FedAvg", "Local")
# FedDecomp paper, CIFAR-10, Dirichlet alpha = 0.1, ResNet-8, 40 clients, 300 rounds,
# best mean accuracy (Table 1; Table 3 for simultaneous, whose first digits the text
# extraction lost: "..45 +- 1.83"; Fig. 5 gives the E_lora sweep only as a plot).
PAPER = {
    "FedDecomp": "85.47",
    "FedAvg": "60.39",
    "Local": "81.91",
    "FedDecomp E_lora=0": "~ FedAvg (Fig. 5)",
    "FedDecomp E_lora=1": "(Fig. 5, plot only)",
    "FedDecomp E_lora=3": "(Fig. 5, plot only)",
    "FedDecomp simultaneous": "8?.45 (Table 3)",
}


def run_config(args: argparse.Namespace, method: str, extra: dict[str, Any]) -> dict[str, Any]:
    tag = "-".join(f"{k}{v}" for k, v in extra.items())
    return {
        "method": method,
        "dataset": CIFAR10_DEV,
        "partitioner": "dirichlet-client",
        "alpha": 0.1,
        "train-per-client": args.train,
        "test-per-client": args.test,
        "model": "cnn4",
        "local-epochs": 5,
        "batch-size": args.batch,
        "lr": args.lr,
        "momentum": 0.9,
        "num-server-rounds": args.rounds,
        "seed": args.seed,
        **extra,
        "output-dir": str(Path(args.runs).resolve()),
        "run-name": f"{method}{'-' + tag if tag else ''}-c{args.clients}-r{args.rounds}"
        f"-n{args.train}-s{args.seed}",
    }


def accs(res: dict[str, Any]) -> list[float]:
    return [100 * r["accuracy_mean"] for r in res["rounds"]]


def plot(results: dict[str, dict[str, Any]], long: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if long else 2, figsize=(16.5 if long else 11, 4))
    ax, bx = axes[0], axes[1]
    for label in MAIN + ("FedDecomp simultaneous",):
        if label in results:
            a = accs(results[label])
            ax.plot(range(1, len(a) + 1), a, marker="o", ms=3, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("mean per-client test accuracy (%)")
    ax.set_title("CIFAR-10 dev, per-client Dirichlet 0.1, cnn4")
    ax.grid(alpha=0.3)
    ax.legend()
    sweep = [(e, f"FedDecomp E_lora={e}" if e != 2 else "FedDecomp") for e in range(4)]
    sweep = [(e, lab) for e, lab in sweep if lab in results]
    bx.plot(
        [e for e, _ in sweep],
        [max(accs(results[lab])) for _, lab in sweep],
        marker="o",
        label="FedDecomp (best round)",
    )
    for label, style in (("FedAvg", "--"), ("Local", ":")):
        if label in results:
            bx.axhline(max(accs(results[label])), ls=style, color="gray", label=label)
    bx.set_xlabel("E_lora (of E = 5)")
    bx.set_ylabel("best mean accuracy (%)")
    bx.set_title(
        f"E_lora sweep ({len(accs(results[sweep[0][1]]))} rounds)" if sweep else "E_lora sweep"
    )
    bx.set_xticks([e for e, _ in sweep])
    bx.grid(alpha=0.3)
    bx.legend()
    if long:
        cx = axes[2]
        for label, res in long.items():
            a = accs(res)
            cx.plot(range(1, len(a) + 1), a, marker="o", ms=3, label=label)
        cx.set_xlabel("round")
        cx.set_ylabel("mean per-client test accuracy (%)")
        cx.set_title(f"the same, {len(a)} rounds")
        cx.grid(alpha=0.3)
        cx.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results: dict[str, dict[str, Any]], labels: tuple[str, ...]) -> list[str]:
    lines = [
        "| run | best mean acc % (round) | last mean acc % | paper (300 rounds) | s / round "
        "| MB up / round |",
        "|---|---|---|---|---|---|",
    ]
    for label in labels:
        if label not in results:
            continue
        res = results[label]
        a = accs(res)
        best = int(np.argmax(a))
        secs = np.mean([r["seconds"] for r in res["rounds"]])
        up = np.mean([r["bytes_up"] for r in res["rounds"]]) / 1e6
        lines.append(
            f"| {label} | {a[best]:.2f} ({best + 1}) | {a[-1]:.2f} | {PAPER[label]} "
            f"| {secs:.1f} | {up:.2f} |"
        )
    return lines


def report(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    long: dict[str, dict[str, Any]],
    command: str,
) -> str:
    wall = sum(r.get("wall_seconds", 0.0) for r in (*results.values(), *long.values()))
    lines = [
        "# FedDecomp benchmark (CPU)",
        "",
        "Produced by:",
        "",
        f"    {command}",
        "",
        "(wrapped in `flock /tmp/pflower-bench.lock nice -n 10 ...` on the shared machine; "
        "finished runs are reused, so rerunning only redraws the report)",
        "",
        f"(about {wall / 60:.0f} min of wall time on the shared 2-core CPU, "
        "every run one `simulate` call: the real Flower ServerApp/ClientApp path).",
        "",
        "## Setting",
        "",
        f"- Data: `{CIFAR10_DEV}` (12k CIFAR-10 images), FedDecomp's per-client Dirichlet "
        f"protocol (`partitioner = dirichlet-client`, alpha = 0.1): {args.clients} clients, "
        f"each {args.train} train + {args.test} test images drawn with the same class "
        "proportions q_i ~ Dir(0.1). Same partition and seed "
        f"({args.seed}) for every run.",
        "- Model: the 4-layer CNN (conv5x5 32, conv5x5 64, fc 512, fc 10), every conv and "
        "linear layer (classifier included) decomposed for FedDecomp with R_c = R_l = 0.6 "
        "(the paper's best CIFAR-10 pair) on the paper's min(I, O) basis.",
        f"- Every run: E = 5 local epochs, SGD lr {args.lr}, momentum 0.9, batch {args.batch}, "
        f"all clients every round, {args.rounds} rounds. FedDecomp: E_lora = 2 (tau), then 3 "
        "on sigma (+ biases), fresh optimizer per phase, plain mean of sigma on the server. "
        "FedAvg: sample-weighted mean. Local: nothing leaves the client.",
        "- Metric: mean over clients of per-client test accuracy (global sigma + own tau), "
        "best round, as the paper.",
        "",
        "Paper setting (what the paper column is): ResNet-8, 40 clients x (500 + 100), "
        "5 local epochs, SGD 0.1, batch 100, 300 rounds, 3 seeds.",
        "",
        "## FedDecomp vs FedAvg vs Local",
        "",
        *table(results, MAIN),
        "",
        "## Ablations: E_lora sweep (E = 5) and alternating vs simultaneous",
        "",
        *table(
            results,
            (
                "FedDecomp E_lora=0",
                "FedDecomp E_lora=1",
                "FedDecomp",
                "FedDecomp E_lora=3",
                "FedDecomp simultaneous",
            ),
        ),
        "",
        "(`FedDecomp` is E_lora = 2, alternating.)",
        "",
        "Mean accuracy (%) per round:",
        "",
        "| round | " + " | ".join(results) + " |",
        "|---" * (len(results) + 1) + "|",
    ]
    for i in range(args.rounds):
        cells = [f"{accs(res)[i]:.2f}" for res in results.values()]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    if long:
        n = len(next(iter(long.values()))["rounds"])
        lines += [
            "",
            f"## The main comparison over {n} rounds",
            "",
            f"The same three runs (same partition, seed and settings) for {n} rounds; "
            f"their first {args.rounds} rounds repeat the runs above exactly (the client "
            "seeds depend only on seed, round and client).",
            "",
            *table(long, MAIN),
            "",
            "| round | " + " | ".join(long) + " |",
            "|---" * (len(long) + 1) + "|",
        ]
        for i in range(n):
            lines.append(
                f"| {i + 1} | " + " | ".join(f"{accs(r)[i]:.2f}" for r in long.values()) + " |"
            )
    lines += ["", "![curves and E_lora sweep](feddecomp.png)", "", *discussion(args, results, long)]
    return "\n".join(lines)


def discussion(
    args: argparse.Namespace, results: dict[str, dict[str, Any]], long: dict[str, dict[str, Any]]
) -> list[str]:
    """What the numbers say, with the figures computed from the runs."""
    if not all(label in results for label in MAIN):
        return []
    best = {label: max(accs(res)) for label, res in results.items()}
    tau_steps = 2 * -(-args.train // args.batch) * args.rounds
    lines = [
        "## Reading the numbers",
        "",
        f"- After {args.rounds} rounds the paper's claim is only half reproduced: FedDecomp "
        "beats FedAvg "
        f"({best['FedDecomp']:.1f} vs {best['FedAvg']:.1f} best mean accuracy) but stays far "
        f"below Local ({best['Local']:.1f}); the paper has 85.47 / 60.39 / 81.91 after "
        "300 rounds.",
        "- Why: tau starts at exactly 0 (B = 0) and is scaled by 1/rank, so the personal part "
        "grows slowly, and until it has grown the evaluated model is mostly the global sigma, "
        "which at alpha = 0.1 is FedAvg-level. Here a client takes "
        f"{tau_steps} SGD steps on tau over the whole run (E_lora = 2 epochs of "
        f"{-(-args.train // args.batch)} batches, {args.rounds} rounds); the paper's clients "
        "take 2 x 5 x 300 = 3000.",
    ]
    if all(label in long for label in MAIN):
        lb = {label: max(accs(res)) for label, res in long.items()}
        fd = accs(long["FedDecomp"])
        lines.append(
            f"- Over {len(fd)} rounds the shape the paper and the issue describe appears: "
            f"FedDecomp reaches {lb['FedDecomp']:.1f} (round {int(np.argmax(fd)) + 1}, "
            f"still rising), far above FedAvg ({lb['FedAvg']:.1f}) and closing on Local "
            f"({lb['Local']:.1f}, at its plateau)."
        )
    if "FedDecomp E_lora=3" in results:
        e3 = accs(results["FedDecomp E_lora=3"])
        lines.append(
            f"- The E_lora sweep supports this: with 3 of 5 epochs on tau FedDecomp reaches "
            f"{e3[-1]:.1f} by round {len(e3)} (still rising), close to Local; the paper's "
            "Fig. 5 finds the optimum at E_lora = 2 after 300 rounds, when tau has had time "
            "to grow."
        )
    if "FedDecomp E_lora=0" in results:
        same = accs(results["FedDecomp E_lora=0"]) == accs(results["FedAvg"])
        lines.append(
            "- E_lora = 0 is FedAvg: "
            + (
                "the two runs give the same accuracy in every round (every client has "
                f"{args.train} train images, so the plain and sample-weighted means agree)."
                if same
                else "the curves differ here (clients have different sample counts, so the "
                "plain mean differs from FedAvg's weighted mean)."
            )
        )
    if "FedDecomp simultaneous" in results:
        lines.append(
            f"- Alternating vs simultaneous: {best['FedDecomp']:.1f} vs "
            f"{best['FedDecomp simultaneous']:.1f}. The paper finds the two similar on "
            "CIFAR-10 and alternating clearly better on the harder data sets (Table 3)."
        )
    lines += [
        "- Local is strong at alpha = 0.1 because a client sees one to three classes: "
        "predicting its majority class is already right most of the time.",
        "- Communication: FedDecomp uploads exactly FedAvg's bytes (sigma, biases, "
        "BatchNorm; A and B never travel). Its rounds cost more compute than FedAvg's "
        "only in the tau phase (the B @ A product and its gradient); in the sigma phase tau "
        "is computed once and held constant.",
        "- Other differences from the paper: one seed (paper: 3); 10 clients x 100 train "
        "images (paper 40 x 500); the 4-layer CNN without BatchNorm at lr 0.05 (paper: "
        "ResNet-8 at lr 0.1); batch 50 so that an epoch has more than one step. The issue "
        "reports that the official code (ResNet-8 with BatchNorm at lr 0.1, 10 clients, its "
        "rank-basis = out and a rank-40 head, i.e. larger ranks than the paper's rule) brings "
        "FedDecomp level with Local within 20 rounds; here it is still a few points short "
        "after 20 rounds, with a smaller model without BatchNorm and a lower lr, both of "
        "which slow tau down.",
        "- No GPU machine was lent to this task, so the paper-scale run (40 clients, "
        "300 rounds, ResNet-8) was not made; `benchmarks.harness --preset "
        "gpu-feddecomp-cifar10` describes it.",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--train", type=int, default=100)
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--long-rounds", type=int, default=20, help="rerun the main three this long (0: no)"
    )
    parser.add_argument("--only", nargs="*", default=None, help="labels of RUNS to run")
    parser.add_argument("--runs", default="outputs/feddecomp-bench")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.feddecomp " + shlex.join(sys.argv[1:] if argv is None else argv)
    results: dict[str, dict[str, Any]] = {}
    for label, method, extra in RUNS:
        if args.only is not None and label not in args.only:
            continue
        results[label] = run_one(run_config(args, method, extra), args.clients)
        write(args, results, {}, out, command)
    if args.long_rounds > args.rounds:
        long_args = argparse.Namespace(**{**vars(args), "rounds": args.long_rounds})
        long: dict[str, dict[str, Any]] = {}
        for label, method, extra in RUNS:
            if label in MAIN and (args.only is None or label in args.only):
                long[label] = run_one(run_config(long_args, method, extra), args.clients)
                write(args, results, long, out, command)


def write(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    long: dict[str, dict[str, Any]],
    out: Path,
    command: str,
) -> None:
    """Rewrite the report after every run: an interrupted benchmark keeps what it did."""
    plot(results, long, out / "feddecomp.png")
    (out / "feddecomp.md").write_text(report(args, results, long, command.strip()))
    print(f"wrote {out / 'feddecomp.md'}", flush=True)


if __name__ == "__main__":
    main()
