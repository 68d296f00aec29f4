"""A site's SuperExec whose ClientApps start warm.

    python -m deploy.warm_superexec --runtime-api-address 127.0.0.1:9094 \\
        --insecure --superexec-auth-secret-file superexec.secret

Flower 1.39 runs every ClientApp message in a fresh ``flwr-clientapp`` process,
which starts Python and imports Flower, torch and the app before it reads the
message: seconds per message (docs/PERFORMANCE.md). This is Flower's own
``flower-superexec`` (same flags, same Runtime API, same authentication), except
that it imports the ClientApp's libraries once, then forks a worker that runs
Flower's ``run_clientapp`` exactly as ``flwr-clientapp`` would (asking again soon
for message parts still on their way, and not unpacking a FAB that is installed
already: pflower.patches), task after task of the same app build (patch
``clientapp-task-end``): the app imported, its model built and its data read once,
not once a message. The app's own modules are not kept in this process: a worker
imports them from the installed FAB and serves only tasks of that FAB's hash, so a
new app version is never served from a stale import. Each task still passes the
site's checks below, and its state goes back to the SuperNode as Flower sends it.

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
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection
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
# a worker idle this long is stopped by the SuperExec (its memory freed)
WORKER_IDLE = 600.0

log = logging.getLogger("flwr")


def preload() -> list[str]:
    """Import the ClientApp's libraries; forget the project's own modules.

    Returns the top-level libraries now loaded (for the start-up log line)."""
    import flwr.supernode.runtime.run_clientapp  # noqa: F401 - what a child runs

    try:
        import sklearn.metrics  # noqa: F401 - a binary task's AUC (client_app/train.py): slow to import

        import client_app.app  # noqa: F401 - pulls in torch, numpy, pydantic, ...
        import pflower.data.hf  # noqa: F401 - the image decoders (pyarrow, datasets)
    except ImportError as err:  # the app is not installed here: Flower's imports only
        log.warning("warm superexec: the app's libraries are not preloaded (%s)", err)
    for name in [m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES]:
        del sys.modules[name]
    return sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")})


@dataclass
class Worker:
    """A forked ClientApp process: the app build it serves, its pipe, its task."""

    fab: str | None  # the FAB hash it imported (None: one task, then it exits)
    conn: Connection  # the parent's end: task specs out, "task done" in
    task: int | None  # the task it runs now; None: idle; -1: stopping or killed
    since: float  # when that task began, or when it went idle


class ForkExecutor:
    """Flower's Executor protocol: a ClientApp task runs in a fork of this process.

    A fork (a worker) that ran a task well waits (stopped after ``idle`` seconds) for the
    next task of the same app build (the same FAB hash) and runs it in the process that
    has imported the app and built its model (patch ``clientapp-task-end``); a task of
    another build gets a fresh fork, and idle workers of other builds are stopped.
    Bounded: at most ``max_tasks`` ClientApps at once (no new one is acquired while
    that many run), and one that runs longer than ``task_timeout`` seconds is killed
    (SIGKILL), logged, and reaped; its round goes on without it (round-timeout)."""

    def __init__(
        self,
        fallback: Any,
        task_timeout: float = 0.0,
        max_tasks: int = 1,
        keep: bool = False,
        idle: float = WORKER_IDLE,
    ) -> None:
        self.fallback = fallback  # Flower's SubprocessExecutor, for any other task
        self.workers: dict[int, Worker] = {}  # pid -> worker
        self.task_timeout = task_timeout
        self.max_tasks = max_tasks
        self.keep = keep  # workers serve further tasks (patch clientapp-task-end applied)
        self.idle = idle

    def busy(self) -> int:
        """Workers running a task (not those idle, stopping or killed)."""
        return sum(w.task is not None and w.task >= 0 for w in self.workers.values())

    def get_eligible_capacity(self, supported_task_types: Any, **kw: Any) -> Any:
        from flwr.supercore.constant import TaskType

        types, hashes = self.fallback.get_eligible_capacity(supported_task_types, **kw)
        if self.busy() >= self.max_tasks:
            types = set(types) - {TaskType.CLIENT_APP}
        return types, hashes

    def wait_for_capacity(self, *args: Any, **kw: Any) -> None:
        self.fallback.wait_for_capacity(*args, **kw)

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP or spec.runtime_dependency_install:
            return self.fallback.launch(spec)
        fab = getattr(spec, "fab_hash", None) if self.keep else None
        for pid, worker in self.workers.items():
            if worker.task is None and fab is not None and worker.fab == fab:
                try:
                    worker.conn.send(spec)
                except OSError:  # it is exiting: reaped later; fork another
                    worker.task = -1
                    continue
                worker.task, worker.since = spec.task_id, time.monotonic()
                log.info("warm superexec: ClientApp task %d to worker pid %d", spec.task_id, pid)
                return LaunchResult.accepted()
        for worker in self.workers.values():  # idle workers of other builds: stop them
            if worker.task is None:
                worker.task = -1
                worker.conn.close()  # it sees the pipe closed, and exits
        parent_end, child_end = Pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's loop
            parent_end.close()
            for worker in self.workers.values():
                if not worker.conn.closed:
                    worker.conn.close()
            os._exit(_serve(spec, child_end, keep=fab is not None))
        child_end.close()
        self.workers[pid] = Worker(fab, parent_end, spec.task_id, time.monotonic())
        log.info("warm superexec: ClientApp task %d forked as pid %d", spec.task_id, pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished workers (no zombies); note those done with their task; kill
        those past the task timeout."""
        now = time.monotonic()
        for pid, worker in list(self.workers.items()):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                del self.workers[pid]
                if not worker.conn.closed:
                    worker.conn.close()
                continue
            if worker.task is None:
                # only the SuperExec ends an idle worker: a worker that left on its own
                # could be sent a task in the moment it left, and the task would be lost
                if now - worker.since > self.idle:
                    worker.task = -1
                    worker.conn.close()  # it sees the pipe closed, and exits
                continue
            if worker.task < 0:
                continue
            if _told_done(worker.conn):
                worker.task, worker.since = None, now  # idle: waits for its app's next task
            elif self.task_timeout > 0 and now - worker.since > self.task_timeout:
                log.error(
                    "warm superexec: ClientApp task %d (pid %d) ran past --task-timeout %gs: "
                    "killed",
                    worker.task,
                    pid,
                    self.task_timeout,
                )
                os.kill(pid, signal.SIGKILL)
                worker.task = -1  # killed once; reaped next time
        self.fallback.reconcile()

    def close(self) -> None:
        for worker in self.workers.values():
            if not worker.conn.closed:
                worker.conn.close()
        self.fallback.close()


def _told_done(conn: Connection) -> bool:
    """Whether the worker said its task is done (a closed pipe: it is exiting)."""
    try:
        return conn.poll() and conn.recv() is not None
    except (EOFError, OSError):
        return False


def _serve(spec: Any, conn: Connection, keep: bool) -> int:
    """A worker: run ``spec``'s task, then (``keep``, the task went well) wait for the
    next one over ``conn``; its exit code."""
    first = True
    while True:
        code = _run_task(spec, watch_parent=first)
        first = False
        if code != 0 or not keep:
            return code
        try:
            conn.send(spec.task_id)
            spec = conn.recv()  # the next task; the pipe closed (EOFError): stop
        except (EOFError, OSError):  # the SuperExec closed the pipe (or is gone)
            return 0


def _run_task(spec: Any, watch_parent: bool) -> int:
    """Flower's ``flwr-clientapp`` body for one task; the exit code."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    from pflower.patches import TaskEnded

    code = 1
    try:
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(
                spec.root_certificates_path, spec.insecure
            ),
            # one thread watches the SuperExec for the worker's whole life
            parent_pid=spec.parent_pid if watch_parent else None,
            runtime_dependency_install=False,
        )
        code = 0
    except TaskEnded as done:  # flwr_exit, patched: 0-99 are Flower's success codes
        code = 0 if 0 <= done.code < 100 else 1
    except SystemExit as done:  # run_clientapp ends with flwr_exit -> sys.exit
        code = done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must not unwind into the parent's loop
        logging.getLogger("flwr").exception("warm superexec: the ClientApp task failed")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):  # the task's handlers
            signal.signal(sig, signal.SIG_DFL)
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
        fallback = get_executor(executor_type, **kw)
        return ForkExecutor(fallback, ours.task_timeout, ours.max_tasks, keep=kept)

    # the change to Flower's SuperExec: its executor (looked up by this name), and
    # children that ask again for a message part soon (pflower.patches)
    pflower.patches.superexec_fork(fork_executor)
    pflower.patches.object_retries()
    kept = pflower.patches.clientapp_task_end()  # in the workers: applied before the forks
    log.info("warm superexec: %d libraries preloaded (torch: %s)", len(loaded), "torch" in loaded)
    flower_superexec()  # Flower's CLI: its flags, its task loop, its signal handling


if __name__ == "__main__":
    main()
