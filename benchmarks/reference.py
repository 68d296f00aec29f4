"""``python -m benchmarks.reference PRESET SETTING``: write pflower/results/reference.json,
FedAvg's and Local's final mean accuracy (mean, sample std and each seed) in one
setting of a preset, from its complete runs: what the summary of a run on the same
data shows beside the run's own figure (pflower/results/reference.py)."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from benchmarks import presets
from benchmarks.runner import is_complete, load_results
from pflower.results.reference import REFERENCE_FILE

MATCH = ("dataset", "model", "hidden-dim", "sim-samples", "sim-dim", "sim-shared-neurons")
MATCH += ("sim-shared-covariates", "sim-noise", "sim-client-streams")
ROWS = {"fedavg": "FedAvg", "local": "Local"}  # method -> the label a summary shows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reference", description=__doc__)
    parser.add_argument("preset", help="a preset whose FedAvg and Local rows ran")
    parser.add_argument("setting", help="the preset's setting to take them from")
    args = parser.parse_args(argv)
    preset = presets.load(args.preset)
    setting = args.setting
    cells = [c for c in preset.cells() if c.setting == setting and c.label in ROWS]
    rows, match, clients, rounds = {}, {}, 0, 0
    for label in ROWS:
        done = [c for c in cells if c.label == label and is_complete(c)]
        if len(done) < 2:
            print(f"{label}: {len(done)} complete seeds in {setting}; run the preset first")
            return 1
        finals = [load_results(c)["final_accuracy_mean"] for c in done]
        rows[label] = {
            "label": ROWS[label],
            "mean": float(np.mean(finals)),
            "std": float(np.std(finals, ddof=1)),
            "seeds": {str(c.seed): f for c, f in zip(done, finals)},
        }
        stored = load_results(done[0])["config"]
        match = {k: stored[k] for k in MATCH if k in stored}
        clients, rounds = done[0].clients, done[0].rounds
    entry = {"preset": preset.name, "setting": setting, "clients": clients, "rounds": rounds}
    entry.update(match=match, rows=rows)
    REFERENCE_FILE.write_text(json.dumps({"settings": [entry]}, indent=1) + "\n")
    print(f"wrote {REFERENCE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
