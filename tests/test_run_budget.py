"""``max-minutes`` (a run that stops cleanly after a round and resumes from its
checkpoint), the runner's ``--max-minutes`` and a GPU preset's estimated device
time, at toy scale on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import presets, runner
from benchmarks.__main__ import main
from pflower.engine.inprocess import run_inprocess
from strategies.checkpoint import SERVER_STATE, load_server_state

STUDY = {"method": "fedper", "sim-samples": 60, "hidden-dim": 16, "personal-state": "disk"}


def test_max_minutes_stops_after_a_round_and_the_resumed_run_matches_a_straight_one(
    tmp_path: Path,
) -> None:
    straight = run_inprocess(
        {**STUDY, "num-server-rounds": 3, "output-dir": str(tmp_path), "run-name": "straight"}, 3
    )
    stopped = run_inprocess(
        {
            **STUDY,
            "num-server-rounds": 3,
            "max-minutes": 1e-6,  # spent before round 1 ends: it is the last
            "output-dir": str(tmp_path),
            "run-name": "stopped",
        },
        3,
    )
    assert [r["round"] for r in stopped["rounds"]] == [1]  # scored by the closing evaluation
    assert stopped["stopped"] == {"reason": "max-minutes=1e-06", "after_round": 1, "of_rounds": 3}
    assert stopped["outcome"]["status"] != "failed"
    done, _ = load_server_state(tmp_path / "stopped" / SERVER_STATE, "fedper")
    assert done == 1
    resumed = run_inprocess(
        {
            **STUDY,
            "num-server-rounds": 2,
            "resume-from": str(tmp_path / "stopped"),
            "output-dir": str(tmp_path),
            "run-name": "resumed",
        },
        3,
    )
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3]
    for a, b in zip(straight["rounds"], resumed["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"], a["round"]


def test_a_budget_not_spent_changes_nothing(tmp_path: Path) -> None:
    res = run_inprocess(
        {
            **STUDY,
            "num-server-rounds": 2,
            "max-minutes": 60.0,
            "output-dir": str(tmp_path),
            "run-name": "long-budget",
        },
        2,
    )
    assert [r["round"] for r in res["rounds"]] == [1, 2] and "stopped" not in res


TOY = """
description = "a toy GPU preset"
gpu = true
methods = ["fedper"]
clients = 3
rounds = 3
[config]
dataset = "{data}"
partitioner = "dirichlet-client"
alpha = 0.5
train-per-client = 20
test-per-client = 6
model = "cnn4"
local-epochs = 2
batch-size = 10
"""


@pytest.fixture()
def toy(tmp_path: Path) -> Path:
    data = presets.subset_parquet(200, seed=0, out_dir=tmp_path / "data")
    path = tmp_path / "toy-gpu.toml"
    path.write_text(TOY.replace("{data}", data))
    return path


def test_the_work_is_counted_from_the_partitions(toy: Path) -> None:
    (cell,) = presets.load(str(toy)).cells(runs=toy.parent / "runs")
    work = runner.cell_work(cell)
    assert work.trained == 3 * 3 * 2 * 20  # rounds x clients x epochs x images
    assert work.scored == 3 * 3 * 6
    assert runner.measure_rate(cell.config, seconds=0.2) > 0


def test_a_gpu_preset_prints_its_estimated_device_time_first(toy: Path, capsys) -> None:
    out = toy.parent / "out"
    assert main(["run", str(toy), "--out", str(out), "--estimate"]) == 0
    text = capsys.readouterr().out
    assert "estimated device time:" in text and "for 1 cell(s) left" in text
    assert "fedper on cnn4 at batch 10:" in text and "img/s" in text
    assert not (out / "runs").exists() or not list((out / "runs").rglob("results.json"))


@pytest.mark.slow
def test_the_runner_stops_at_max_minutes_and_the_same_command_goes_on(toy: Path, capsys) -> None:
    out = toy.parent / "out"
    code = main(["run", str(toy), "--out", str(out), "--max-minutes", "0.00001"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "each cell stops cleanly after the round that passes it" in text  # the estimate
    assert "stopped by max-minutes" in text and "after round 1 of 3" in text
    (cell,) = presets.load(str(toy)).cells(runs=out / "runs")
    partial = json.loads((cell.dir / "results.json").read_text())
    assert [r["round"] for r in partial["rounds"]] == [1]
    assert main(["run", str(toy), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "estimated device time" in text and "from its checkpoint of round 1" in text
    done = json.loads((cell.dir / "results.json").read_text())
    assert [r["round"] for r in done["rounds"]] == [1, 2, 3]
    assert main(["run", str(toy), "--out", str(out)]) == 0
    assert "complete, reused" in capsys.readouterr().out
    # the ablation's table and plot from the same runs (one row: no default to pair with)
    assert main(["ablation", str(toy), "--runs", str(out / "runs"), "--out", str(out)]) == 0
    text = (out / "toy-gpu-ablation.md").read_text()
    assert "| `fedper` | 1 |" in text and (out / "toy-gpu-ablation.png").stat().st_size > 0
