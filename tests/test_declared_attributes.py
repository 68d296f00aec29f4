"""Nothing in the round's code reads an attribute by name that no class declares:
every ``getattr(x, "name", ...)`` in strategies/, server_app/ and client_app/ names an
attribute some class of the product, Flower or torch assigns or defines."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import flwr
import torch

ROOT = Path(__file__).resolve().parents[1]
READERS = ("strategies", "server_app", "client_app")
PRODUCT = ("strategies", "server_app", "client_app", "pflower", "methods", "models", "deploy")
GETATTR = re.compile(r"getattr\(\s*[^,()]+(?:\([^()]*\))?\s*,\s*[\"']([A-Za-z_][A-Za-z0-9_]*)[\"']")


def _sources(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*.py")]


@cache
def _declarations() -> str:
    """Every product, Flower and torch source, as one text to search."""
    roots = [ROOT / d for d in PRODUCT]
    roots += [Path(flwr.__file__).parent, Path(torch.__file__).parent]
    return "\n".join(p.read_text(errors="replace") for p in _sources(*roots))


def declared(name: str) -> bool:
    """Whether some class assigns ``name`` (``x.name = ``, ``x.name: T``), defines it
    (``def name``) or declares it in a class body (``name: T`` / ``name = ``)."""
    pattern = rf"\.{name}\s*(?::[^=\n]*)?=[^=]|\bdef {name}\(|^\s+{name}\s*[:=]"
    return re.search(pattern, _declarations(), re.MULTILINE) is not None


def _reads() -> list[tuple[str, str]]:
    out = []
    for path in _sources(*(ROOT / d for d in READERS)):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in GETATTR.findall(line):
                out.append((f"{path.relative_to(ROOT)}:{number}", name))
    return out


def test_every_attribute_read_by_name_is_declared_by_some_class() -> None:
    reads = _reads()
    assert reads, "the scan found no getattr at all: its pattern is broken"
    undeclared = [f"{where}: {name}" for where, name in reads if not declared(name)]
    assert not undeclared, f"attributes no class declares: {undeclared}"


def test_the_check_catches_a_planted_undeclared_attribute() -> None:
    assert not declared("fold_device_nobody_declares")
    assert declared("fold_device")  # PFLStrategy's, set by the in-process engine
    line = 'device = getattr(strategy, "fold_device_nobody_declares", None)'
    assert GETATTR.findall(line) == ["fold_device_nobody_declares"]
