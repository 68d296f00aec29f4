"""#93: a deployment that comes back by itself: a SuperNode restarted right after a
crash asks the SuperLink again until it takes it back (``activation-retry``), a run
started again by the same command goes on from its own last checkpoint
(``resume-from="latest"``), and ``deploy.supervise`` submits it again after a
SuperLink or ServerApp crash. (The crashes themselves, in a real deployment: the
soak, tests/test_soak.py.)"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest

import pflower.patches
from deploy.supervise import Supervisor, parse_args
from pflower.config.schema import ConfigError
from pflower.engine.inprocess import run_inprocess
from pflower.patches.activation import ACTIVATION_WAIT, WAIT_CAP, retrying
from strategies.checkpoint import SERVER_STATE, save_server_state

SMALL = {"method": "fedper", "sim-samples": 60, "hidden-dim": 16, "sim-dim": 20}


# ---- a SuperNode restarted right after a crash ---------------------------------------------


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def _refused(err: BaseException) -> bool:
    return isinstance(err, Refused) and err.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_refused_activation_is_asked_again_with_a_bounded_backoff() -> None:
    """Refused while the SuperLink holds the crashed session (60 s here), then taken
    back: the waits double from 1 s and never exceed 10 s."""
    clock, waits = [0.0], []

    def pause(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    def activate() -> int:
        if clock[0] < 60:
            raise Refused()
        return 7

    call = retrying(activate, _refused, pause=pause, clock=lambda: clock[0])
    assert call() == 7
    assert waits[:4] == [1, 2, 4, 8] and set(waits[4:]) == {WAIT_CAP}
    assert 60 <= sum(waits) < 60 + WAIT_CAP


def test_a_refusal_that_lasts_ends_as_flower_ends_it_and_other_errors_at_once() -> None:
    clock = [0.0]

    def pause(seconds: float) -> None:
        clock[0] += seconds

    def never() -> int:
        raise Refused()

    with pytest.raises(Refused):  # a key never registered: the same answer, for good
        retrying(never, _refused, pause=pause, clock=lambda: clock[0])()
    assert ACTIVATION_WAIT - WAIT_CAP <= clock[0] <= ACTIVATION_WAIT

    tries = []

    def unavailable() -> int:
        tries.append(1)
        raise Refused(grpc.StatusCode.UNAUTHENTICATED)

    with pytest.raises(Refused):  # not a refusal to activate: Flower's to handle
        retrying(unavailable, _refused, pause=pause)()
    assert len(tries) == 1


def test_the_patch_wraps_the_fleet_clients_activation() -> None:
    from pflower.flower_lines import fleet_over_http

    pflower.patches.activation_retry()
    pflower.patches.activation_retry()  # once is enough: not wrapped twice
    if fleet_over_http():
        from flwr.supernode.fleet_http_client import FleetHttpClient

        assert FleetHttpClient.ActivateNode.pflower_retrying
        return
    from flwr.client.grpc_rere_client import connection

    assert connection.wrap_stub.pflower_retrying

    class Stub:
        def ActivateNode(self, request: Any) -> str:
            return "activated"

    stub = Stub()
    connection.wrap_stub(stub, argparse.Namespace(invoke=lambda f, *a, **k: f(*a, **k)))
    assert stub.ActivateNode(None) == "activated"


# ---- resume-from="latest" --------------------------------------------------------------------


def test_resume_from_latest_goes_on_from_the_runs_own_checkpoint(tmp_path: Path) -> None:
    """The same command twice: stopped after 2 of 4 rounds (a crash), then given
    again, the run trains rounds 3-4 only and ends where 4 uninterrupted rounds end."""
    cfg = {**SMALL, "output-dir": str(tmp_path / "a"), "run-name": "r", "personal-state": "disk"}
    cfg["resume-from"] = "latest"
    first = run_inprocess({**cfg, "num-server-rounds": 2}, 3)  # no checkpoint yet: round 1
    assert [r["round"] for r in first["rounds"]] == [1, 2]
    resumed = run_inprocess({**cfg, "num-server-rounds": 4}, 3)
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4]
    assert resumed["config"]["num-server-rounds"] == 2  # the rounds it ran
    whole = run_inprocess({**cfg, "output-dir": str(tmp_path / "b"), "num-server-rounds": 4}, 3)
    for mine, theirs in zip(resumed["rounds"], whole["rounds"]):
        assert mine["per_client_accuracy"] == theirs["per_client_accuracy"], mine["round"]


def test_resume_from_latest_needs_a_run_name_and_a_finished_run_runs_nothing(
    tmp_path: Path,
) -> None:
    from flwr.common import Context, RecordDict

    from server_app.app import build_server
    from strategies.checkpoint import RunComplete

    context = Context(0, 0, {}, RecordDict(), {})
    with pytest.raises(ConfigError, match="'resume-from': 'latest' .* give run-name"):
        build_server(context, {**SMALL, "output-dir": str(tmp_path), "resume-from": "latest"})
    run_dir = tmp_path / "done"
    save_server_state(run_dir, "fedper", 5, {})
    assert (run_dir / SERVER_STATE).exists()
    cfg = {**SMALL, "output-dir": str(tmp_path), "run-name": "done", "resume-from": "latest"}
    with pytest.raises(RunComplete, match="holds round 5 of 5"):
        build_server(context, {**cfg, "num-server-rounds": 5})


# ---- deploy.supervise ------------------------------------------------------------------------


class FakeFlwr:
    """The flwr CLI as the supervisor sees it: each submitted run ends with the next
    scripted status, having moved the run's checkpoint to the scripted round."""

    def __init__(self, run_dir: Path, script: list[tuple[str, int]], down: int = 0) -> None:
        self.run_dir, self.script, self.down = run_dir, list(script), down
        self.calls: list[tuple[str, ...]] = []
        self.submitted: list[dict[str, Any]] = []
        self.ends: dict[int, str] = {}
        self.details = "No heartbeat received from the task"  # Flower's, for a crash

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        if self.down:  # the SuperLink does not answer (yet)
            self.down -= 1
            return subprocess.CompletedProcess(args, 1, "", "connection refused")
        if args[0] == "run":
            import tomllib

            config = Path(args[args.index("--run-config") + 1])
            self.submitted.append(tomllib.loads(config.read_text()))
            run_id = len(self.submitted)
            status, checkpoint = self.script.pop(0)
            self.ends[run_id] = status
            save_server_state(self.run_dir, "fedper", checkpoint, {})
            out = {"success": True, "run-id": run_id}
        else:
            run_id = int(args[args.index("--run-id") + 1])
            details = self.details if self.ends[run_id] == "finished:failed" else "N/A"
            out = {
                "success": True,
                "runs": [{"status": self.ends[run_id], "status-details": details}],
            }
        return subprocess.CompletedProcess(args, 0, json.dumps(out), "")


def _supervisor(tmp_path: Path, fake: FakeFlwr, *extra: str) -> Supervisor:
    args = parse_args(
        [
            ".",
            "fed",
            "--run-config",
            f"method='fedper' run-name='r' output-dir='{tmp_path}' num-server-rounds=10",
            "--poll=0",
            f"--events={tmp_path / 'events.jsonl'}",
            *extra,
        ]
    )
    return Supervisor(args, fake, sleep=lambda s: None)


def test_the_supervisor_submits_a_failed_run_again_until_it_completes(tmp_path: Path) -> None:
    fake = FakeFlwr(
        tmp_path / "r",
        [
            ("finished:failed", 4),
            ("finished:failed", 4),
            ("finished:failed", 7),
            ("finished:completed", 10),
        ],
        down=2,
    )
    assert _supervisor(tmp_path, fake).keep_going() == 0
    assert len(fake.submitted) == 4
    assert all(
        c["resume-from"] == "latest" and c["num-server-rounds"] == 10 for c in fake.submitted
    )
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("resuming") == 3
    assert events[0]["event"] == "submit failed"  # the SuperLink was away at first
    assert [e["checkpoint"] for e in events if e["event"] == "ended"] == [4, 4, 7, 10]


def test_the_supervisor_gives_up_on_a_run_that_cannot_start_or_was_stopped(
    tmp_path: Path,
) -> None:
    stuck = FakeFlwr(tmp_path / "r", [("finished:failed", 0)] * 5)
    assert _supervisor(tmp_path, stuck, "--max-stalls=3").keep_going() == 1
    assert len(stuck.submitted) == 3
    # a crash after the last checkpoint is submitted again (it ends at once); the
    # ServerApp's own verdict after its last round is not
    crashed = FakeFlwr(tmp_path / "r", [("finished:failed", 10), ("finished:completed", 10)])
    assert _supervisor(tmp_path, crashed).keep_going() == 0 and len(crashed.submitted) == 2
    judged = FakeFlwr(tmp_path / "r", [("finished:failed", 10)])
    judged.details = "ServerApp failed with exception: round 9: no reply was aggregated"
    assert _supervisor(tmp_path, judged).keep_going() == 1 and len(judged.submitted) == 1
    stopped = FakeFlwr(tmp_path / "r", [("finished:stopped", 2)])
    assert _supervisor(tmp_path, stopped).keep_going() == 1
    assert len(stopped.submitted) == 1
    with pytest.raises(SystemExit):  # the checkpoint is found by run-name and output-dir
        parse_args(["--run-config", "method='fedper' output-dir='/x'"])
    with pytest.raises(SystemExit):
        parse_args(["--run-config", "run-name='r' output-dir='relative'"])
