"""``python -m benchmarks.reference PRESET SETTING [--runs DIR]``: write
pflower/results/reference.json: FedAvg's, Local's and FedFac (static)'s final mean
accuracy (mean, sample std and each seed) and each seed's accuracy per round, in one
setting of a preset, from its complete runs (DIR: where they ran, default the
runner's). A run on the same data and budget shows them: its summary prints the
committed figures beside its own, its plot the committed curves beside its own
(pflower/results/reference.py)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import presets
from benchmarks.runner import is_complete, load_results
from pflower.results import git_commit, scored_rounds
from pflower.results.reference import REFERENCE_FILE

MATCH = ("dataset", "model", "hidden-dim", "sim-samples", "sim-dim", "sim-shared-neurons")
MATCH += ("sim-shared-covariates", "sim-noise", "sim-client-streams")
# method -> the label a summary and a plot show
ROWS = {"fedfac-static": "FedFac (static)", "fedavg": "FedAvg", "local": "Local"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reference", description=__doc__)
    parser.add_argument("preset")
    parser.add_argument("setting")
    parser.add_argument("--runs", type=Path, default=presets.RUNS, help="where the cells ran")
    args = parser.parse_args(argv)
    preset = presets.load(args.preset)
    cells = [
        c
        for c in preset.cells(runs=args.runs.expanduser().resolve())
        if c.setting == args.setting and c.label in ROWS
    ]
    rows, match, clients, rounds, commits = {}, {}, 0, 0, set()
    for label in ROWS:
        done = [c for c in cells if c.label == label and is_complete(c)]
        if len(done) < 2:
            print(f"{label}: {len(done)} complete seeds in {args.setting}; run the preset first")
            return 1
        results = [load_results(c) for c in done]
        finals = [r["final_accuracy_mean"] for r in results]
        rows[label] = {
            "label": ROWS[label],
            "mean": float(np.mean(finals)),
            "std": float(np.std(finals, ddof=1)),
            "seeds": {str(c.seed): f for c, f in zip(done, finals)},
            "curves": {
                str(c.seed): [r["accuracy_mean"] for r in scored_rounds(res["rounds"])]
                for c, res in zip(done, results)
            },
        }
        commits.update(r.get("provenance", {}).get("git_commit", "?") for r in results)
        stored = results[0]["config"]
        match = {k: stored[k] for k in MATCH if k in stored}
        clients, rounds = done[0].clients, done[0].rounds
    entry = {"preset": preset.name, "setting": args.setting, "clients": clients, "rounds": rounds}
    entry.update(match=match, rows=rows)
    made = {
        "command": shlex.join(["python", "-m", "benchmarks.reference", *argv]),
        "runs_commit": sorted(commits),  # what ran the cells
        "written_at": git_commit(Path(__file__).resolve().parents[1]),
        "date": time.strftime("%Y-%m-%d"),
    }
    REFERENCE_FILE.write_text(json.dumps({"made": made, "settings": [entry]}, indent=1) + "\n")
    print(f"wrote {REFERENCE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
