"""``serverapp-after-ray``: in Flower's simulation, the ServerApp's thread does its
work only once the Ray backend is up.

Flower's ``_main_loop`` starts the ServerApp's thread first, then the Ray backend on
the main thread, and Ray starts its services (``gcs_server``, ``raylet``) by
``subprocess.Popen`` with a Python ``preexec_fn``: Python code in a child forked from
a process whose other threads are busy, which Python's documentation calls unsafe
with threads. Once in CI the forked ``gcs_server`` sat in a futex wait before its
exec for 15 minutes while the ServerApp's thread was asking the clients'
properties (tests/test_checkpoint.py, the third simulation in one process). Here
that thread's run waits, holding no lock, until Ray is initialized (or the
simulation is stopped), so the ServerApp does no work while Ray forks.

Nothing of Flower is replaced: the thread is recognized by the target Flower gives
it (``run_serverapp_th``'s ``server_th_with_start_checks``, flwr 1.39 and 1.42), and
the ServerApp calls ``serverapp_after_ray`` first thing in its run. Not during its
import: ``flwr run`` loads the ServerApp by Flower's ``load_app``, under a lock the
main thread's load of the ClientApp takes before Ray starts, so a wait there held
both threads for the longest wait (seen in CI, 5768ea0). Its import can still meet
Ray's start where the main thread loaded the ClientApp first (noted, not closed). A
safety fix, not a speed-up: it stays on with ``PFLOWER_FLOWER_PATCHES=0``."""

from __future__ import annotations

import logging
import sys
import threading
import time

from pflower.patches.core import applies

SERVERAPP_THREAD = "run_serverapp_th.<locals>.server_th_with_start_checks"
POLL = 0.02  # s between two looks at Ray's state (Ray's start takes seconds)
LONGEST_WAIT = 300.0  # then the ServerApp goes on, with a warning, as Flower would

log = logging.getLogger("flwr.pflower")


def is_simulation_serverapp_thread(thread: threading.Thread | None = None) -> bool:
    """Whether ``thread`` (default: this one) is the one Flower's simulation runs its
    ServerApp on."""
    thread = thread or threading.current_thread()
    target = getattr(thread, "_target", None)
    return getattr(target, "__qualname__", "") == SERVERAPP_THREAD


def ray_is_up() -> bool:
    """Whether Ray is initialized in this process (Ray is not imported to find out:
    an import here would run beside the main thread's)."""
    ray = sys.modules.get("ray")
    is_initialized = getattr(ray, "is_initialized", None)
    return bool(is_initialized is not None and is_initialized())


def _stop_event(thread: threading.Thread) -> threading.Event | None:
    """The simulation's stop event, which Flower passes its ServerApp thread."""
    args = getattr(thread, "_args", ())
    return next((a for a in args if isinstance(a, threading.Event)), None)


def serverapp_after_ray(longest: float = LONGEST_WAIT) -> float:
    """``serverapp-after-ray``: on Flower's simulation ServerApp thread, return once
    Ray is initialized in this process, the simulation is stopped, or ``longest`` s
    have passed (with a warning); at once anywhere else (a deployed ServerApp, the
    in-process engine, the main thread). Returns the seconds waited."""
    thread = threading.current_thread()
    if not is_simulation_serverapp_thread(thread) or not applies("serverapp-after-ray"):
        return 0.0
    stop, start = _stop_event(thread), time.monotonic()
    while not ray_is_up():
        if stop is not None and stop.is_set():
            break
        if time.monotonic() - start > longest:
            log.warning(
                "the ServerApp waited %.0f s for the Ray backend to start and goes on "
                "without it (pflower.patches.start_order)",
                longest,
            )
            break
        time.sleep(POLL)
    return time.monotonic() - start
