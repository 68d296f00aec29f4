"""An ablation's table and plot from a preset's runs: each row against its method's
default row, seed by seed (the same seeds, data and budget).

    python -m benchmarks.ablation factorized-fl-ablation
    python -m benchmarks.ablation fedfac-ablation

writes docs/results/<preset>-ablation.md and .png (``--out`` elsewhere). Per row: the
final mean client accuracy (mean and sample std over seeds, each seed), its paired
difference from the method's default row (the row named as the method alone: our
default) on the same seeds, MB up and down a client and round, and the preset's
``[report] extras``. Run ``python -m benchmarks run <preset>`` first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import presets
from benchmarks.report import extra_value
from benchmarks.runner import is_complete, load_results

DOCS = presets.REPO / "docs" / "results"


def rows(preset: presets.Preset, runs: Path = presets.RUNS) -> dict[str, dict[str, Any]]:
    """label -> {method, seeds, final (per seed, %), up, down (MB a client-round), extras}."""
    out: dict[str, dict[str, Any]] = {}
    for cell in preset.cells(runs=runs):
        if not is_complete(cell):
            continue
        res = load_results(cell) or {}
        row = out.setdefault(
            cell.label,
            {
                "method": cell.config["method"],
                "authors": cell.config.get("profile") == "authors",
                **{k: [] for k in ("seeds", "final", "up", "down")},
            },
        )
        n = len(res["rounds"]) * cell.clients
        row["seeds"].append(cell.seed)
        row["final"].append(100 * res["final_accuracy_mean"])
        row["up"].append(sum(r.get("bytes_up", 0) for r in res["rounds"]) / n / 1e6)
        row["down"].append(sum(r.get("bytes_down", 0) for r in res["rounds"]) / n / 1e6)
        for spec in preset.report.get("extras", []):
            value = extra_value(res, spec)
            if value is not None:  # a byte count: as MB a client and round, as the others
                value = value / n / 1e6 if "bytes" in spec else value
                row.setdefault(spec, []).append(value)
    return out


def paired(row: dict[str, Any], base: dict[str, Any]) -> list[float]:
    """The row's final accuracy minus its default's, seed by seed (common seeds)."""
    mine = dict(zip(row["seeds"], row["final"], strict=True))
    theirs = dict(zip(base["seeds"], base["final"], strict=True))
    return [mine[s] - theirs[s] for s in sorted(mine) if s in theirs]


def _ms(values: list[float], digits: int = 1) -> str:
    if not values:
        return ""
    sd = f" ± {np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else ""
    return f"{np.mean(values):.{digits}f}{sd}"


def table(preset: presets.Preset, data: dict[str, dict[str, Any]]) -> list[str]:
    extras = [e for e in preset.report.get("extras", []) if not e.startswith("total_bytes")]
    head = ["row", "seeds", "final acc (%)", "each seed", "Δ vs default (paired)"]
    head += ["MB up / client-round", "MB down / client-round"]
    head += [f"{e} (MB / client-round)" if "bytes" in e else e for e in extras]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, row in data.items():
        base = data.get(row["method"]) if label != row["method"] else None
        diff = paired(row, base) if base else []
        cells = [f"`{label}`", str(len(row["seeds"])), _ms(row["final"])]
        cells.append(" / ".join(f"{v:.1f}" for v in row["final"]))
        cells.append(("+" if np.mean(diff) >= 0 else "") + _ms(diff) if diff else "")
        cells += [f"{np.mean(row['up']):.4g}", f"{np.mean(row['down']):.4g}"]
        cells += [f"{np.mean(row[e]):.4g}" if row.get(e) else "" for e in extras]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(preset: presets.Preset, data: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(data)
    fig, (acc, up) = plt.subplots(
        1, 2, figsize=(11, 0.42 * len(labels) + 1.5), sharey=True, width_ratios=(3, 2)
    )
    y = np.arange(len(labels))[::-1]
    means = [np.mean(data[k]["final"]) for k in labels]
    sds = [np.std(data[k]["final"], ddof=1) if len(data[k]["final"]) > 1 else 0 for k in labels]
    colours = ["tab:blue" if data[k]["method"] == k else "tab:gray" for k in labels]
    colours = [
        "tab:orange" if data[k]["authors"] else c for k, c in zip(labels, colours, strict=True)
    ]
    acc.barh(y, means, xerr=sds, color=colours, alpha=0.8)
    for yi, k in zip(y, labels, strict=True):
        acc.plot(data[k]["final"], [yi] * len(data[k]["final"]), "k.", ms=4)
    acc.set_yticks(y, labels, fontsize=8)
    acc.set_xlabel("final mean client accuracy (%): mean ± std over seeds, dots: seeds")
    up.barh(y, [np.mean(data[k]["up"]) for k in labels], color=colours, alpha=0.8)
    up.set_xscale("log")
    up.set_xlabel("MB up a client and round (log)")
    fig.suptitle(f"{preset.name}: blue our default, orange the authors' profile", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ablation", description=__doc__)
    parser.add_argument("preset")
    parser.add_argument("--runs", type=Path, default=presets.RUNS)
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    preset = presets.load(args.preset)
    data = rows(preset, args.runs)
    if not data:
        print(f"no complete runs of {preset.name}: python -m benchmarks run {preset.name}")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"{preset.name}-ablation.png"
    plot(preset, data, png)
    text = [
        f"# {preset.name}: the ablation",
        "",
        preset.description,
        "",
        f"Made with `python -m benchmarks run {preset.name}` then "
        f"`python -m benchmarks.ablation {preset.name}` (generated: do not edit by hand). "
        "Final mean client accuracy after the last round; Δ: the row minus its method's "
        "default row (the method alone), seed by seed, mean ± std of those differences; "
        "MB: serialized fit payloads a client and round.",
        "",
        *table(preset, data),
        "",
        f"![ablation]({png.name})",
        "",
    ]
    (args.out / f"{preset.name}-ablation.md").write_text("\n".join(text))
    print(f"ablation: {args.out / f'{preset.name}-ablation.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
