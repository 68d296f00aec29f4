"""``clientapp-task-end``: a warm SuperExec's worker serves the next task."""

from __future__ import annotations

from typing import Any

from pflower.patches.core import check, enabled


class TaskEnded(Exception):
    """A ClientApp task ended with Flower's exit ``code``, and the process goes on."""

    def __init__(self, code: int) -> None:
        super().__init__(f"ClientApp task ended with exit code {code}")
        self.code = code


def clientapp_task_end() -> bool:
    """``clientapp-task-end``, in a warm SuperExec's worker (deploy/warm_superexec.py):
    Flower's ClientApp runner ends each task with ``flwr_exit``, which runs the task's
    exit handlers (its status and context to the SuperNode, its heartbeat stopped, its
    connection closed), then exits the process, from a thread after 5 s if need be.
    Here it runs the same handlers and raises ``TaskEnded``: the worker that imported
    the app and built its model serves the app's next task."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.supercore.exit.exit_handler import trigger_exit_handlers
    from flwr.supernode.runtime import run_clientapp as runner

    def task_end(code: int, *args: Any, **kwargs: Any) -> None:
        trigger_exit_handlers(run_before_force_exit=True)
        trigger_exit_handlers(run_before_force_exit=False)
        raise TaskEnded(code)

    runner.flwr_exit = task_end
    return True
