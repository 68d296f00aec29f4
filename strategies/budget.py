"""``max-minutes``: a run that stops cleanly after the round during which its time
ran out, and can be resumed from that round's checkpoint (a lent GPU's budget, a
night's run).

Flower's round loop runs every round it was given; the strategy ends the run early
by making the round that crossed the budget the run's last: its model gets the
closing evaluation (with eval-in-fit, as a run's last round does), its checkpoint is
written at once, and every later round asks no client (Flower logs "no clients
selected" and goes on). results.json says where it stopped (``stopped``), and the
run's outcome judges only the rounds it ran. ``resume-from`` the run's directory goes
on from there, under a new budget.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strategies.recording import Rounds

log = logging.getLogger("flwr.pflower")


class TimeBudget:
    """The run's wall-clock budget, from when its strategy was built."""

    def __init__(self, minutes: float) -> None:
        self.minutes = minutes
        self.deadline = time.monotonic() + 60 * minutes if minutes > 0 else None
        self.stopped_after: int | None = None  # the round the run stopped after

    def spent(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


class _NoClientsAfterTheStop(logging.Filter):
    """The rounds after the stop select no client by design: not said for each."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "no clients selected" not in record.getMessage()


def stop_if_out_of_time(rounds: Rounds, server_round: int) -> None:
    """After ``server_round`` aggregated: if the budget is spent and rounds remain,
    make it the run's last (its closing evaluation and checkpoint follow)."""
    budget = rounds.budget
    if budget.stopped_after is not None or not budget.spent():
        return
    if server_round >= rounds.num_rounds:
        return  # the last round anyway
    budget.stopped_after = server_round
    flwr_log = logging.getLogger("flwr")
    if not any(isinstance(f, _NoClientsAfterTheStop) for f in flwr_log.filters):
        flwr_log.addFilter(_NoClientsAfterTheStop())
    total = rounds.offset + rounds.num_rounds
    done = rounds.offset + server_round
    rounds.num_rounds = server_round
    log.warning(
        "max-minutes=%g spent: the run stops after round %d of %d (its checkpoint is "
        "written); resume-from its run directory goes on from there",
        budget.minutes,
        done,
        total,
    )
    if rounds.recorder is not None:
        rounds.recorder.extra["stopped"] = {
            "reason": f"max-minutes={budget.minutes:g}",
            "after_round": done,
            "of_rounds": total,
        }
