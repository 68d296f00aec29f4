"""The documents a newcomer reads: every relative link in docs/ and the README resolves
(the file, and the heading where the link names one), no document under docs/ but the
notes is longer than a reader takes in at once, PERFORMANCE.md leads with the current
results, and the notes have an index that lists every one of them."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOTES = DOCS / "notes"
MAX_LINES = 450  # issue #95; the notes (history) apart
MAX_PERFORMANCE_LINES = 350

PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces
    to hyphens (a repeated heading gets -1, -2: see anchors)."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` whose file, or heading, is not there."""
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = unquote(target).partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            out.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_fails_on_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-heading-with-code) [gone](missing.md) [no](there.md#elsewhere)\n"
        "```\n[inside a fence](not-checked.md)\n```\n[web](https://example.org/x)\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md: missing.md (no such file)",
        "page.md: there.md#elsewhere (no such heading)",
    ]


def test_no_document_but_the_notes_is_over_the_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in DOCS.rglob("*.md")
        if NOTES not in p.parents
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
    assert len((DOCS / "PERFORMANCE.md").read_text().splitlines()) <= MAX_PERFORMANCE_LINES


def test_performance_leads_with_the_current_side_by_side() -> None:
    text = (DOCS / "PERFORMANCE.md").read_text()
    first_table = text[text.index("\n|") :]
    before = text[: text.index("\n|")]
    assert "pfl-research" in first_table.split("\n\n")[0]
    assert re.search(r"\bat [0-9a-f]{7}\b", before.rsplit("###", 1)[1])  # its commit


def test_the_notes_have_an_index_listing_each() -> None:
    index = (NOTES / "README.md").read_text()
    notes = sorted(p.name for p in NOTES.glob("*.md") if p.name != "README.md")
    assert notes and all(re.fullmatch(r"\d{4}-\d\d-\d\d-[a-z0-9-]+\.md", n) for n in notes)
    assert [n for n in notes if f"({n})" not in index] == []
