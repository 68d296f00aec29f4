"""Training under client dropout: accuracy per round and failures per round for
several ``dropout-rate`` values (Flower's failure path), same data and seed.

    python -m benchmarks.reliability            # writes docs/reliability_dropout.png + .json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from server_app.simulate import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", default="0,0.2,0.4")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--method", default="fedper")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args()
    out = Path(args.out)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rate in [float(r) for r in args.rates.split(",")]:
            print(f"dropout-rate={rate}", flush=True)
            runs[rate] = simulate(
                {
                    "method": args.method,
                    "num-server-rounds": args.rounds,
                    "dropout-rate": rate,
                    "output-dir": tmp,
                    "run-name": f"drop{rate}",
                },
                num_clients=args.clients,
            )["rounds"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for rate, rounds in runs.items():
        x = [r["round"] for r in rounds]
        ax1.plot(
            x, [r["accuracy_mean"] for r in rounds], marker="o", ms=3, label=f"dropout {rate:.0%}"
        )
        ax2.bar(
            [v + 0.25 * list(runs).index(rate) for v in x],
            [r["failures"] for r in rounds],
            width=0.25,
            label=f"dropout {rate:.0%}",
        )
    ax1.set(
        xlabel="round",
        ylabel="accuracy (mean over clients)",
        title=f"{args.method}, {args.clients} clients",
    )
    ax2.set(xlabel="round", ylabel="failed clients", title="failures reported per round")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "reliability_dropout.png", dpi=120)
    summary = {
        str(rate): {
            "final_accuracy_mean": rounds[-1]["accuracy_mean"],
            "failures": sum(r["failures"] for r in rounds),
            "replies": sum(r["replies"] for r in rounds),
        }
        for rate, rounds in runs.items()
    }
    (out / "reliability_dropout.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
