"""Shared pytest hooks."""

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
