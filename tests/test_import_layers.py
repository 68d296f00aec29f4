"""The directions of dependency (pyproject.toml's import-linter contracts,
docs/ARCHITECTURE.md): every module of the root packages sits in a layer, the code
keeps the contracts, and an upward import planted in client_app, strategies, methods,
pflower.engine or models breaks them. The plants go into one copy of the packages,
one at a time."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = LINTER["root_packages"]
LAYERS_CONTRACT = "layers: a module imports only from its own layer and those below"


def layers() -> list[list[str]]:
    """The layers contract's rows, top first, each the module names it holds (an
    optional one, in parentheses, too)."""
    (contract,) = [c for c in LINTER["contracts"] if c["type"] == "layers"]
    rows = [row.replace("|", ":").split(":") for row in contract["layers"]]
    return [[name.strip().strip("()") for name in row] for row in rows]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the root packages under ``root``, by its dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def row_of(module: str, rows: list[list[str]]) -> int | None:
    """The index of the row holding ``module`` (itself or a package above it), or None."""
    for index, row in enumerate(rows):
        if any(module == name or module.startswith(name + ".") for name in row):
            return index
    return None


def imported_by(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules a module imports by absolute name (``from x import y``: ``x.y`` where
    that is a module, else ``x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in known else node.module)
    return found


def outside_the_layers(found: dict[str, Path], rows: list[list[str]]) -> list[str]:
    """The modules no layer holds, and why. A package whose modules sit in different
    rows (client_app, pflower) cannot be a row itself: its ``__init__`` runs whenever
    any of them is imported, so it may import only from the lowest row they sit in,
    or below it."""
    wrong = []
    for name, path in found.items():
        if row_of(name, rows) is not None:
            continue
        children = [row_of(m, rows) for m in found if m.startswith(name + ".")]
        children = [row for row in children if row is not None]
        if path.name != "__init__.py" or not children:
            wrong.append(f"{name}: in no layer")
            continue
        lowest = max(children)
        for target in sorted(imported_by(path, found)):
            row = row_of(target, rows)
            if target.split(".")[0] in PACKAGES and (row is None or row < lowest):
                wrong.append(f"{name} (its modules' lowest row: {lowest}) imports {target}")
    return wrong


def test_every_module_is_in_a_layer() -> None:
    found = modules(ROOT)
    assert "client_app.batched" in found and "harness.soak" in found
    assert outside_the_layers(found, layers()) == []


def test_a_module_in_no_layer_is_named(tmp_path: Path) -> None:
    """A new module of a package split across rows is in no layer until it is listed;
    the split package's ``__init__`` may not import above its modules' lowest row."""
    rows = [["deploy"], ["client_app.app"], ["client_app.base"], ["pflower.config"]]
    init = tmp_path / "__init__.py"
    init.write_text("from client_app import base\nimport pflower.config\n")
    found = {"client_app": init, "client_app.app": init, "client_app.base": init}
    assert outside_the_layers(found, rows) == []
    found["client_app.planted"] = tmp_path / "planted.py"
    init.write_text("import deploy.supervise\n")
    assert outside_the_layers(found, rows) == [
        "client_app (its modules' lowest row: 2) imports deploy.supervise",
        "client_app.planted: in no layer",
    ]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # import-linter's own command through this interpreter: the flwr 1.42 environment
    # is a layer over the 1.39 one and has the package but not its script in bin/
    command = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root packages' modules and pyproject.toml, copied once for the plants."""
    root = tmp_path_factory.mktemp("layers")
    for path in modules(ROOT).values():
        (root / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, root / path.relative_to(ROOT))
    shutil.copyfile(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_code_keeps_every_contract(copy: Path) -> None:
    kept = lint_imports(copy)
    assert kept.returncode == 0, kept.stdout[-3000:]
    assert "BROKEN" not in kept.stdout and LAYERS_CONTRACT in kept.stdout


# (the module planted in, the module it imports: one in a row above its own)
PLANTS = [
    ("client_app/batched.py", "deploy.supervise"),  # #102: it broke no contract before
    ("strategies/base.py", "methods"),
    ("methods/__init__.py", "server_app.app"),
    ("pflower/engine/inprocess.py", "harness.loopback"),
    ("models/__init__.py", "server_app.app"),
]


@pytest.mark.parametrize(("module", "target"), PLANTS, ids=[m for m, _ in PLANTS])
def test_a_planted_upward_import_breaks_the_layers(copy: Path, module: str, target: str) -> None:
    path = copy / module
    text = path.read_text()
    path.write_text(f"{text}\nimport {target}  # noqa\n")
    try:
        broken = lint_imports(copy)
    finally:
        path.write_text(text)
    importer = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert broken.returncode != 0
    assert f"{LAYERS_CONTRACT} (docs/ARCHITECTURE.md) BROKEN" in " ".join(broken.stdout.split())
    assert f"{importer} -> {target}" in broken.stdout, broken.stdout[-3000:]
