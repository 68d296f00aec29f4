"""Where a ClientApp message's time goes (``log-phases=true``).

A deployed ClientApp's first message starts its process (Flower 1.39: a fresh
process per message; a warm site: a worker's first), so its phases run from the
server creating the message to the reply leaving the handler:
``queued`` (the SuperNode's next poll and the process spawn), ``python+flwr``
(interpreter start, Flower's imports, loading the app), ``app imports`` (torch and
this project), ``handover`` (Flower's reading of the message), then the handler's
own marks (config, data, model, personal state, training, evaluation, upload). A
later message in the same process is ``queued`` until the handler starts, then the
handler's marks.
One ``pflower-phases {...}`` log line per message; the benchmarks parse it.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Iterable

PREFIX = "pflower-phases "


def _process_started() -> float:
    """This process's start as epoch seconds (Linux /proc; else now)."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_STARTED = _process_started()
APP_IMPORT_STARTED = time.time()  # client_app/__init__ imports this module first
APP_IMPORTED = APP_IMPORT_STARTED  # set at the end of client_app/app.py

_local = threading.local()  # each thread's message (in-process clients run side by side)


def _marks() -> list[tuple[str, float]]:
    if not hasattr(_local, "marks"):
        _local.marks = []
    return _local.marks


def begin(created_at: float) -> None:
    """A message arrived (``created_at``: when the server made it, epoch seconds)."""
    marks = _marks()
    marks.clear()
    if PROCESS_STARTED < created_at:  # a process that outlives messages (simulation, a worker)
        marks.extend([("created", created_at), ("queued", time.time())])
        return
    marks.extend(
        [
            ("created", created_at),
            ("queued", PROCESS_STARTED),
            ("python+flwr", APP_IMPORT_STARTED),
            ("app imports", APP_IMPORTED),
            ("handover", time.time()),
        ]
    )


def mark(phase: str) -> None:
    """``phase`` ended now (it started at the previous mark)."""
    marks = _marks()
    if marks:
        marks.append((phase, time.time()))


def summary() -> dict[str, float]:
    """Seconds per phase, in order."""
    marks = _marks()
    return {name: round(end - start, 4) for (_, start), (name, end) in zip(marks, marks[1:])}


def line() -> str:
    return PREFIX + json.dumps(summary())


def median_phases(log_lines: Iterable[str]) -> dict[str, float]:
    """The median message, phase by phase, over every ``line()`` in a log (any other
    line is skipped); ``messages``: how many there were."""
    phases = [json.loads(ln.split(PREFIX, 1)[1]) for ln in log_lines if PREFIX in ln]
    names = list(dict.fromkeys(k for p in phases for k in p))
    medians = {k: statistics.median(p[k] for p in phases if k in p) for k in names}
    return medians | {"messages": len(phases)}
