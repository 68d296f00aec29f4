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

import pytest

COUNTS_KEY = "reliability_counts"
_from_workers: dict[str, int] = {}  # pytest-xdist: what each worker's tests counted


def _counts() -> dict[str, int]:
    module = sys.modules.get("tests.test_reliability")
    return dict(getattr(module, "COUNTS", None) or {})


def pytest_sessionfinish(session) -> None:  # noqa: ANN001
    """On a pytest-xdist worker: hand the reliability counts to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[COUNTS_KEY] = _counts()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without the plugin
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001
    """On the controller: add up a finished worker's reliability counts."""
    for name, count in getattr(node, "workeroutput", {}).get(COUNTS_KEY, {}).items():
        _from_workers[name] = _from_workers.get(name, 0) + count


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001
    """Print how many fault cases the reliability tests tried (docs/RELIABILITY.md)."""
    counts = _counts()
    for name, count in _from_workers.items():
        counts[name] = counts.get(name, 0) + count
    if counts:
        terminalreporter.write_line(
            "reliability cases tried: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        )
