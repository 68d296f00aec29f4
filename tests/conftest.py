"""Shared pytest hooks, and the rule every test here follows.

Every test names the behaviour it checks and fails when that behaviour breaks: it
compares against an independent reference (a run without the feature, Flower's own
code, the paper's equation written out, a hand-computed case), and a change that
breaks the behaviour was planted once to see it fail (the commit says how). No test
asserts a wall-clock duration unless the behaviour under test is itself a timeout,
and then with a margin of at least 5x the expected time; order threads with events,
record the arguments given to ``sleep`` or a clock the test moves, count requests
instead of seconds. A deadline that only guards against a hang is not a duration.
"""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    """Print how many fault cases the reliability tests tried (docs/RELIABILITY.md)."""
    module = sys.modules.get("tests.test_reliability")
    counts = getattr(module, "COUNTS", None)
    if counts:
        terminalreporter.write_line(
            "reliability cases tried: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        )
