"""Answered (2026-12-06): HEAD's engines beside the engines at #94's filing (3d39c3a),
paired in one run with pfl-research and the floor: HEAD's in-process engine 0.87-0.93x
of the old one's s/round, Ray 0.90-1.04x; the first side-by-side table's two lowest
ratio cells were one draw (docs/notes/2026-12-06-the-side-by-side-at-94s-filing-and-now.md).

Each repeat runs every (setting, row) cell of ``pfl-side-by-side`` once, one
``python -m benchmarks run`` a cell, the rows' order rotated by one between repeats;
the old code's rows run in ``git archive BASE`` unpacked outside the checkout, that
tree first on ``PYTHONPATH`` and its own benchmark runner. A ratio is two rows of one
repeat. s/round is the median round after the first, as the report takes it.

    python -m benchmarks.studies.paired_codes --base 3d39c3a --repeats 4 \\
        --settings 100-clients-10pct 100-clients-all --out /tmp/paired
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.client_cpu import base_tree
from benchmarks.presets import REPO, SHARED_DATA

# (name, row label, whose tree: "head" or "base")
ROWS = [
    ("pfl", "fedavg pfl-research", "head"),
    ("head-inproc", "fedavg in-process", "head"),
    ("base-inproc", "fedavg in-process", "base"),
    ("head-ray", "fedavg simulation", "head"),
    ("base-ray", "fedavg simulation", "base"),
    ("floor", "fedavg floor", "head"),
]
PAIRS = [
    ("head-inproc", "base-inproc"),
    ("head-ray", "base-ray"),
    ("head-inproc", "pfl"),
    ("base-inproc", "pfl"),
    ("head-ray", "pfl"),
    ("base-ray", "pfl"),
]


def s_per_round(results: Path) -> float:
    """The median round's seconds after the first (the report's s/round)."""
    rounds = json.loads(results.read_text())["rounds"]
    seconds = [r["seconds"] for r in rounds if "seconds" in r]
    return statistics.median(seconds[1:] or seconds)


def run_cell(tree: Path, setting: str, row: str, out: Path) -> float:
    """One cell in ``tree``'s own runner; nan where it failed."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PFLOWER_DATA_DIR": str(SHARED_DATA)}
    cmd = [sys.executable, "-m", "benchmarks", "run", "pfl-side-by-side"]
    cmd += ["--settings", setting, "--rows", row, "--rerun", "--out", str(out)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    found = sorted(out.glob("runs/*/*/*/results.json"))
    if done.returncode != 0 or not found:
        print(f"{row} in {tree} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return float("nan")
    return s_per_round(found[0])


def table(samples: dict[tuple[int, str, str], float]) -> str:
    """Markdown: per setting, each row's median [range] and each pair's paired ratio."""
    lines = ["| setting | row or pair | median | range | repeats |", "|---|---|---|---|---|"]
    settings = sorted({s for _, s, _ in samples}, key=lambda s: (len(s), s))
    for setting in settings:
        repeats = sorted({r for r, s, _ in samples if s == setting})
        named = [(n, [samples.get((r, setting, n)) for r in repeats]) for n, _, _ in ROWS]
        for a, b in PAIRS:
            ratios = [
                samples[(r, setting, a)] / samples[(r, setting, b)]
                for r in repeats
                if (r, setting, a) in samples and (r, setting, b) in samples
            ]
            named.append((f"{a} / {b}", ratios))
        for name, values in named:
            v = [x for x in values if x is not None and not math.isnan(x)]
            if v:
                med, lo, hi = statistics.median(v), min(v), max(v)
                lines.append(f"| {setting} | {name} | {med:.3f} | {lo:.3f}-{hi:.3f} | {len(v)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.paired_codes")
    parser.add_argument("--base", default="3d39c3a", help="the older commit")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--settings", nargs="+", default=["100-clients-10pct", "100-clients-all"])
    parser.add_argument("--rows", nargs="+", default=[n for n, _, _ in ROWS], help="row names")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"head": REPO, "base": base_tree(args.base, args.out / f"tree-{args.base}")}
    rows = [r for r in ROWS if r[0] in args.rows]
    samples: dict[tuple[int, str, str], float] = {}
    with open(args.out / "paired.csv", "a", newline="") as log:
        for rep in range(args.repeats):
            turn = rep % len(rows)
            for setting in args.settings:
                for name, row, whose in rows[turn:] + rows[:turn]:
                    cell_out = args.out / f"r{rep}" / setting / name
                    s = run_cell(trees[whose], setting, row, cell_out)
                    samples[(rep, setting, name)] = s
                    csv.writer(log).writerow(
                        [rep, setting, name, f"{s:.4f}", time.strftime("%H:%M:%S")]
                    )
                    log.flush()
                    print(
                        f"repeat {rep + 1}/{args.repeats} {setting} {name}: {s:.3f} s/round",
                        flush=True,
                    )
    (args.out / "paired.md").write_text(table(samples) + "\n")
    print(f"table: {args.out / 'paired.md'}")


if __name__ == "__main__":
    main()
