"""The two privacy figures of docs/PRIVACY.md.

    python -m benchmarks.privacy accuracy [--rounds 10] [--epsilons 1 4 8 inf]
    python -m benchmarks.privacy secagg [--clients 5 10 20] [--rounds 3]

``accuracy``: FedPer and FedDecomp on the CIFAR-10 dev set (4,000-image subset,
per-client Dirichlet alpha = 0.1, 10 clients x (300 train + 100 test), cnn4, each
method's own settings) with client-side DP; the noise multiplier for each target
epsilon (at delta 1e-5, all clients every round) comes from Opacus. In-process.
``secagg``: seconds per round of FedAvg on the embedded default with and without
SecAgg+ at several federation sizes, through Flower's simulation (the SecAgg+
workflow needs its Grid). Each writes ``docs/privacy/<name>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.common import subset_parquet  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "privacy"
DELTA = 1e-5


def noise_for(epsilon: float, rounds: int) -> float:
    if math.isinf(epsilon):
        return 0.0
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=DELTA,
            sample_rate=1.0,
            steps=rounds,
            accountant="rdp",
        )
    )


def accuracy(args: argparse.Namespace) -> None:
    from server_app.inprocess import run_inprocess

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = subset_parquet(4000, 0, Path(tmp))
        for method in ("fedper", "feddecomp"):
            for eps in args.epsilons:
                z = noise_for(eps, args.rounds)
                cfg = {
                    "method": method,
                    "model": "cnn4",
                    "dataset": data,
                    "partitioner": "dirichlet-client",
                    "alpha": 0.1,
                    "train-per-client": 300,
                    "num-server-rounds": args.rounds,
                    "output-dir": tmp,
                    "run-name": f"{method}-{eps}",
                }
                if not math.isinf(eps):
                    cfg.update({"dp-mode": "client", "dp-noise-multiplier": z})
                t0 = time.time()
                res = run_inprocess(cfg, 10)
                rows.append(
                    {
                        "method": method,
                        "target_epsilon": eps,
                        "noise_multiplier": z,
                        "dp_epsilon": res.get("dp_epsilon"),
                        "final_accuracy_mean": res["final_accuracy_mean"],
                        "best_accuracy_mean": res["best_accuracy_mean"],
                        "seconds": time.time() - t0,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    _write("accuracy", rows, args)
    lines = {}
    for method in ("fedper", "feddecomp"):
        mine = [r for r in rows if r["method"] == method]
        xs = [
            "inf" if math.isinf(r["target_epsilon"]) else f"{r['target_epsilon']:g}" for r in mine
        ]
        lines[method] = (xs, [100 * r["final_accuracy_mean"] for r in mine])
    _plot(
        "accuracy",
        lines,
        f"epsilon at delta {DELTA:g} ({args.rounds} rounds; inf = no DP)",
        "final accuracy, mean over clients (%)",
        "client-side DP on CIFAR-10 dev (cnn4, 10 clients, Dir 0.1)",
    )


def secagg(args: argparse.Namespace) -> None:
    from server_app.simulate import simulate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in args.clients:
            for secure in (False, True):
                cfg = {
                    "method": "fedavg",
                    "num-server-rounds": args.rounds,
                    "secure-aggregation": secure,
                    "output-dir": tmp,
                    "run-name": f"{clients}-{secure}",
                }
                res = simulate(cfg, clients, num_cpus=2.0)
                later = [r["seconds"] for r in res["rounds"][1:]] or [res["rounds"][0]["seconds"]]
                rows.append(
                    {
                        "clients": clients,
                        "secure": secure,
                        "seconds_per_round": sum(later) / len(later),
                        "final_accuracy_mean": res["final_accuracy_mean"],
                        # what the strategy saw per client and round (plain: each upload;
                        # SecAgg+: the one aggregate handed to every reply)
                        "payload_bytes_up_per_client": res["rounds"][-1]["bytes_up"] / clients,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    _write("secagg", rows, args)
    lines = {}
    for secure in (False, True):
        mine = [r for r in rows if r["secure"] == secure]
        label = "SecAgg+" if secure else "plain"
        lines[label] = ([r["clients"] for r in mine], [r["seconds_per_round"] for r in mine])
    _plot(
        "secagg",
        lines,
        "clients",
        "seconds per round (rounds 2..R)",
        "FedAvg on the embedded default, Ray simulation, 2-core CPU",
    )


def _plot(name: str, lines: dict[str, tuple[list, list]], x: str, y: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in lines.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / f"{name}.png", dpi=120)
    plt.close(fig)


def _write(name: str, rows: list[dict], args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {"command": f"python -m benchmarks.privacy {name}", "args": vars(args), "rows": rows}
    (OUT / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="figure", required=True)
    a = sub.add_parser("accuracy")
    a.add_argument("--rounds", type=int, default=10)
    a.add_argument("--epsilons", nargs="*", type=float, default=[1, 4, 8, math.inf])
    s = sub.add_parser("secagg")
    s.add_argument("--clients", nargs="*", type=int, default=[5, 10, 20])
    s.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    accuracy(args) if args.figure == "accuracy" else secagg(args)


if __name__ == "__main__":
    main()
