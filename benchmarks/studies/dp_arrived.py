"""Answered (2026-11-25): with clients dropping out, distributed DP's epsilon counts the
noise that arrived (25.30 after 10 rounds, not 17.80): docs/PRIVACY.md section 5 and
docs/results/dp-arrived.md.

Distributed DP counts the noise that arrived: a secure run (SecAgg+, dp-mode
distributed) in which clients drop out, per round: the clients asked and summed,
the target and achieved noise multiplier, the epsilon the run reports (stepped at
the achieved multiplier) and the epsilon that counting the asked-for noise would
have reported.

    python -m benchmarks.studies.dp_arrived [--clients 10] [--rounds 10] [--dropout-rate 0.4]
        [--out docs/results/dp-arrived.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

CONFIG = {
    "method": "fedavg",
    "secure-aggregation": True,
    "dp-mode": "distributed",
    "dp-noise-multiplier": 1.0,
    "dp-clipping-norm": 1.0,
    "secagg-reconstruction-threshold": 0.5,  # a round goes on with half the clients
    "eval-in-fit": False,  # each round scored on its own (not in the next round's fit)
}


def table(results: dict[str, Any], asked: int) -> list[str]:
    """One row per aggregated round of ``results`` (results.json)."""
    from pflower.privacy import PrivacyAccountant

    cfg = results["config"]
    as_asked = PrivacyAccountant(float(cfg["dp-noise-multiplier"]), float(cfg["dp-delta"]))
    rows = [
        "| round | clients asked | uploads summed | target z | achieved z | epsilon reported "
        "(noise that arrived) | epsilon if the asked-for noise were counted |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["rounds"]:
        if r.get("dp_noise_multiplier_achieved") is None:
            continue
        as_asked.step(float(r["dp_sample_rate"]))
        rows.append(
            f"| {r['round']} | {asked} | {r['replies']} | {r['dp_noise_multiplier_target']:.3f} "
            f"| {r['dp_noise_multiplier_achieved']:.3f} | {r['dp_epsilon']:.2f} "
            f"| {as_asked.epsilon():.2f} |"
        )
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.dp_arrived")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dropout-rate", type=float, default=0.4)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    from pflower.engine.simulate import simulate

    with tempfile.TemporaryDirectory() as tmp:
        config = {
            **CONFIG,
            "num-server-rounds": args.rounds,
            "dropout-rate": args.dropout_rate,
            "output-dir": tmp,
            "run-name": "dp-arrived",
        }
        results = simulate(config, args.clients, num_cpus=2.0)
    rows = "\n".join(table(results, args.clients))
    print(rows)
    if args.out:
        command = (
            f"python -m benchmarks.studies.dp_arrived --clients {args.clients} --rounds {args.rounds} "
            f"--dropout-rate {args.dropout_rate} --out {args.out}"
        )
        Path(args.out).write_text(
            f"# Distributed DP: the noise that arrived\n\n`{command}`\n\n{rows}\n"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
