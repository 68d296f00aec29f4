"""#95: Flower's warnings a user cannot act on are dropped in the processes that log
them, by the start-up line scripts/dev.sh writes (pflower/flower_notes.py), and only
there: the line, run as a process named like Flower's simulation, drops them and keeps
every other record; run under another name, it changes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pflower.flower_notes import PTH_NAME, pth_line, write_pth

SAYS = """
from logging import INFO, WARNING
from flwr.common.logger import log
log(WARNING, "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.")
log(WARNING, "Manually terminating %s", "ClientAppActor")
log(WARNING, "a warning of the run's own")
log(INFO, "Federation `@none/default` (2 simulated SuperNodes)")
"""


@pytest.mark.parametrize("name", ["flwr-simulation", "default_worker.py", "other.py"])
def test_the_start_up_line_drops_flowers_notes_in_flowers_processes_only(
    tmp_path: Path, name: str
) -> None:
    script = tmp_path / name
    script.write_text(pth_line() + SAYS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "a warning of the run's own" in said and "(2 simulated SuperNodes)" in said
    notes = ["changed from 10 to 2" in said, "Manually terminating ClientAppActor" in said]
    assert notes == ([True, True] if name == "other.py" else [False, False]), said


def test_write_pth_writes_a_new_file_and_leaves_a_current_one(tmp_path: Path) -> None:
    path = write_pth(tmp_path)
    assert path == tmp_path / PTH_NAME and path.read_text() == pth_line()
    linked = tmp_path / "linked"  # a hard link (a copied environment) is not written through
    path.write_text("stale\n")
    linked.hardlink_to(path)
    write_pth(tmp_path)
    assert path.read_text() == pth_line() and linked.read_text() == "stale\n"
    before = path.stat().st_ino
    write_pth(tmp_path)
    assert path.stat().st_ino == before  # current: left alone
