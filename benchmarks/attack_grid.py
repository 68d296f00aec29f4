"""One hostile site, or up to three, against each defence, at 2, 4 and 10 sites.

The attacks (client_app/attacks.py) are the four generic ones on FedAvg and the ones
on what only personalised FL has: FedFac's factor analysis (``fa-steer``),
Factorized-FL's matching (``match-magnet``), the shared heads of FedCP and DualFed
(``head-flip``, and ``sign-flip`` of the whole shared update). Each cell runs the
in-process engine on the embedded data (the FedFac simulation study: every site has
personal covariates), ``sim-samples`` 300 a site (60 test), 10 rounds, seed 0, each
method with its own settings. The table reports the honest sites' final mean accuracy
(the attackers are left out), its change from the same defence's clean run, and for
FedFac the share of neurons whose shared/personal role differs from the clean run's
split, for Factorized-FL the weight the attackers hold in the honest sites' aggregates.

    python -m benchmarks.attack_grid [--ci] [--jobs 2] [--out docs/results]

Cells already run (a results.json under --runs) are reused; ``--ci`` runs a
reduced grid (2 rounds, 60 samples a site) into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE = {"dataset": "synthetic", "sim-samples": 300, "num-server-rounds": 10, "seed": 0}
CI_BASE = {"dataset": "synthetic", "sim-samples": 60, "num-server-rounds": 2, "seed": 0}
OFF = {"weight-cap": 0.0, "update-norm-bound": 0.0, "norm-history-rounds": 0}
OFF |= {"direction-check-from": 0}
DEFENCES: dict[str, dict[str, Any]] = {
    "no defence": OFF,
    "defaults": {},
    "median": {"aggregation": "median"},
    "trimmed mean": {"aggregation": "trimmed-mean", "trim-fraction": 0.3},
}
# Factorized-FL matched as in its domain setting (the reference's values): matching
# decides whom a site learns from
FFL = {"factorized-fl.sim-threshold": 0.95, "factorized-fl.epsilon": 20.0}
FFL |= {"factorized-fl.min-aggr": 4}
GENERIC = ("inflate-count", "scale", "sign-flip", "label-flip")
SIZES = ((2, 1), (4, 1), (10, 1), (10, 2), (10, 3))  # (sites, attackers)


@dataclass(frozen=True)
class Cell:
    """One run: a method, a federation size, an attack and a defence."""

    part: str
    method: str
    sites: int
    attack: str
    attackers: int
    defence: str
    config: dict[str, Any] = field(hash=False)

    @property
    def name(self) -> str:
        d = "-".join("".join(c if c.isalnum() else " " for c in self.defence).split())
        return f"{self.method}-{self.sites}-{self.attack}-{self.attackers}-{d}"


def cells(ci: bool = False) -> list[Cell]:
    """The grid (``ci``: one cell per attack kind and a clean one beside it)."""
    out: list[Cell] = []

    def add(part: str, method: str, n: int, attack: str, a: int, defence: str, extra: dict) -> None:
        cfg = {**(CI_BASE if ci else BASE), "method": method, **extra}
        if a:
            cfg |= {"attack": attack, "attack-clients": a}
        out.append(Cell(part, method, n, attack if a else "clean", a, defence, cfg))

    if ci:
        add("generic", "fedavg", 4, "clean", 0, "defaults", {})
        add("generic", "fedavg", 4, "sign-flip", 1, "defaults", {})
        add("fedfac", "fedfac-static", 4, "clean", 0, "defaults", {})
        add("fedfac", "fedfac-static", 4, "fa-steer", 1, "defaults", {})
        add("factorized-fl", "factorized-fl-alpha", 4, "clean", 0, "defaults", FFL)
        add("factorized-fl", "factorized-fl-alpha", 4, "match-magnet", 1, "defaults", FFL)
        add("heads", "fedcp", 4, "head-flip", 1, "defaults", {})
        return out
    for defence, d in DEFENCES.items():
        for n in (2, 4, 10):
            add("generic", "fedavg", n, "clean", 0, defence, d)
        for n, a in SIZES:
            for attack in GENERIC:
                add("generic", "fedavg", n, attack, a, defence, d)
    fa_defences = {
        "no defence": {**OFF},
        "defaults": {},
        "defaults + site-median FA": {"fedfac.fa-robust": "site-median"},
    }
    for defence, d in fa_defences.items():
        for n, a in ((4, 0), (4, 1), (10, 0), (10, 1), (10, 3)):
            add("fedfac", "fedfac-static", n, "fa-steer", a, defence, d)
    ffl_defences = {
        "no defence": {**OFF, "factorized-fl.match-cap": 0.0},
        "defaults, no match cap": {"factorized-fl.match-cap": 0.0},
        "defaults": {},
    }
    for defence, d in ffl_defences.items():
        for n, a in ((4, 0), (4, 1), (10, 0), (10, 1), (10, 3)):
            add("factorized-fl", "factorized-fl-alpha", n, "match-magnet", a, defence, {**FFL, **d})
    for method in ("fedcp", "dualfed"):
        for defence in ("no defence", "defaults", "median"):
            for n, a in ((4, 0), (10, 0)):
                add("heads", method, n, "clean", a, defence, DEFENCES[defence])
            for attack in ("head-flip", "sign-flip"):
                for n, a in ((4, 1), (10, 1), (10, 3)):
                    add("heads", method, n, attack, a, defence, DEFENCES[defence])
    return out


def run_cell(args: tuple[Cell, str]) -> str:
    """Run one cell into ``runs/<name>`` unless it ran every round there already."""
    cell, runs = args
    if complete(Path(runs) / cell.name / "results.json", cell.config["num-server-rounds"]):
        return cell.name
    logging.disable(logging.WARNING)
    from pflower.engine.inprocess import run_inprocess
    from strategies.outcome import RunFailed

    config = {**cell.config, "run-name": cell.name, "output-dir": runs}
    try:
        run_inprocess(config, cell.sites)
    except RunFailed as err:  # a round left with nothing by an attack is a measurement too
        print(f"{cell.name}: the run failed ({err}); its rounds are measured", flush=True)
    return cell.name


def complete(path: Path, rounds: int) -> bool:
    """Whether ``path`` is a results.json with all ``rounds`` (one is written each round)."""
    try:
        return len(json.loads(path.read_text())["rounds"]) == rounds
    except (OSError, ValueError, KeyError):
        return False


def honest_accuracy(results: dict[str, Any], attackers: int) -> float:
    """Final mean accuracy (%) of the clients past the first ``attackers``."""
    last = results["rounds"][-1]["per_client_accuracy"]
    honest = [v for k, v in last.items() if int(k.rsplit("-", 1)[1]) >= attackers]
    return 100.0 * sum(honest) / len(honest)


def final_split(results: dict[str, Any]) -> list[int] | None:
    """FedFac: the last round's shared/personal mask over every Lambda neuron."""
    masks = [r["fa_shared_mask"] for r in results["rounds"] if r.get("fa_shared_mask")]
    return [x for mask in masks[-1].values() for x in mask] if masks else None


def attacker_weight(results: dict[str, Any], attackers: int) -> float | None:
    """Factorized-FL: the attackers' mean total weight in the honest sites' aggregates
    (the last round's mixture)."""
    mix = next((r["ffl_mixture"] for r in reversed(results["rounds"]) if "ffl_mixture" in r), None)
    if mix is None or not attackers:
        return None
    index = {k: i for i, k in enumerate(mix["clients"])}
    hostile = [index[f"client-{i}"] for i in range(attackers)]
    rows = [row for k, row in zip(mix["clients"], mix["matrix"]) if index[k] not in hostile]
    return sum(sum(row[j] for j in hostile) for row in rows) / len(rows)


def summarise(grid: list[Cell], runs: Path) -> list[dict[str, Any]]:
    """One row per cell: honest accuracy, its change from the clean run, the extras."""
    results = {c: json.loads((runs / c.name / "results.json").read_text()) for c in grid}
    clean = {
        (c.part, c.method, c.sites, c.defence): r for c, r in results.items() if not c.attackers
    }
    rows = []
    for c, r in results.items():
        acc = honest_accuracy(r, c.attackers)
        base = clean.get((c.part, c.method, c.sites, c.defence))
        row = {"cell": c, "honest": acc, "change": None, "split": None, "weight": None}
        if base is not None:
            row["change"] = acc - honest_accuracy(base, c.attackers)
            mine, theirs = final_split(r), final_split(base)
            if mine and theirs:
                row["split"] = 100.0 * sum(a != b for a, b in zip(mine, theirs)) / len(mine)
        row["weight"] = attacker_weight(r, c.attackers)
        rows.append(row)
    return rows


def generic_table(rows: list[dict[str, Any]]) -> list[str]:
    """FedAvg: one line per (sites, attackers, attack), one column per defence."""
    lines = [
        "| sites | hostile | attack | " + " | ".join(DEFENCES) + " |",
        "|---|---|---|" + "---|" * len(DEFENCES),
    ]
    mine = [r for r in rows if r["cell"].part == "generic"]
    keys = sorted({(r["cell"].sites, r["cell"].attackers, r["cell"].attack) for r in mine})
    for n, a, attack in keys:
        by = {
            r["cell"].defence: r["honest"]
            for r in mine
            if (r["cell"].sites, r["cell"].attackers, r["cell"].attack) == (n, a, attack)
        }
        cols = " | ".join(f"{by[d]:.1f}" if d in by else "" for d in DEFENCES)
        lines.append(f"| {n} | {a} | {attack} | {cols} |")
    return lines


def part_table(rows: list[dict[str, Any]], part: str) -> list[str]:
    """The personalised attacks: one line per cell."""
    lines = [
        "| method | sites | hostile | attack | defence | honest acc (%) | change vs clean | "
        "split changed (%) | attackers' weight in honest aggregates |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(x: float | None, spec: str) -> str:
        return "" if x is None else format(x, spec)

    for r in [r for r in rows if r["cell"].part == part]:
        c = r["cell"]
        lines.append(
            f"| {c.method} | {c.sites} | {c.attackers} | {c.attack} | {c.defence} | "
            f"{r['honest']:.1f} | {fmt(r['change'], '+.1f')} | {fmt(r['split'], '.0f')} | "
            f"{fmt(r['weight'], '.2f')} |"
        )
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """FedAvg's honest accuracy per scenario (rows) and defence (columns), annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    mine = [r for r in rows if r["cell"].part == "generic"]
    keys = sorted({(r["cell"].sites, r["cell"].attackers, r["cell"].attack) for r in mine})
    grid = np.full((len(keys), len(DEFENCES)), np.nan)
    for r in mine:
        c = r["cell"]
        grid[keys.index((c.sites, c.attackers, c.attack)), list(DEFENCES).index(c.defence)] = r[
            "honest"
        ]
    fig, ax = plt.subplots(figsize=(6.5, 0.32 * len(keys) + 1.5))
    image = ax.imshow(grid, cmap="RdYlGn", aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(DEFENCES)), list(DEFENCES), fontsize=8)
    ax.set_yticks(range(len(keys)), [f"{n} sites, {a} x {k}" for n, a, k in keys], fontsize=7)
    ax.set_title("FedAvg: honest sites' final accuracy (%)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(grid: list[Cell], runs: Path, out: Path, command: str) -> Path:
    """Write attacks-grid.md and attacks-grid.png under ``out``."""
    rows = summarise(grid, runs)
    out.mkdir(parents=True, exist_ok=True)
    plot(rows, out / "attacks-grid.png")
    text = [
        "# Attacks at 2, 4 and 10 sites, against each defence",
        "",
        (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "",
        f"Made with `{command}`. Generated by benchmarks/attack_grid.py: do not edit by hand.",
        "",
        "## FedAvg: the four generic attacks (honest sites' final accuracy, %)",
        "",
        *generic_table(rows),
        "",
        "![grid](attacks-grid.png)",
    ]
    for part, title in (
        ("fedfac", "FedFac: steering the factor analysis"),
        ("factorized-fl", "Factorized-FL: a matching magnet"),
        ("heads", "FedCP and DualFed: their shared heads"),
    ):
        if any(r["cell"].part == part for r in rows):
            text += ["", f"## {title}", "", *part_table(rows, part)]
    path = out / "attacks-grid.md"
    path.write_text("\n".join(text) + "\n")
    return path


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attack_grid")
    parser.add_argument("--ci", action="store_true", help="the reduced grid")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--runs", type=Path, help="default: outputs/attacks-grid")
    args = parser.parse_args(argv)
    grid = cells(args.ci)
    runs = (args.runs or Path("outputs/attacks-grid")).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with context.Pool(args.jobs) as pool:
        for i, name in enumerate(pool.imap(run_cell, [(c, str(runs)) for c in grid]), 1):
            print(f"[{i}/{len(grid)}] {name}", flush=True)
    command = "python -m benchmarks.attack_grid" + " --ci" * args.ci
    print(report(grid, runs, args.out, command))


if __name__ == "__main__":
    main(sys.argv[1:])
