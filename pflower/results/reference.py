"""The committed figures on the main job's data (FedFac (static)'s, FedAvg's and
Local's, over the same seeds), for a run on that same data: its summary prints them
beside its own final figure, saying which is which, and its plot draws the other
methods' committed curves (mean, and the range over their seeds) beside its own. A
newcomer's first result says what collaboration bought, beside what training alone
and one global model reach, and where this one seed falls among the committed ones
(docs/main_job.md).

``reference.json`` beside this file is written by ``python -m benchmarks reference``
from the main-job-candidates runs; a run matches a setting when every data key,
the model and the federation size are the same (the summary's figures: and the round
count; the plot's curves: up to the run's last round).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

REFERENCE_FILE = Path(__file__).with_name("reference.json")


@cache
def _settings() -> list[dict[str, Any]]:
    try:
        return list(json.loads(REFERENCE_FILE.read_text())["settings"])
    except (OSError, ValueError, KeyError):
        return []


def _matching(config: dict[str, Any], clients: int) -> dict[str, Any] | None:
    """The committed setting on this run's data and federation, if there is one."""
    for setting in _settings():
        if setting["clients"] != clients:
            continue
        if any(config.get(k) != v for k, v in setting["match"].items()):
            continue
        return setting
    return None


def _seeds(row: dict[str, Any]) -> str:
    return ", ".join(sorted(row["seeds"], key=int))


def reference_rows(
    config: dict[str, Any], clients: int, rounds: int, method: str, final: float | None = None
) -> list[tuple[str, str]]:
    """(label, value) rows for the summary: this run's final figure (``final``) and
    its method's committed one over its seeds, then the other methods' committed
    figures; none if the run is on other data, another federation or budget."""
    setting = _matching(config, clients)
    if setting is None or setting["rounds"] != rounds:
        return []
    rows: list[tuple[str, str]] = []
    mine = setting["rows"].get(method)
    label = mine.get("label", method) if mine else method
    if final is not None:
        rows.append((f"{label}, this run (seed {config.get('seed', 0)})", f"{final:.4f}"))
    ordered = sorted(setting["rows"].items(), key=lambda item: item[0] != method)
    for name, row in ordered:
        rows.append(
            (
                f"{row.get('label', name)}, same data (committed, seeds {_seeds(row)})",
                f"{row['mean']:.4f} ± {row['std']:.4f}",
            )
        )
    return rows


def reference_curves(
    config: dict[str, Any], clients: int, rounds: int, method: str
) -> list[tuple[str, list[list[float]]]]:
    """(label, each seed's accuracy per round, up to ``rounds``) of every committed
    method but the run's own, on this run's data and federation; none elsewhere or
    past the committed rounds."""
    setting = _matching(config, clients)
    if setting is None or not 0 < rounds <= setting["rounds"]:
        return []
    out = []
    for name, row in setting["rows"].items():
        if name == method or "curves" not in row:
            continue
        curves = [row["curves"][seed][:rounds] for seed in sorted(row["curves"], key=int)]
        out.append((f"{row.get('label', name)} (committed, seeds {_seeds(row)})", curves))
    return out
