"""Flower's warnings that a user of this project cannot act on, dropped where Flower logs them.

Flower's simulation process warns "Since flwr 1.32, default simulated SuperNodes
changed from 10 to 2." on every run, whatever its federation, before any of the app
loads (flwr/simulation/app.py), and its Ray actors warn "Manually terminating
ClientAppActor" as every run ends (ray_transport/ray_actor.py). This project's
federations name their size (scripts/federation.toml), and a size that does not fit
the data is refused in one line naming ``num-supernodes`` (``check``, the ServerApp),
so neither warning says anything about the run. Their INFO lines (how to resize a
federation) stay.

No code of the app runs in those processes before the warning, so ``scripts/dev.sh``'s
set-up writes ``PTH_NAME`` into the environment's site-packages: one line that Python
runs at start-up, which calls ``install`` in Flower's simulation process and Ray's
workers only (it looks at ``argv[0]`` first: nothing else imports anything). The
``run`` command (pflower.cli) drops the same lines from what it relays, for an
environment made some other way.
"""

from __future__ import annotations

import logging
from pathlib import Path

WARNINGS = (
    "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "Manually terminating %s",  # Flower's format string; it prints "... ClientAppActor"
)
PTH_NAME = "pflower-flower-notes.pth"
# the processes in which Flower logs them: its simulation, Ray's worker processes
PROCESSES = ("flwr-simulation", "default_worker.py")


def drop_unactionable(record: logging.LogRecord) -> bool:
    """A ``logging`` filter: keeps every record but Flower's ``WARNINGS``."""
    return not (record.levelno == logging.WARNING and record.msg in WARNINGS)


def install() -> None:
    """Drop ``WARNINGS`` from Flower's logger in this process (once)."""
    flower = logging.getLogger("flwr")
    if drop_unactionable not in flower.filters:
        flower.addFilter(drop_unactionable)


def pth_line() -> str:
    """The start-up line for site-packages: ``install`` run in ``PROCESSES`` only, and
    nothing said when the project is no longer installed."""
    body = "try:\\n from pflower.flower_notes import install\\nexcept ImportError:\\n pass\\nelse:\\n install()"
    when = f"sys.argv[:1] and sys.argv[0].endswith({PROCESSES!r})"
    return f'import sys; exec("{body}") if {when} else None\n'


def write_pth(site_packages: Path) -> Path:
    """``PTH_NAME`` in ``site_packages`` (rewritten only when it differs)."""
    path = site_packages / PTH_NAME
    if not path.is_file() or path.read_text() != pth_line():
        fresh = path.with_suffix(".new")  # a new file: never written through a hard link
        fresh.write_text(pth_line())
        fresh.replace(path)
    return path


if __name__ == "__main__":  # scripts/dev.sh's set-up: into this environment
    import sysconfig

    print(write_pth(Path(sysconfig.get_paths()["purelib"])))
