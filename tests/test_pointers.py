"""Pointers in the code resolve: every ``python -m <module>`` names a module that
exists, every repository path a comment or docstring names exists, every code
reference on a method's card imports, and no product code cites a file outside the
repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from methods import registry, resolve

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
def test_every_reference_on_a_methods_card_imports(name: str) -> None:
    method = registry()[name]
    refs = [method.split, method.client_ref, method.strategy_ref, method.wire]
    refs += [r for r in (method.transform, method.check) if r]
    for ref in refs:
        assert callable(resolve(ref)), ref


def test_no_product_code_cites_a_file_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|shared/(METHODS|DESIGN)\.md|\bseeds/\w+\.(txt|json)")
    offenders = [
        str(p.relative_to(ROOT))
        for p in PRODUCT
        if p.relative_to(ROOT).parts[0] != "benchmarks" and outside.search(_text(p))
    ]
    assert offenders == []
