"""The warm SuperExec bounds its ClientApp tasks (#32): one at a time by default, and a
task that hangs is killed after --task-timeout and reaped."""

from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace

import pytest
from flwr.supercore.constant import TaskType

from deploy import warm_superexec
from deploy.warm_superexec import ForkExecutor, own_flags


class Fallback:
    def get_eligible_capacity(self, types, **kw):  # noqa: ANN001, ANN201
        return set(types), set()

    def reconcile(self) -> None:
        pass

    def close(self) -> None:
        pass


def fake_clock(monkeypatch) -> list[float]:
    """The executor's clock, moved by the test (no sleeps, no wall-clock margins)."""
    clock = [1000.0]
    monkeypatch.setattr(warm_superexec, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return clock


def test_a_hung_clientapp_task_is_killed_after_its_timeout(monkeypatch, caplog) -> None:
    monkeypatch.setattr(warm_superexec, "_run_task", lambda spec, **kw: time.sleep(120) or 0)
    clock = fake_clock(monkeypatch)
    executor = ForkExecutor(Fallback(), task_timeout=0.5, max_tasks=1)
    executor.launch(_spec(7, "h"))
    (pid,) = executor.workers
    # while it runs, no second ClientApp is acquired (one task at a time)
    assert TaskType.CLIENT_APP not in executor.get_eligible_capacity({TaskType.CLIENT_APP})[0]
    clock[0] += 0.49
    executor.reconcile()
    assert pid in executor.workers  # not yet past its timeout
    clock[0] += 0.02
    with caplog.at_level(logging.ERROR, logger="flwr"):
        executor.reconcile()
    assert f"ClientApp task 7 (pid {pid}) ran past --task-timeout 0.5s: killed" in caplog.text
    deadline = time.monotonic() + 10
    while executor.workers and time.monotonic() < deadline:
        time.sleep(0.05)
        executor.reconcile()
    assert not executor.workers  # killed and reaped
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert TaskType.CLIENT_APP in executor.get_eligible_capacity({TaskType.CLIENT_APP})[0]


def _spec(task: int, fab: str | None) -> SimpleNamespace:
    return SimpleNamespace(
        task_type=TaskType.CLIENT_APP, runtime_dependency_install=False, task_id=task, fab_hash=fab
    )


def _settle(executor: ForkExecutor, idle: int, seconds: float = 20) -> None:
    """Reconcile until ``idle`` workers wait for a task and every other has exited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        executor.reconcile()
        states = [w.task for w in executor.workers.values()]
        if states.count(None) == idle == len(states):
            return
        time.sleep(0.02)
    raise AssertionError(f"workers did not settle: {states}")


def test_a_worker_serves_its_app_builds_next_task_and_no_other(monkeypatch, tmp_path) -> None:
    ran = tmp_path / "ran"

    def run_task(spec, watch_parent):  # noqa: ANN001, ANN202 - in the forked worker
        with open(ran, "a") as f:
            f.write(f"{spec.task_id} {os.getpid()} {watch_parent}\n")
        return 0 if spec.task_id != 4 else 3  # task 4 fails

    monkeypatch.setattr(warm_superexec, "_run_task", run_task)
    executor = ForkExecutor(Fallback(), max_tasks=1, keep=True)
    try:
        executor.launch(_spec(1, "h"))
        assert executor.busy() == 1
        _settle(executor, idle=1)
        assert executor.busy() == 0  # idle: capacity for the next task
        (first,) = executor.workers
        executor.launch(_spec(2, "h"))  # the same build: the same process
        _settle(executor, idle=1)
        assert list(executor.workers) == [first]
        executor.launch(_spec(3, "other"))  # another build: a fresh fork; the idle one stops
        _settle(executor, idle=1)
        (other,) = executor.workers
        assert other != first
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # stopped and reaped
        executor.launch(_spec(4, "other"))  # fails: that worker exits, is not reused
        _settle(executor, idle=0)
        executor.launch(_spec(5, "other"))
        _settle(executor, idle=1)
        (last,) = executor.workers
    finally:
        executor.close()
    lines = [line.split() for line in ran.read_text().splitlines()]
    assert lines == [
        ["1", str(first), "True"],  # the first task watches the SuperExec, for the worker
        ["2", str(first), "False"],
        ["3", str(other), "True"],
        ["4", str(other), "False"],
        ["5", str(last), "True"],
    ]
    assert last != other


def test_an_idle_worker_waits_until_the_superexec_stops_it(monkeypatch) -> None:
    """A worker never leaves on its own (a task sent as it left would be lost): it waits
    for the next task until the SuperExec, after ``idle`` seconds, closes its pipe."""
    monkeypatch.setattr(warm_superexec, "_run_task", lambda spec, **kw: 0)
    clock = fake_clock(monkeypatch)
    executor = ForkExecutor(Fallback(), keep=True, idle=1.0)
    executor.launch(_spec(1, "h"))
    _settle(executor, idle=1)
    (pid,) = executor.workers
    clock[0] += 0.99
    executor.reconcile()
    assert executor.workers[pid].task is None  # still idle, still there
    os.kill(pid, 0)
    clock[0] += 0.02
    executor.reconcile()  # idle past the limit: its pipe is closed, and it exits
    _settle(executor, idle=0)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_without_the_patch_or_a_build_hash_every_task_is_a_fresh_fork(monkeypatch, tmp_path):
    monkeypatch.setattr(warm_superexec, "_run_task", lambda spec, **kw: 0)
    for executor, fab in ((ForkExecutor(Fallback(), keep=False), "h"),
                          (ForkExecutor(Fallback(), keep=True), None)):  # fmt: skip
        pids = set()
        for task in (1, 2):
            executor.launch(_spec(task, fab))
            pids |= set(executor.workers)
            _settle(executor, idle=0)  # each exits after its task
        assert len(pids) == 2


def test_its_own_flags_are_taken_out_of_flowers() -> None:
    ours, rest = own_flags(["--insecure", "--task-timeout", "30", "--max-tasks=2", "--x", "y"])
    assert (ours.task_timeout, ours.max_tasks) == (30.0, 2)
    assert rest == ["--insecure", "--x", "y"]
    assert own_flags([])[0].task_timeout == 900.0
    with pytest.raises(SystemExit):
        own_flags(["--max-tasks", "0"])
