"""The comparison harness: grid, report, plots, resume and crash isolation."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.harness import (
    PRESETS,
    Cell,
    Setting,
    _merge_manifests,
    is_complete,
    make_cells,
    run_preset,
    summarize,
    write_report,
)


def _fake_results(path: Path, config: dict, accs: list[float], bytes_per_round: int) -> None:
    rounds = [
        {
            "round": i + 1,
            "accuracy_mean": a,
            "accuracy_pooled": a - 0.01,
            "bytes_up": bytes_per_round,
            "bytes_down": bytes_per_round,
            "seconds": 1.0 + i,
        }
        for i, a in enumerate(accs)
    ]
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(
        json.dumps(
            {
                "method": config["method"],
                "config": config,
                "rounds": rounds,
                "best_accuracy_mean": max(accs),
                "final_accuracy_mean": accs[-1],
                "final_accuracy_pooled": accs[-1] - 0.01,
                "total_bytes_up": bytes_per_round * len(accs),
                "total_bytes_down": bytes_per_round * len(accs),
                "total_seconds": 10.0,
            }
        )
    )


def test_summary_is_mean_and_sample_std_over_seeds(tmp_path):
    preset = PRESETS["tiny"]
    cells = make_cells(preset, ["fedavg"], [0, 1], 3, tmp_path)
    _fake_results(cells[0].dir, cells[0].config, [0.5, 0.7, 0.6], 1000)
    _fake_results(cells[1].dir, cells[1].config, [0.6, 0.9, 0.8], 1000)
    (row,) = summarize(cells[0].dir.parent, ["fedavg"], [0, 1])
    assert row["n"] == 2
    assert row["best"][0] == pytest.approx(0.8)
    assert row["best"][1] == pytest.approx(0.1414213, rel=1e-5)  # sample std of 0.7, 0.9
    assert row["final"][0] == pytest.approx(0.7)
    assert row["bytes"][0] == pytest.approx(6000)
    assert row["per_round"][0] == pytest.approx(2.5)  # median of rounds 2..3 (2 s, 3 s)
    assert list(row["cum_bytes"]) == [2000, 4000, 6000]


def test_complete_needs_every_round_and_the_same_config(tmp_path):
    cell = make_cells(PRESETS["tiny"], ["fedavg"], [0], 3, tmp_path)[0]
    assert not is_complete(cell)
    _fake_results(cell.dir, cell.config, [0.5, 0.6], 10)  # 2 of 3 rounds
    assert not is_complete(cell)
    _fake_results(cell.dir, cell.config, [0.5, 0.6, 0.7], 10)
    assert is_complete(cell)
    changed: Cell = make_cells(PRESETS["tiny"], ["fedavg"], [0], 3, tmp_path)[0]
    changed.config["lr"] = 0.123  # a changed preset must rerun the cell
    assert not is_complete(changed)


def test_a_partial_run_adds_to_the_report_grid():
    old = {
        "commands": ["a"],
        "methods": ["fedavg", "local"],
        "seeds": [1],
        "settings": [{"name": "s1"}, {"name": "s2"}],
    }
    new = {"commands": ["b"], "methods": ["fedrep"], "seeds": [0], "settings": [{"name": "s1"}]}
    merged = _merge_manifests(old, new)
    assert merged["commands"] == ["a", "b"]
    assert merged["methods"] == ["fedavg", "local", "fedrep"]
    assert merged["seeds"] == [0, 1]
    assert [s["name"] for s in merged["settings"]] == ["s1", "s2"]


@pytest.mark.slow
def test_tiny_grid_runs_reports_resumes_and_isolates_a_crash(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "docs"
    preset = PRESETS["tiny"]
    methods = ["fedavg", "local"]

    done = run_preset(preset, methods, [0], 2, runs, out, "cmd-1")
    assert sorted(done["ran"]) == ["sim-3c / fedavg / seed 0", "sim-3c / local / seed 0"]
    assert done["failed"] == []
    cells = make_cells(preset, methods, [0], 2, runs)
    for cell in cells:
        res = json.loads((cell.dir / "results.json").read_text())
        assert len(res["rounds"]) == 2
        assert res["config"]["seed"] == 0 and res["config"]["method"] in methods
    fedavg, local = (json.loads((c.dir / "results.json").read_text()) for c in cells)
    assert fedavg["total_bytes_up"] > 0 and local["total_bytes_up"] == 0  # nothing leaves
    report = (out / "RESULTS.md").read_text()
    assert "cmd-1" in report
    assert "| fedavg | 1 |" in report and "| local | 1 |" in report
    plot = out / "results" / "tiny-sim-3c.png"
    assert plot.stat().st_size > 10_000
    mtimes = {c.label: os.stat(c.dir / "results.json").st_mtime_ns for c in cells}

    # rerun: nothing runs again, the files are untouched, the report is rewritten
    done = run_preset(preset, methods, [0], 2, runs, out, "cmd-2")
    assert done["ran"] == [] and len(done["skipped"]) == 2
    assert {c.label: os.stat(c.dir / "results.json").st_mtime_ns for c in cells} == mtimes
    assert "cmd-2" in (out / "RESULTS.md").read_text()

    # a crashing cell (invalid config) fails alone; the finished cells stay and are skipped
    bad = Setting("bad", 3, {"alpha": -1.0})
    crashy = replace(preset, settings=(*preset.settings, bad))
    done = run_preset(crashy, ["fedavg"], [0], 2, runs, out, "cmd-3")
    assert done["skipped"] == ["sim-3c / fedavg / seed 0"]
    assert done["failed"] == ["bad / fedavg / seed 0"]
    report = (out / "RESULTS.md").read_text()
    assert "failed: exit code" in report and "alpha" in report
    assert "| fedavg | 1 |" in report
    assert {c.label: os.stat(c.dir / "results.json").st_mtime_ns for c in cells} == mtimes
    assert write_report(runs, out) == out / "RESULTS.md"
