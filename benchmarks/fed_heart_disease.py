"""The Fed-Heart-Disease report: per-hospital test accuracy and AUC of every row of
the ``fed-heart-disease`` preset, each a mean over seeds with its 95% interval,
FLamby's and FL4Health's published figures beside them.

    python -m benchmarks run fed-heart-disease      # the runs (5 seeds)
    python -m benchmarks.fed_heart_disease [--runs outputs/benchmarks/fed-heart-disease]
        [--out docs/results]

Accuracy is the final round's, per centre on its own fixed test set (FLamby's split),
and the "mean" column is the mean over the four centres (FLamby's metric). Intervals
are Student-t over seeds, clipped to [0, 100] (marked when clipped); with every seed
equal the interval is a point, and the table says so rather than claim certainty.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pflower.data.fed_heart_disease import CENTRES, HOSPITALS

TEST_SIZES = {"cleveland": 104, "hungarian": 89, "switzerland": 16, "va": 45}
# published means over the four centres (FLamby's raw benchmark results, heart_seed42-46.csv,
# 5 seeds: FedAvg, FedProx and Scaffold ran SGD at 1e-3, the rate their rows record; FL4Health's
# unofficial figures on the same test sets)
PUBLISHED = (
    ("FLamby Pooled (one model on all data)", 73.5),
    ("FLamby Local (Cleveland's model)", 72.2),
    ("FLamby FedAvg", 68.5),
    ("FLamby FedProx", 68.5),
    ("FLamby Scaffold", 68.4),
    ("FLamby Cyclic", 71.8),
    ("FLamby FedAdam", 72.6),
    ("FLamby FedYogi", 73.1),
    ("FLamby FedAdagrad", 73.1),
    ("FL4Health FENDA", 79.8),
    ("FL4Health PerFCL", 80.5),
    ("FL4Health FedPer", 70.9),
    ("FL4Health MOON", 72.1),
)
FLAMBY_BEST = 73.1
FL4HEALTH_BEST = 80.5


def interval(values: list[float]) -> tuple[float, str]:
    """(mean, its 95% interval over seeds as report.interval_text writes it) in %."""
    from benchmarks.report import interval_text

    return float(np.mean(values)), interval_text(values)


def load_row(folder: Path, slug: str) -> list[dict[str, Any]]:
    """Every seed's final round of one row (results.json files that ran all rounds)."""
    out = []
    for path in sorted(folder.glob(f"{slug}-seed*/results.json")):
        res = json.loads(path.read_text())
        rounds = res.get("rounds", [])
        # a resumed run's config counts the rounds left, its record every round
        if rounds and int(rounds[-1]["round"]) >= int(res["config"]["num-server-rounds"]):
            out.append(rounds[-1])
    return out


def row_cells(finals: list[dict[str, Any]]) -> dict[str, Any]:
    """Per centre and mean over centres: accuracy (%) and AUC, each over seeds."""
    cells: dict[str, Any] = {}
    for i, (centre, _) in enumerate(CENTRES):
        # a site is named by its centre (pflower/data/sites.py); runs before that, client-i
        at = [f["per_client_accuracy"] for f in finals]
        cells[centre] = interval(
            [100 * (a[centre] if centre in a else a[f"client-{i}"]) for a in at]
        )
    cells["mean"] = interval(
        [100 * np.mean(list(f["per_client_accuracy"].values())) for f in finals]
    )
    aucs = [np.mean(list(f["per_client_auc"].values())) for f in finals if f.get("per_client_auc")]
    cells["auc"] = interval([100 * a for a in aucs]) if aucs else None
    cells["seeds"] = len(finals)
    return cells


def table(
    runs: Path, setting: str, rows: list[str], backbone: dict[str, str] | None = None
) -> tuple[list[str], dict[str, float]]:
    """Markdown lines of one setting, and each row's mean accuracy; ``backbone``
    names the model a row runs on where it is not the setting's."""
    head = " | ".join(f"{HOSPITALS[c]} (n={TEST_SIZES[c]})" for c, _ in CENTRES)
    lines = [
        f"| row | seeds | {head} | mean of the centres | AUC, mean of the centres |",
        "|---|---|---|---|---|---|---|---|",
    ]
    means, absent = {}, []
    for label in rows:
        finals = load_row(runs / setting, label.replace(" ", "_"))
        if not finals:
            absent.append(f"`{label}`")
            continue
        c = row_cells(finals)
        means[label] = c["mean"][0]
        label = label + (f" (on {backbone[label]})" if backbone and label in backbone else "")
        parts = [f"{c[centre][0]:.1f} {c[centre][1]}" for centre, _ in CENTRES]
        auc = f"{c['auc'][0]:.1f} {c['auc'][1]}" if c["auc"] else ""
        lines.append(
            f"| `{label}` | {c['seeds']} | " + " | ".join(parts) + f" | **{c['mean'][0]:.1f}** "
            f"{c['mean'][1]} | {auc} |"
        )
    if absent:
        lines += ["", f"Not run in this setting: {', '.join(absent)}."]
    return lines, means


def plot(means: dict[str, dict[str, float]], path: Path) -> None:
    """Each row's mean accuracy per setting, FLamby's and FL4Health's best beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({r for m in means.values() for r in m})
    fig, ax = plt.subplots(figsize=(9.5, 0.3 * len(labels) + 1.6))
    y = np.arange(len(labels))
    width = 0.8 / max(len(means), 1)
    for k, (setting, m) in enumerate(means.items()):
        ax.barh(y + width * k, [m.get(r, 0.0) for r in labels], width, label=setting)
    ax.axvline(FLAMBY_BEST, color="k", ls="--", lw=1, label=f"FLamby best ({FLAMBY_BEST})")
    ax.axvline(FL4HEALTH_BEST, color="r", ls=":", lw=1, label=f"FL4Health best ({FL4HEALTH_BEST})")
    ax.set_yticks(y + 0.4 - width / 2, labels, fontsize=8)
    ax.set_xlim(40, 90)
    ax.set_xlabel("mean of the four centres' test accuracy (%), 5 seeds")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(runs: Path, out: Path) -> Path:
    from benchmarks import presets

    preset = presets.load("fed-heart-disease")
    rows = [label for label, _, _ in preset.rows()]
    text = [
        "# Fed-Heart-Disease: four hospitals, FLamby's split",
        "",
        preset.description.replace("\n", " "),
        "",
        "Made with `python -m benchmarks run fed-heart-disease` then "
        "`python -m benchmarks.fed_heart_disease`. Generated by "
        "benchmarks/fed_heart_disease.py: do not edit by hand.",
        "",
        (__doc__ or "").split("\n\n")[2].replace("\n", " "),
    ]
    means: dict[str, dict[str, float]] = {}
    for setting, keys in preset.settings.items():
        own = {
            label: preset.method_config[m]["model"]
            for label, m, _ in preset.rows()
            if preset.method_config.get(m, {}).get("model", keys.get("model")) != keys.get("model")
        }
        lines, means[setting] = table(runs, setting, rows, own)
        text += ["", f"## {setting}", "", *lines]
    text += [
        "",
        "## Published (mean of the four centres' test accuracy, %)",
        "",
        "| source | mean of the centres |",
        "|---|---|",
        *(f"| {name} | {value:.1f} |" for name, value in PUBLISHED),
        "",
        "![fed-heart-disease](fed-heart-disease.png)",
    ]
    out.mkdir(parents=True, exist_ok=True)
    plot(means, out / "fed-heart-disease.png")
    path = out / "fed-heart-disease-table.md"
    path.write_text("\n".join(text) + "\n")
    return path


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fed_heart_disease")
    parser.add_argument("--runs", type=Path, default=Path("outputs/benchmarks/fed-heart-disease"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args(argv)
    print(report(args.runs, args.out))


if __name__ == "__main__":
    main(sys.argv[1:])
