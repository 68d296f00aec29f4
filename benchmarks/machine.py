"""What the machine does around and during a cell: its speed just before and after (the
reference step) and the CPU every process of the cell used (by role).

**The reference step** (``reference_ms``): one fixed workload, timed alone.

A ratio between two rows of one run compares cells run minutes apart. On a shared
machine the same work can take a third longer from one cell to the next (measured
2026-12-03: pfl-research's CPU a client-round 42-56 ms in one setting across two runs,
the engines' code unchanged), so a ratio mixes the engines' difference with the
machine's. The runner times this workload just before and just after each cell of a
preset whose ``[report]`` sets ``machine-reference = true``; the report prints it
beside each row, and the spread over a setting's cells says how far its ratios can
be the machine's.

The workload is the side-by-side's own step: CNN4's forward, backward and SGD step on a
batch of 16 CIFAR-sized images, channels-last, on one torch thread; the median of
``steps`` steps after ``warmup``, in milliseconds (about 0.5 s in all).

**CPU by process** (``RoundCpuWatcher``): the CPU time of every process over a cell's
timed rounds: how much of the machine each part of a run used for the work the
table's seconds time.

A run writes its results.json after every round (pflower/results). The runner's
watcher sees each write and takes the CPU time of every process in the cell's tree
then (psutil: user + system); the difference between the writes after round 1 and
after round N-1 is what rounds 2 to N-1 cost (round 1 holds the start-up, round N the
closing evaluation). Processes are grouped by role: the engine's process (the cell's
own: our simulation or in-process engine, or pfl-research, which it execs), Ray's
actors (the workers that run ClientApps), Ray's services (raylet, GCS, agents) and
anything else.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

_warmed = False  # a process's first timing runs about 1.5x slow, at any warm-up: not kept


def reference_ms(steps: int = 40, warmup: int = 5) -> float:
    """The median milliseconds of one reference step (torch's thread count restored)."""
    global _warmed
    if not _warmed:
        _warmed = True
        _timed(steps, warmup)
    return _timed(steps, warmup)


def _timed(steps: int, warmup: int) -> float:
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    from models.backbones import CNN4

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        model = CNN4(3, 32, 10).to(memory_format=torch.channels_last)
        x = torch.randn(16, 3, 32, 32, generator=gen).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (16,), generator=gen)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        times = []
        for n in range(warmup + steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if n >= warmup:
                times.append(time.perf_counter() - t0)
        return 1000 * statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def spread(values: Iterable[float]) -> float:
    """The largest over the smallest, minus one (0.25: a quarter slower at worst)."""
    kept = [v for v in values if v > 0]
    return max(kept) / min(kept) - 1 if kept else 0.0


# ----------------------------------------------------------------------------- CPU by process

ROLES = ("engine process", "Ray actors", "Ray services", "other")
POLL_S = 0.02  # how often the watcher looks at results.json's mtime (a stat, no read)


# Ray's own processes that look like workers: the raylet's command line names
# default_worker.py (the command it starts workers with), and Ray's agents are
# ray::-named workers; none runs a ClientApp
RAY_SERVICES = ("raylet", "gcs_server")
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def role_of(proc: psutil.Process, root_pid: int) -> str:
    """The role of one process of a cell's tree."""
    if proc.pid == root_pid:
        return ROLES[0]
    try:  # a process may end while it is looked at
        args = proc.cmdline()
        line = " ".join(args) or proc.name()
    except psutil.Error:
        return ROLES[3]
    if (args and Path(args[0]).name in RAY_SERVICES) or line.startswith(RAY_AGENTS):
        return ROLES[2]
    if line.startswith("ray::") or "default_worker.py" in line:
        return ROLES[1]
    if "/ray/" in line:
        return ROLES[2]
    return ROLES[3]


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (Ray's services and workers included); none
    once it has ended."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def cpu_by_process(root_pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for a process and its descendants."""
    out = {}
    for p in process_tree(root_pid):
        try:
            t = p.cpu_times()
            out[p.pid] = (role_of(p, root_pid), t.user + t.system)
        except psutil.Error:
            continue
    return out


class RoundCpuWatcher:
    """Takes the cell tree's CPU after each results.json write until the cell ends."""

    def __init__(self, root_pid: int, results: Path) -> None:
        self.root_pid, self.results = root_pid, results
        self.seen: dict[int, tuple[str, float]] = {}  # every pid's last reading
        self.after: dict[int, dict[int, tuple[str, float]]] = {}  # rounds -> readings
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> RoundCpuWatcher:
        self.thread.start()
        return self

    def _watch(self) -> None:
        last = None
        while psutil.pid_exists(self.root_pid):
            try:
                proc = psutil.Process(self.root_pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
                mtime = self.results.stat().st_mtime_ns
            except (psutil.Error, OSError):
                mtime = None
            if mtime is not None and mtime != last:
                last = mtime
                reading = cpu_by_process(self.root_pid)
                self.seen.update(reading)
                try:
                    rounds = len(json.loads(self.results.read_text())["rounds"])
                except (OSError, ValueError, KeyError):
                    rounds = None
                if rounds is not None:
                    # an exited process keeps its last reading
                    self.after[rounds] = dict(self.seen)
            time.sleep(POLL_S)

    def summary(self, results: dict[str, Any]) -> dict[str, Any] | None:
        """CPU seconds by role over rounds 2 to N-1 of the finished ``results``, their
        wall seconds and the clients that trained in them; None without two readings."""
        self.thread.join(timeout=5)
        records = results.get("rounds", [])
        last = len(records) - 1
        if last < 2 or 1 not in self.after or last not in self.after:
            return None
        start, end = self.after[1], self.after[last]
        cpu = dict.fromkeys(ROLES, 0.0)
        for pid, (role, seconds) in end.items():
            cpu[role] += seconds - start.get(pid, (role, 0.0))[1]
        timed = records[1:last]
        return {
            "rounds": [2, last],
            "cpu_seconds": cpu,
            "wall_seconds": sum(r["seconds"] for r in timed),
            "client_rounds": sum(r.get("replies", 0) for r in timed),
        }
