"""The baselines' figures on the main job's data (FedAvg's and Local's, labelled
in the committed table), for the summary of a run on that same data: a
newcomer's first result says what collaboration bought, beside what training
alone and one global model reach (docs/main_job.md).

``reference.json`` beside this file is written by ``python -m benchmarks.reference``
from the main-job-candidates runs; a run matches a setting when every data key,
the model, the federation size and the round count are the same.
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


def reference_rows(
    config: dict[str, Any], clients: int, rounds: int, method: str
) -> list[tuple[str, str]]:
    """(label, value) rows for the summary: the committed FedAvg and Local figures
    of this run's setting, or none if the run is on other data or another budget."""
    for setting in _settings():
        keys = setting["match"]
        if setting["clients"] != clients or setting["rounds"] != rounds:
            continue
        if any(config.get(k) != v for k, v in keys.items()):
            continue
        rows = []
        for name, row in setting["rows"].items():
            if name == method:
                continue
            seeds = len(row["seeds"])
            rows.append(
                (
                    f"{row.get('label', name)}, same data (committed, {seeds} seeds)",
                    f"{row['mean']:.4f} ± {row['std']:.4f} final mean over clients",
                )
            )
        return rows
    return []
