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


def test_a_hung_clientapp_task_is_killed_after_its_timeout(monkeypatch, caplog) -> None:
    monkeypatch.setattr(warm_superexec, "_run_child", lambda spec: time.sleep(120) or 0)
    executor = ForkExecutor(Fallback(), task_timeout=0.5, max_tasks=1)
    spec = SimpleNamespace(task_type=TaskType.CLIENT_APP, runtime_dependency_install=False)
    spec.task_id = 7
    executor.launch(spec)
    (pid,) = executor.children
    # while it runs, no second ClientApp is acquired (one task at a time)
    assert TaskType.CLIENT_APP not in executor.get_eligible_capacity({TaskType.CLIENT_APP})[0]
    executor.reconcile()
    assert pid in executor.children  # not yet past its timeout
    time.sleep(0.8)
    with caplog.at_level(logging.ERROR, logger="flwr"):
        executor.reconcile()
    assert f"ClientApp task 7 (pid {pid}) ran past --task-timeout 0.5s: killed" in caplog.text
    deadline = time.monotonic() + 10
    while executor.children and time.monotonic() < deadline:
        time.sleep(0.05)
        executor.reconcile()
    assert not executor.children  # killed and reaped
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert TaskType.CLIENT_APP in executor.get_eligible_capacity({TaskType.CLIENT_APP})[0]


def test_its_own_flags_are_taken_out_of_flowers() -> None:
    ours, rest = own_flags(["--insecure", "--task-timeout", "30", "--max-tasks=2", "--x", "y"])
    assert (ours.task_timeout, ours.max_tasks) == (30.0, 2)
    assert rest == ["--insecure", "--x", "y"]
    assert own_flags([])[0].task_timeout == 900.0
    with pytest.raises(SystemExit):
        own_flags(["--max-tasks", "0"])
