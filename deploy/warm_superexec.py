"""A site's SuperExec whose ClientApps start warm.

    python -m deploy.warm_superexec --runtime-api-address 127.0.0.1:9094 \\
        --insecure --superexec-auth-secret-file superexec.secret

Flower 1.39 runs every ClientApp message in a fresh ``flwr-clientapp`` process,
which starts Python and imports Flower, torch and the app before it reads the
message: seconds per message (docs/PERFORMANCE.md). This is Flower's own
``flower-superexec`` (same flags, same Runtime API, same authentication), except
that it imports the ClientApp's libraries once, then forks a child per task, and
the child runs Flower's ``run_clientapp`` exactly as ``flwr-clientapp`` would
(asking again soon for message parts still on their way, and not unpacking a FAB
that is installed already: pflower.patches).
The app's own modules are not kept: each child imports them from the installed
FAB, so a new app version is never served from a stale import.

Use it with ``flower-supernode --isolation process`` in place of
``flower-superexec`` (``LoopbackFederation(isolation="process", warm=True)``).
Its own flags: ``--task-timeout S`` kills a ClientApp task after S seconds (default
900, the default round-timeout; 0: never) and ``--max-tasks N`` runs at most N at
once (default 1: a site trains one task at a time).
Tasks other than ClientApps (none on a site today) start as Flower starts them.

Every ClientApp passes the site's own checks first (deploy/site_guard.py):
``--approved-apps sha256:...,...`` lists the app builds the site runs (default: the
build of the project installed beside this module; ``any``: no check), checked
before the run's FAB is unpacked; every reply is written to the site's ledger.
``--no-preload`` forks from a process that has imported only Flower (each ClientApp
then starts cold, as Flower's own SuperExec starts them).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

# The app's top-level packages (pyproject's wheel packages but deploy/): imported
# once to pull in their libraries, then dropped so children import them from the FAB.
PROJECT_PACKAGES = (
    "server_app",
    "client_app",
    "strategies",
    "models",
    "methods",
    "pflower",
)
# Flower polls its Runtime API for new tasks once a second by default; the API
# is on the site's own machine, so a tenth of a second costs nothing.
TASK_POLL_INTERVAL = "0.1"
# a ClientApp task running longer is killed: the default round-timeout (900 s)
DEFAULT_TASK_TIMEOUT = 900.0

log = logging.getLogger("flwr")


def preload() -> list[str]:
    """Import the ClientApp's libraries; forget the project's own modules.

    Returns the top-level libraries now loaded (for the start-up log line)."""
    import flwr.supernode.runtime.run_clientapp  # noqa: F401 - what a child runs

    try:
        import sklearn.metrics  # noqa: F401 - a binary task's AUC (client_app/train.py): 2.6 s

        import client_app.app  # noqa: F401 - pulls in torch, numpy, pydantic, ...
        import pflower.data.hf  # noqa: F401 - the image decoders (pyarrow, datasets)
    except ImportError as err:  # the app is not installed here: Flower's imports only
        log.warning("warm superexec: the app's libraries are not preloaded (%s)", err)
    for name in [m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES]:
        del sys.modules[name]
    return sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")})


class ForkExecutor:
    """Flower's Executor protocol: a ClientApp task runs in a fork of this process.

    Bounded: at most ``max_tasks`` ClientApps at once (no new one is acquired while
    that many run), and one that runs longer than ``task_timeout`` seconds is killed
    (SIGKILL), logged, and reaped; its round goes on without it (round-timeout)."""

    def __init__(self, fallback: Any, task_timeout: float = 0.0, max_tasks: int = 1) -> None:
        self.fallback = fallback  # Flower's SubprocessExecutor, for any other task
        self.children: set[int] = set()
        self.started: dict[int, tuple[int, float]] = {}  # pid -> (task id, start time)
        self.task_timeout = task_timeout
        self.max_tasks = max_tasks

    def get_eligible_capacity(self, supported_task_types: Any, **kw: Any) -> Any:
        from flwr.supercore.constant import TaskType

        types, hashes = self.fallback.get_eligible_capacity(supported_task_types, **kw)
        if len(self.children) >= self.max_tasks:
            types = set(types) - {TaskType.CLIENT_APP}
        return types, hashes

    def wait_for_capacity(self, *args: Any, **kw: Any) -> None:
        self.fallback.wait_for_capacity(*args, **kw)

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP or spec.runtime_dependency_install:
            return self.fallback.launch(spec)
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's loop
            os._exit(_run_child(spec))
        self.children.add(pid)
        self.started[pid] = (spec.task_id, time.monotonic())
        log.info("warm superexec: ClientApp task %d forked as pid %d", spec.task_id, pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (no zombies); kill those past the task timeout."""
        now = time.monotonic()
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)
                self.started.pop(pid, None)
                continue
            task, since = self.started.get(pid, (-1, now))
            if self.task_timeout > 0 and now - since > self.task_timeout:
                log.error(
                    "warm superexec: ClientApp task %d (pid %d) ran past --task-timeout %gs: "
                    "killed",
                    task,
                    pid,
                    self.task_timeout,
                )
                os.kill(pid, signal.SIGKILL)
                self.started[pid] = (task, float("inf"))  # killed once; reaped next time
        self.fallback.reconcile()

    def close(self) -> None:
        self.fallback.close()


def _run_child(spec: Any) -> int:
    """Flower's ``flwr-clientapp`` body for one task; the exit code."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    code = 1
    try:
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(
                spec.root_certificates_path, spec.insecure
            ),
            parent_pid=spec.parent_pid,
            runtime_dependency_install=False,
        )
        code = 0
    except SystemExit as done:  # run_clientapp ends with flwr_exit -> sys.exit
        code = done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must not unwind into the parent's loop
        logging.getLogger("flwr").exception("warm superexec: the ClientApp task failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def own_flags(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This SuperExec's own flags, and the rest (Flower's) for its CLI."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--task-timeout", type=float, default=DEFAULT_TASK_TIMEOUT)
    p.add_argument("--max-tasks", type=int, default=1)
    p.add_argument("--approved-apps", default="")
    p.add_argument("--preload", action=argparse.BooleanOptionalAction, default=True)
    ours, rest = p.parse_known_args(argv)
    if ours.task_timeout < 0 or ours.max_tasks < 1:
        p.error("--task-timeout must be >= 0 (0: none) and --max-tasks >= 1")
    if ours.approved_apps.strip():
        from deploy.site_guard import parse_approved

        try:
            parse_approved(ours.approved_apps)
        except ValueError as err:
            p.error(f"--approved-apps: {err}")
    return ours, rest


def approved_apps(text: str) -> frozenset[str] | None:
    """The builds this site runs: ``text``'s, else the installed project's build."""
    from deploy.site_guard import installed_app_hash, parse_approved

    return parse_approved(text) if text.strip() else frozenset({installed_app_hash()})


def main() -> None:
    ours, sys.argv[1:] = own_flags(sys.argv[1:])
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", TASK_POLL_INTERVAL)
    try:
        approved = approved_apps(ours.approved_apps)
    except FileNotFoundError as err:
        sys.exit(f"warm superexec: {err}")
    loaded = preload() if ours.preload else []
    import pflower.patches
    from deploy.site_guard import SiteGuard

    pflower.patches.fab_reuse()  # under the site's app check: SiteGuard wraps it
    SiteGuard(approved).install()  # before any task: the app check and the ledger
    if approved is None:
        log.warning("warm superexec: --approved-apps any: this site runs whatever app a run ships")
    else:
        log.info("warm superexec: approved apps %s", ", ".join(sorted(approved)))
    from flwr.supercore.cli import flower_superexec
    from flwr.supercore.constant import ExecutorType
    from flwr.supercore.superexec.executor import get_executor

    def fork_executor(executor_type: Any, **kw: Any) -> ForkExecutor:
        if executor_type != ExecutorType.SUBPROCESS:
            raise ValueError("the warm superexec runs ClientApps by fork, not by an executor")
        return ForkExecutor(get_executor(executor_type, **kw), ours.task_timeout, ours.max_tasks)

    # the change to Flower's SuperExec: its executor (looked up by this name), and
    # children that ask again for a message part soon (pflower.patches)
    pflower.patches.superexec_fork(fork_executor)
    pflower.patches.object_retries()
    log.info("warm superexec: %d libraries preloaded (torch: %s)", len(loaded), "torch" in loaded)
    flower_superexec()  # Flower's CLI: its flags, its task loop, its signal handling


if __name__ == "__main__":
    main()
