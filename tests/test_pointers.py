"""Pointers in the code resolve: every ``python -m <module>`` names a module that
exists, every repository path a comment or docstring names exists, every method
finds its code in its own package (none named in a string), and no product code
cites a file outside the repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from client_app.base import PFLClient
from client_app.method_client import client_class
from methods import SIDES, registry, side_table
from models.wire import Wire
from server_app.method_strategy import strategy_class
from strategies.base import PFLStrategy

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", "outputs", ".flwr", "__pycache__"}  # and every .venv* (pfl-research's too)


def _skipped(parts: tuple[str, ...]) -> bool:
    return bool(SKIP & set(parts)) or any(p.startswith(".venv") for p in parts)


TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not _skipped((p.name,))}
PRODUCT = sorted(
    p
    for p in ROOT.rglob("*.py")
    if not _skipped(p.relative_to(ROOT).parts) and p.relative_to(ROOT).parts[0] != "tests"
)
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh")) + sorted((ROOT / "docker").rglob("*"))

MODULE = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
# a path inside the repository: starts with one of its top-level folders
PATH = re.compile(r"(?<![\w/.<{$-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|toml|sh|yml|yaml|json|png))\b")


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except (UnicodeDecodeError, IsADirectoryError):
        return ""


def test_every_python_dash_m_names_a_module_that_exists() -> None:
    missing = []
    for path in [*PRODUCT, *SCRIPTS, ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for module in MODULE.findall(_text(path)):
            module = module.rstrip(".")
            if importlib.util.find_spec(module.split(".")[0]) is None:
                missing.append(f"{path.relative_to(ROOT)}: python -m {module}")
            elif importlib.util.find_spec(module) is None:
                missing.append(f"{path.relative_to(ROOT)}: python -m {module}")
    assert missing == []


def test_every_repository_path_named_in_code_exists() -> None:
    missing = []
    for path in [*PRODUCT, *SCRIPTS]:
        for named in PATH.findall(_text(path)):
            if named.split("/")[0] in TOP and not (ROOT / named).exists():
                missing.append(f"{path.relative_to(ROOT)}: {named}")
    assert missing == []


def test_the_check_catches_a_stale_pointer(tmp_path: Path) -> None:
    text = "see docs/no-such-page.md and `python -m methods.no_such_module`"
    assert [p for p in PATH.findall(text) if not (ROOT / p).exists()] == ["docs/no-such-page.md"]
    assert [m for m in MODULE.findall(text) if importlib.util.find_spec(m) is None] == [
        "methods.no_such_module"
    ]


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_method_finds_its_code_in_its_own_package(name: str) -> None:
    method = registry()[name]
    side = method.model_side
    assert callable(side.split)
    assert all(callable(f) for f in (side.transform, side.check) if f is not None)
    assert side.wire is None or issubclass(side.wire, Wire)
    assert issubclass(client_class(method), PFLClient)
    assert issubclass(strategy_class(method), PFLStrategy)
    code = [side.split, side.transform, side.check, side.wire]
    code += [client_class(method), strategy_class(method)]
    for obj in (c for c in code if c is not None):  # its own package's or the shared code
        assert obj.__module__.startswith(
            (method.package, "models.", "client_app.", "strategies.")
        ), obj


def test_every_side_table_names_only_its_own_cards_methods() -> None:
    """A misspelt name in CLIENTS or STRATEGIES would quietly give the base's code."""
    by_package: dict[str, set[str]] = {}
    for method in registry().values():
        by_package.setdefault(method.package, set()).add(method.name)
    stray = {
        f"{package}.{side}": sorted(set(side_table(package, side)) - names)
        for package, names in by_package.items()
        for side in SIDES
        if set(side_table(package, side)) - names
    }
    assert stray == {}
    assert "fedbn" in side_table("methods.baselines", "model")  # the check reads the tables


CODE_IN_A_STRING = re.compile(r"[\"'][a-z_]+(?:\.[a-z_]+)+:[A-Za-z_]\w*[\"']")


def test_no_card_names_code_in_a_string() -> None:
    cards = sorted((ROOT / "methods").glob("*/__init__.py"))
    assert len(cards) == len({m.package for m in registry().values()})
    assert {str(c.relative_to(ROOT)): CODE_IN_A_STRING.findall(c.read_text()) for c in cards} == {
        str(c.relative_to(ROOT)): [] for c in cards
    }
    assert CODE_IN_A_STRING.findall('x = "methods.fedcp.client:FedCPClient"')


def test_no_product_code_cites_a_file_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|shared/(METHODS|DESIGN)\.md|\bseeds/\w+\.(txt|json)")
    offenders = [
        str(p.relative_to(ROOT))
        for p in PRODUCT
        if p.relative_to(ROOT).parts[0] != "benchmarks" and outside.search(_text(p))
    ]
    assert offenders == []
