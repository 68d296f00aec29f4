"""An interrupted run goes on from the server's checkpoint with every simulated
client's personal state as it was at that round (#36): the per-round store, the
benchmark runner's resume, and an interrupted cell against an uninterrupted one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from benchmarks import presets, runner
from benchmarks.__main__ import main
from client_app.state import RoundStore
from pflower.store import PERSONAL_STATE_DIR
from strategies.checkpoint import SERVER_STATE, clear_stale_personal_state

ROOT = Path(__file__).resolve().parents[1]


def _state(value: float) -> dict[str, np.ndarray]:
    return {"head.weight": np.full((2, 3), value, dtype=np.float32)}


def test_a_client_keeps_its_state_as_of_the_servers_last_checkpoint(tmp_path) -> None:
    store = RoundStore(tmp_path / "run" / PERSONAL_STATE_DIR, "client/0")
    assert store.load() is None
    store.save(_state(1), server_round=1, checkpointed=0)
    store.save(_state(2), server_round=2, checkpointed=1)
    store.save(_state(3), server_round=3, checkpointed=2)
    # round 3 trained before the server's checkpoint of round 3: 2's is kept beside it
    assert sorted(p.name for p in store.dir.iterdir()) == ["r2.npz", "r3.npz"]
    assert store.load()["head.weight"][0, 0] == 3  # the newest
    assert store.load(upto=2)["head.weight"][0, 0] == 2  # a fit of round 3, again
    assert store.load(upto=1) is None  # nothing that old is kept
    # checkpoint-every 2: the checkpoint of round 2 stays while rounds 3 and 4 train
    store.save(_state(4), server_round=4, checkpointed=2)
    assert sorted(p.name for p in store.dir.iterdir()) == ["r2.npz", "r4.npz"]
    # a run resumed from this one, under another name, reads it until it saves its own
    other = RoundStore(tmp_path / "other" / PERSONAL_STATE_DIR, "client/0", store.dir.parent)
    assert other.load(upto=2)["head.weight"][0, 0] == 2
    other.save(_state(5), server_round=3, checkpointed=2)
    assert other.load(upto=2) is None and other.load()["head.weight"][0, 0] == 5
    assert sorted(p.name for p in store.dir.iterdir()) == ["r2.npz", "r4.npz"]  # untouched


def test_a_client_keeps_its_state_as_of_the_checkpoint_being_written_too(tmp_path) -> None:
    """While the server writes round 3's checkpoint (round 4 running), a resumed run
    may start from round 2's or round 3's: the client keeps its state as of each."""
    store = RoundStore(tmp_path / "run" / PERSONAL_STATE_DIR, "client/0")
    for r in (1, 2, 3):
        store.save(_state(r), server_round=r, checkpointed=r - 1, writing=None)
    store.save(_state(4), server_round=4, checkpointed=2, writing=3)
    assert sorted(p.name for p in store.dir.iterdir()) == ["r2.npz", "r3.npz", "r4.npz"]
    assert store.load(upto=3)["head.weight"][0, 0] == 3
    assert store.load(upto=2)["head.weight"][0, 0] == 2
    store.save(_state(5), server_round=5, checkpointed=3, writing=4)  # 2's is let go
    assert sorted(p.name for p in store.dir.iterdir()) == ["r3.npz", "r4.npz", "r5.npz"]


def test_a_fresh_run_does_not_read_what_an_earlier_run_of_its_name_left(tmp_path) -> None:
    run_dir = tmp_path / "runs" / "exp"
    left = run_dir / PERSONAL_STATE_DIR / "client-0"
    left.mkdir(parents=True)
    (left / "r7.npz").write_bytes(b"x")
    clear_stale_personal_state(run_dir, resume_from=str(run_dir))  # resumes from it: kept
    assert left.exists()
    clear_stale_personal_state(run_dir, resume_from=str(tmp_path / "runs" / "another"))
    assert not (run_dir / PERSONAL_STATE_DIR).exists()


def test_resuming_a_run_that_kept_its_state_in_memory_says_the_state_is_gone(
    tmp_path, caplog
) -> None:
    from client_app.app import simulation_store
    from client_app.state import ContextStore
    from methods import parse_run_config
    from tests.helpers import make_client

    old = tmp_path / "old"
    old.mkdir()
    cfg = parse_run_config(
        {"method": "fedper", "personal-state": "memory", "resume-from": str(old), "seed": 11}
    )
    client, context = make_client(cfg, 0, 2)
    nbytes = type(client).personal_bytes(client.model, client.roles, client.wire)
    assert nbytes > 0  # fedper's head
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        store = simulation_store(cfg, context, client.client_key, nbytes, 2)
    assert isinstance(store, ContextStore)
    assert "personal parts start afresh" in caplog.text
    # with the state on disk there, the run reads it
    (old / PERSONAL_STATE_DIR).mkdir()
    store = simulation_store(cfg, context, client.client_key, nbytes, 2)
    assert isinstance(store, RoundStore) and store.fallback is not None


PRESET = """
description = "FedPer, resumed"
methods = ["fedper"]
clients = 3
rounds = 4
[config]
dataset = "synthetic"
sim-samples = 80
hidden-dim = 16
"""

# the cell's own process, stopped dead in round 3 once two clients have trained and
# saved their state (the server's checkpoint is of round 2, its record of round 1)
CRASH = """
import os, sys
import client_app.base as base
from benchmarks import runner

saved = base.PFLClient.store_personal
calls = []

def store_then_die(self, config=None):
    saved(self, config)
    if (config or {}).get("server-round") == 3:
        calls.append(self.client_key)
        if len(calls) == 2:
            os._exit(3)

base.PFLClient.store_personal = store_then_die
runner.run_cell_here(sys.argv[1])
"""


@pytest.mark.slow
def test_an_interrupted_cell_resumes_from_its_checkpoint_with_its_personal_state(
    tmp_path, capsys
) -> None:
    path = tmp_path / "resumed.toml"
    path.write_text(PRESET)
    preset = presets.load(str(path))

    # the same cell, once straight through
    assert main(["run", str(path), "--out", str(tmp_path / "straight")]) == 0
    (straight_cell,) = preset.cells(runs=tmp_path / "straight" / "runs")
    straight = json.loads((straight_cell.dir / "results.json").read_text())

    out = tmp_path / "resumed"  # runs in out/runs, the report beside them
    (cell,) = preset.cells(runs=out / "runs")
    cell.dir.mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASH), runner.cell_spec(cell)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    partial = json.loads((cell.dir / "results.json").read_text())
    assert [r["round"] for r in partial["rounds"]] == [1]  # round 2's is scored by 3's fits
    assert runner.resume_point(cell) == 2
    ahead = sorted(cell.dir.glob(f"{PERSONAL_STATE_DIR}/*/r3.npz"))
    assert len(ahead) >= 2  # clients that trained past the checkpoint before the stop

    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out)]) == 0
    assert "from its checkpoint of round 2" in capsys.readouterr().out
    resumed = json.loads((cell.dir / "results.json").read_text())
    assert resumed["resumed_from"]["round"] == 2
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    assert resumed["rounds"][1].get("scored_after_resume") is True
    # every round's every client, exactly as the uninterrupted run: the clients that
    # had trained round 3 started it again from their state of round 2
    for a, b in zip(straight["rounds"], resumed["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"], a["round"]
    with (
        np.load(straight_cell.dir / SERVER_STATE) as x,
        np.load(cell.dir / SERVER_STATE) as y,
    ):
        for name in x.files:
            np.testing.assert_array_equal(x[name], y[name])
    # complete now: another run of the preset reuses it
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out)]) == 0
    assert "complete, reused" in capsys.readouterr().out
