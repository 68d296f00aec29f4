"""The scale-10k preset's cost against the number of clients (docs/PERFORMANCE.md):

    python -m benchmarks.scale_plot   # -> docs/results/scale-10k-cost.png

Seconds per client-round (each round's seconds over its replies, the median after
round 1, as the report's column) and the peak memory of the run's process tree,
one line per row, from the cells under outputs/benchmarks/scale-10k.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend
import numpy as np  # noqa: E402

from benchmarks.presets import REPO, RUNS  # noqa: E402

ROWS = {"fedper": "fedper", "feddecomp": "feddecomp", "fedper_10_": "fedper 10%",
        "feddecomp_10_": "feddecomp 10%"}  # fmt: skip
SETTINGS = {"100-clients": 100, "1000-clients": 1000, "10000-clients": 10000}


def points() -> dict[str, list[tuple[int, float, float]]]:
    """row -> [(clients, s/client-round, peak GB)] for the complete cells."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for setting, clients in SETTINGS.items():
        for slug, label in ROWS.items():
            cell = RUNS / "scale-10k" / setting / f"{slug}-seed0"
            status = cell / "cell.json"
            if not (cell / "results.json").exists() or not status.exists():
                continue
            if not json.loads(status.read_text()).get("ok"):
                continue
            rounds = json.loads((cell / "results.json").read_text())["rounds"]
            per = np.median([r["seconds"] / max(r.get("replies", 1), 1) for r in rounds[1:]])
            peak = json.loads(status.read_text())["peak_rss"] / 1e9
            out.setdefault(label, []).append((clients, float(per), peak))
    return out


def main() -> None:
    data = points()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, pts in data.items():
        xs = [p[0] for p in pts]
        ax1.plot(xs, [p[1] for p in pts], marker="o", label=label)
        ax2.plot(xs, [p[2] for p in pts], marker="o", label=label)
    for ax, title in ((ax1, "seconds per client-round"), (ax2, "peak memory (GB, process tree)")):
        ax.set_xscale("log")
        ax.set_xlabel("simulated clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(0, 12.5)
    ax2.axhline(12, color="grey", linestyle="--", linewidth=1)
    ax1.legend()
    fig.suptitle("scale-10k: Flower's Ray simulation, 2 cores (python -m benchmarks run scale-10k)")
    fig.tight_layout()
    path = REPO / "docs" / "results" / "scale-10k-cost.png"
    fig.savefig(path, dpi=110)
    print(path)


if __name__ == "__main__":
    main()
