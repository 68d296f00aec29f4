"""FedCP vs FedAvg / FedPer / Local on the CIFAR-10 dev set (CPU-sized).

    flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.fedcp \
        [--clients 10] [--rounds 10] [--rows 4000] [--long-rounds 25] [--runs outputs/fedcp-bench] [--out docs]

Per-class Dirichlet (beta = 0.1) over the clients, 75/25 train/test per client,
4-layer CNN, the paper's SGD lr 0.005 / batch 10 / 1 local epoch for every method
(as PFLlib runs its baselines), mmd-lambda 5. Every method sees the same partition
(it depends only on the data, config and seed). Each run is one ``simulate`` (in this
process, one after another); a finished run (complete results.json, same config) is reused.
Writes ``docs/fedcp.md`` and ``docs/fedcp.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CIFAR10_DEV, run_one, subset_parquet

REPO = Path(__file__).resolve().parent.parent
METHODS = ("fedcp", "fedper", "local", "fedavg")
# FedCP paper (KDD 2023), 4-layer CNN, 20 clients, practical beta = 0.1, 2000 rounds,
# best-round accuracy; only FedCP's figures are given in ../shared/METHODS.md.
PAPER = {"Cifar100": "59.56", "Tiny-ImageNet": "43.49", "Cifar100 (pathological)": "71.80"}


NOTES = """## Why FedCP trails here (the honest reading)

- At 10 rounds FedCP is well behind FedPer and Local and well ahead of FedAvg, as
  the issue reports for PFLlib's own FedCP at 10-30 rounds. The gap sits on the
  large multi-class clients (client-2, -6, -8): there FedCP's accuracy equals the
  share of the client's majority class (35.5 / 38.4 / 35.3 % of their test sets), i.e.
  after 10 rounds it has not yet learned features beyond the label prior, while FedPer
  and Local reach 51-60 %. On the nearly single-class clients every personalised
  method predicts the majority class and they tie.
- FedCP is still rising at 25 rounds: it leaves the majority rate on those clients
  (53.8 / 56.0 / 52.6 % at round 25) and the pooled gap to FedPer shrinks from 10.4
  points at round 10 to 4.5 at round 25 (to Local: 11.9 -> 4.3). Over rounds 10-25
  FedCP gains about 0.7 points a round, FedPer about 0.3. No crossover is measured
  within 25 rounds; a straight-line extrapolation of those slopes (a guess, not a
  measurement) would put one with FedPer near round 35-40.
- The MMD term is what slows it. The one-client diagnostic removes federation:
  with mmd-lambda 0 the FedCP model learns like Local; with the paper's 5 it sits at
  the majority rate for several rounds before it starts to climb. Within a round the
  MMD between phi(x) and the frozen phi_g(x) (zero at the start of the round, second
  order in the drift of phi) acts as a feature-space proximal term that holds phi near
  the extractor it received. In the federation phi_g is
  the average extractor of very different clients, so the pull is towards a
  FedAvg-like representation (FedAvg itself reaches about 25 % here).
- The global head h_g (frozen locally, the average of the clients' blends) gets about
  half of every feature (PIR ~ 0.5), so half of each logit comes from a head that
  fits no client's label distribution; FedPer's personal head sees the whole feature.
- Input scale is not the explanation: halving the inputs (about PFLlib's
  Normalize(0.5, 0.5) scale instead of our per-channel standardisation) keeps the
  client at its majority rate even longer.
- PIR rises from 0.507 to 0.547 at round 10 and 0.572 at round 25 on every client,
  the direction the paper reports (from 0.5 upwards, more personalised information at inference). This early
  it is almost the same on all clients (spread < 0.001), most likely because the
  shared CPN's LayerNorm sets the split and the per-client context has not yet
  differentiated it.
- The paper's claim is for 2000 rounds of 20 clients with ~2,250 images each. This CPU
  budget cannot test it; nothing here contradicts it, and nothing here confirms it.
  No GPU machine was lent to this task, so the paper-scale run was not done.
- Cost: FedCP sends phi plus h_g plus the CPN (Linear 512 -> 1024 and LayerNorm,
  0.53 M parameters), about 2.1 MB more per client and round than FedPer; one
  local step costs about 1.3x FedPer's on this CPU (the extra phi_g pass and MMD,
  timed alone: 47 vs 37 ms at batch 10); the s / round column above mostly measures
  the shared machine's load at the time.

## Using FedCP

The global defaults of `lr`, `batch-size` and `local-epochs` are shared by all methods;
pass the paper's values per run:

    flwr run . --run-config 'method="fedcp" model="cnn4" lr=0.005 batch-size=10 local-epochs=1'

`mmd-lambda` (default 5) weighs the MMD between phi(x) and the frozen received
extractor phi_g(x); `cp-noisy-eval=true` samples gumbel noise at evaluation as the
reference does (the default evaluates with a plain softmax, so the same input always
gives the same output). Each client reports `pir` (mean pm on its test set); the round
record holds `per_client_pir` and `pir_mean`.

## Deviations from the paper's setting (all for the shared 2-core CPU)

- 10 clients, not 20, on a 4000-row random subset of the 12k CIFAR-10 dev set (about 300
  train images per client on average, very unbalanced at beta = 0.1), not full
  CIFAR-10/100 (the paper's CIFAR-100 clients hold about 2,250 train images).
- A handful of rounds instead of 2000. Every number here is an early-training number.
- Nothing was tuned: the paper's lr 0.005 / batch 10 / 1 epoch / lambda 5 for every method.
"""


def run_config(args: argparse.Namespace, dataset: str, method: str, rounds: int) -> dict[str, Any]:
    return {
        "method": method,
        "dataset": dataset,
        "partitioner": "dirichlet",
        "alpha": 0.1,
        "test-fraction": 0.25,
        "model": "cnn4",
        "lr": 0.005,
        "batch-size": 10,
        "local-epochs": 1,
        "momentum": 0.0,
        "num-server-rounds": rounds,
        "seed": args.seed,
        "output-dir": str(Path(args.runs).resolve()),
        "run-name": f"{method}-c{args.clients}-r{rounds}-n{args.rows}-s{args.seed}",
    }


def probe(args: argparse.Namespace, dataset: str, rounds: int = 8) -> dict[str, Any]:
    """Diagnostic: the largest client alone (its upload fed back to it), in-process:
    Local vs FedCP with the paper's mmd-lambda 5, with mmd-lambda 0, and with inputs
    at half scale."""
    path = Path(args.runs) / f"probe2-c{args.clients}-n{args.rows}-s{args.seed}-r{rounds}.json"
    if path.exists():
        return json.loads(path.read_text())
    import torch
    from flwr.common import Context, RecordDict

    from client_app.state import ContextStore
    from methods import get_method
    from pfl_data import data_info, load_client_data
    from run_config.schema import RunConfig

    torch.set_num_threads(1)
    curves: dict[str, list[float]] = {}
    pid, n_train = 0, 0
    for variant, method, extra, scale in (
        ("local", "local", {}, 1.0),
        ("fedcp (mmd-lambda 5)", "fedcp", {}, 1.0),
        ("fedcp (mmd-lambda 0)", "fedcp", {"mmd-lambda": 0.0}, 1.0),
        # inputs x 0.5: roughly PFLlib's Normalize(0.5, 0.5) scale instead of per-channel
        # standardisation (the RBF bandwidths are fixed, so feature scale matters)
        ("fedcp (mmd-lambda 5, inputs x 0.5)", "fedcp", {}, 0.5),
    ):
        raw = run_config(args, dataset, method, rounds)
        raw.update(extra)
        cfg = RunConfig.model_validate(raw)
        if not n_train:
            sizes = [load_client_data(cfg, i, args.clients).num_train for i in range(args.clients)]
            pid, n_train = int(np.argmax(sizes)), max(sizes)
        m = get_method(method)
        model = m.build_model(cfg, data_info(cfg))
        store = ContextStore(Context(0, 0, {}, RecordDict(), {}))
        data = load_client_data(cfg, pid, args.clients)
        if scale != 1.0:
            data = replace(data, x_train=data.x_train * scale, x_test=data.x_test * scale)
        client = m.client(model, m.roles(model), data, cfg, store, torch.device("cpu"), str(pid))
        params, accs = client.get_parameters({}), []
        for r in range(1, rounds + 1):
            params, _, _ = client.fit(params, {"server-round": r})
            accs.append(client.evaluate(params, {"server-round": r})[2]["accuracy"])
        curves[variant] = accs
    out = {"client": f"client-{pid}", "train": n_train, "curves": curves}
    path.write_text(json.dumps(out, indent=2))
    return out


def crossover(fedcp: list[float], other: list[float]) -> int | None:
    """First round from which FedCP's pooled accuracy stays >= the other's."""
    for i in range(len(fedcp)):
        if all(a >= b for a, b in zip(fedcp[i:], other[i:])):
            return i + 1
    return None


def _curves(ax: Any, results: dict[str, dict[str, Any]], title: str) -> None:
    for method, res in results.items():
        rounds = [r["round"] for r in res["rounds"]]
        pooled = [100 * r["accuracy_pooled"] for r in res["rounds"]]
        ax.plot(rounds, pooled, marker="o", ms=3, label=method)
    ax.set_xlabel("round")
    ax.set_ylabel("pooled test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def plot(results: dict[str, dict[str, Any]], long: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if long else 2, figsize=(16 if long else 11, 4))
    _curves(axes[0], results, "CIFAR-10 dev, Dirichlet 0.1, cnn4")
    if long:
        n = len(next(iter(long.values()))["rounds"])
        _curves(axes[1], long, f"the same, {n} rounds")
    source = long if "fedcp" in long else results
    if "fedcp" in source:
        px = axes[-1]
        rounds = source["fedcp"]["rounds"]
        keys = sorted(rounds[-1]["per_client_pir"], key=lambda k: int(k.split("-")[-1]))
        for k in keys:
            px.plot([r["round"] for r in rounds], [r["per_client_pir"][k] for r in rounds], lw=1)
        px.set_xlabel("round")
        px.set_ylabel("PIR (mean pm on the test set)")
        px.set_title(f"FedCP PIR, one line per client ({len(keys)})")
        px.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _crossovers(results: dict[str, dict[str, Any]], rounds: int) -> list[str]:
    if "fedcp" not in results:
        return []
    cp = [r["accuracy_pooled"] for r in results["fedcp"]["rounds"]]
    lines = ["Crossover (first round from which FedCP's pooled accuracy stays at or above):", ""]
    for method, res in results.items():
        if method != "fedcp":
            at = crossover(cp, [r["accuracy_pooled"] for r in res["rounds"]])
            lines.append(f"- {method}: " + (f"round {at}" if at else f"not within {rounds} rounds"))
    return [*lines, ""]


def _per_round(results: dict[str, dict[str, Any]]) -> list[str]:
    n = len(next(iter(results.values()))["rounds"])
    lines = ["| round | " + " | ".join(results) + " |", "|---" * (len(results) + 1) + "|"]
    for i in range(n):
        cells = [f"{100 * res['rounds'][i]['accuracy_pooled']:.2f}" for res in results.values()]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def report(
    args: argparse.Namespace,
    dataset: str,
    results: dict[str, dict[str, Any]],
    long: dict[str, dict[str, Any]],
    diag: dict[str, Any] | None,
    command: str,
) -> str:
    lines = [
        "# FedCP benchmark (CPU)",
        "",
        "Produced by:",
        "",
        f"    {command}",
        "",
        "## Setting",
        "",
        f"- Data: `{CIFAR10_DEV}`"
        + (f", a seeded random subset of {args.rows} rows" if args.rows > 0 else "")
        + f"; per-class Dirichlet (beta = 0.1) over {args.clients} clients "
        "(flwr-datasets `DirichletPartitioner`), each client's data split 75% train / 25% test.",
        "- Model: the paper's 4-layer CNN (D = 512). FedCP adds h_g and the CPN.",
        "- Every method: SGD lr 0.005, no momentum, batch 10, 1 local epoch (FedCP's paper "
        "defaults; PFLlib runs its baselines with the same), all clients every round, "
        f"seed {args.seed}, {args.rounds} rounds. FedCP: mmd-lambda 5, deterministic "
        "(softmax) routing at evaluation.",
        "- Metric: pooled accuracy over all clients' test samples (the paper's metric), "
        "best round and last round; mean of per-client accuracies beside it.",
        "",
        "## Results",
        "",
        "| method | best pooled acc (round) | last pooled acc | best mean acc | s / round "
        "| MB up / round |",
        "|---|---|---|---|---|---|",
    ]
    for method, res in results.items():
        rounds = res["rounds"]
        pooled = [r["accuracy_pooled"] for r in rounds]
        best = int(np.argmax(pooled))
        secs = np.mean([r["seconds"] for r in rounds])
        up = np.mean([r["bytes_up"] for r in rounds]) / 1e6
        lines.append(
            f"| {method} | {100 * pooled[best]:.2f} ({rounds[best]['round']}) "
            f"| {100 * pooled[-1]:.2f} | {100 * max(r['accuracy_mean'] for r in rounds):.2f} "
            f"| {secs:.1f} | {up:.2f} |"
        )
    lines += ["", "Pooled accuracy (%) per round:", "", *_per_round(results)]
    lines += ["![curves and PIR](fedcp.png)", "", *_crossovers(results, args.rounds)]
    if long:
        lines += [
            f"## Longer run: {args.long_rounds} rounds ({', '.join(long)})",
            "",
            "Separate runs of the same setting; their first rounds repeat the short runs' "
            "numbers exactly (seeded partition, initialisation, batch order and gumbel noise).",
            "",
            *_per_round(long),
            *_crossovers(long, args.long_rounds),
        ]
    if diag:
        curves = diag["curves"]
        lines += [
            f"## Diagnostic: the largest client alone ({diag['client']}, {diag['train']} train "
            "images)",
            "",
            "Its own upload is fed back to it each round (no other clients), so only the "
            "local schedule differs. Test accuracy (%) per round:",
            "",
            "| round | " + " | ".join(curves) + " |",
            "|---" * (len(curves) + 1) + "|",
        ]
        for i in range(len(next(iter(curves.values())))):
            cells = [f"{100 * c[i]:.1f}" for c in curves.values()]
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        lines.append("")
    if "fedcp" in results:
        rounds = results["fedcp"]["rounds"]
        keys = sorted(rounds[-1]["per_client_pir"], key=lambda k: int(k.split("-")[-1]))
        acc_cp = rounds[-1]["per_client_accuracy"]
        lines += [
            "",
            "## PIR per client (FedCP)",
            "",
            "PIR = mean of pm (the share of each feature routed to the personal head) "
            "over the client's test set.",
            "",
            f"| client | PIR round 1 | PIR round {args.rounds} | "
            + (f"PIR round {args.long_rounds} | " if "fedcp" in long else "")
            + "FedCP acc (last) | "
            + " | ".join(f"{m} acc (last)" for m in results if m != "fedcp")
            + " |",
            "|---" * (4 + len(results) - 1 + ("fedcp" in long)) + "|",
        ]
        for k in keys:
            others = [
                f"{100 * res['rounds'][-1]['per_client_accuracy'][k]:.1f}"
                for m, res in results.items()
                if m != "fedcp"
            ]
            lines.append(
                f"| {k} | {rounds[0]['per_client_pir'][k]:.3f} "
                f"| {rounds[-1]['per_client_pir'][k]:.3f} | "
                + (
                    f"{long['fedcp']['rounds'][-1]['per_client_pir'][k]:.3f} | "
                    if "fedcp" in long
                    else ""
                )
                + f"{100 * acc_cp[k]:.1f} | "
                + " | ".join(others)
                + " |"
            )
    lines += [
        "",
        "## The paper's numbers",
        "",
        "FedCP (KDD 2023), 4-layer CNN, 20 clients, practical Dirichlet beta = 0.1, "
        "2000 rounds (best round): "
        + ", ".join(f"{k} {v}" for k, v in PAPER.items())
        + ". The paper's claim is that FedCP beats FedAvg and FedPer at that budget.",
        "No CIFAR-10 figure of the paper is given in METHODS.md (the seed text is a garbled "
        "extraction), so there is no like-for-like number for this table.",
        "",
        NOTES,
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=4000, help="dev-set rows to use (0 = all 12k)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--runs", default="outputs/fedcp-bench")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--long-rounds", type=int, default=25, help="0 = no longer run")
    ap.add_argument("--long-methods", nargs="+", default=["fedcp", "fedper", "local"])
    ap.add_argument("--no-probe", action="store_true", help="skip the one-client diagnostic")
    args = ap.parse_args()
    dataset = subset_parquet(args.rows, args.seed, Path(args.runs) / "data")
    results = {
        m: run_one(run_config(args, dataset, m, args.rounds), args.clients) for m in args.methods
    }
    long = {}
    if args.long_rounds > 0:
        long = {
            m: run_one(run_config(args, dataset, m, args.long_rounds), args.clients)
            for m in args.long_methods
        }
    diag = None if args.no_probe else probe(args, dataset)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(results, long, out / "fedcp.png")
    command = "flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.fedcp " + " ".join(
        sys.argv[1:]
    )
    text = report(args, dataset, results, long, diag, command.strip())
    (out / "fedcp.md").write_text(text)
    print(f"wrote {out / 'fedcp.md'}")


if __name__ == "__main__":
    main()
