"""Which method should the main job run? Every method on the embedded default
(the FedFac simulation study, 10 clients, 10 rounds, each method's own ``auto``
settings), over seeds, in-process (server_app/inprocess.py).

    python -m benchmarks.main_job [--seeds 0 1 2] [--rounds 10] [--out docs]

Writes ``<out>/main_job/r<rounds>-n<samples>.md`` (mean +- std of the final and
best mean accuracy) and the same ``.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from run_config.schema import METHODS
from server_app.inprocess import run_inprocess

CLIENTS = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="docs")
    ap.add_argument("--sim-samples", type=int, default=0, help="0: the default config's")
    args = ap.parse_args()
    extra = {"sim-samples": args.sim_samples} if args.sim_samples else {}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            finals, bests, secs = [], [], []
            for seed in args.seeds:
                cfg = {
                    "method": method,
                    "seed": seed,
                    "num-server-rounds": args.rounds,
                    "output-dir": tmp,
                    "run-name": f"{method}-{seed}",
                    **extra,
                }
                t0 = time.time()
                res = run_inprocess(cfg, CLIENTS)
                secs.append(time.time() - t0)
                finals.append(res["final_accuracy_mean"])
                bests.append(res["best_accuracy_mean"])
                print(f"{method} seed {seed}: final {finals[-1]:.4f}", flush=True)
            rows[method] = {"final": finals, "best": bests, "seconds": secs}
    out = Path(args.out) / "main_job"
    out.mkdir(parents=True, exist_ok=True)
    name = f"r{args.rounds}-n{args.sim_samples or 'default'}"
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "| method | final acc. (mean over clients) | best acc. | s per run |",
        "|---|---|---|---|",
    ]
    order = sorted(rows, key=lambda m: -statistics.mean(rows[m]["final"]))
    for m in order:
        f, b, s = rows[m]["final"], rows[m]["best"], rows[m]["seconds"]
        sd = statistics.stdev(f) if len(f) > 1 else 0.0
        lines.append(
            f"| `{m}` | {100 * statistics.mean(f):.1f} ± {100 * sd:.1f} | "
            f"{100 * statistics.mean(b):.1f} | {statistics.mean(s):.0f} |"
        )
    table = "\n".join(lines)
    flags = f"--rounds {args.rounds}" + (
        f" --sim-samples {args.sim_samples}" if args.sim_samples else ""
    )
    (out / f"{name}.md").write_text(
        "# Choosing the main job's method\n\n"
        f"The embedded default data (the FedFac simulation study), {CLIENTS} clients, "
        f"{args.rounds} rounds, seeds {args.seeds}, each method with its own `auto` settings"
        f"{f', sim-samples {args.sim_samples}' if args.sim_samples else ''}.\n"
        f"Made with `python -m benchmarks.main_job {flags}` (in-process: the real strategy "
        "and clients, Flower's round loop, no Ray).\n\n" + table + "\n"
    )
    print(table)


if __name__ == "__main__":
    main()
