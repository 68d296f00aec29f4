"""Code comments say why, not what was measured: a figure in milliseconds, microseconds
or seconds with a fraction goes stale with the machine, so it lives in docs/ (the
comment names where). The patch table (pflower/patches) keeps each patch's measured
reason beside the Flower version it was measured on, by design."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("server_app", "client_app", "strategies", "models", "methods", "pflower", "deploy")
EXEMPT = ("pflower/patches/",)
# a timing: "2 ms", "43 us", "1.5x faster" (seconds are often a design's constants)
TIMING = re.compile(r"\b\d+(\.\d+)?\s?(ms|us|µs)\b|\b\d+(\.\d+)?x (faster|slower)\b")


def timed_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comment or docstring of ``source`` that carries a timing."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    previous = None
    for tok in tokens:
        is_comment = tok.type == tokenize.COMMENT
        # a docstring: a string standing alone as a statement
        is_doc = tok.type == tokenize.STRING and (
            previous is None
            or previous.type in (tokenize.INDENT, tokenize.NEWLINE, tokenize.DEDENT)
        )
        if (is_comment or is_doc) and TIMING.search(tok.string):
            out.append((tok.start[0], TIMING.search(tok.string).group(0)))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok
    return out


def test_no_comment_in_the_product_carries_a_timing() -> None:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where.startswith(EXEMPT):
                continue
            found += [f"{where}:{line}: {text}" for line, text in timed_comments(path.read_text())]
    assert not found, f"timings in comments (put them in docs/, name the doc): {found}"


def test_the_scan_finds_a_planted_timing_and_passes_code() -> None:
    planted = 'x = 1  # a deep copy cost 2 ms a message\n\ndef f():\n    """3x faster."""\n'
    assert [line for line, _ in timed_comments(planted)] == [1, 4]
    assert timed_comments('TIMEOUT = 0.5  # seconds\nname = "2 ms"\n') == []
