"""pflower/patches is the whole list: no other module of the product rebinds a Flower
or torch name, or reads their private attributes.

A scan of the source of every package the wheel installs (pyproject.toml), outside
pflower/patches, that fails naming each place it finds:

- a rebinding: an assignment, ``del`` or ``setattr`` on an attribute of a name
  imported from flwr or torch (``runner.push_message = ...``), including a module
  reached by ``import_module`` or ``sys.modules``; a change to any function's
  ``__kwdefaults__``, ``__defaults__`` or ``__code__``;
- a private read: ``x._name`` where ``x`` comes from a flwr or torch import
  (``nn.modules.batchnorm._BatchNorm``), or an import of a private name or module
  of theirs; ``x._name``, ``getattr(x, "_name")`` or ``x.__dict__["_name"]`` on
  any object but ``self``/``cls`` where ``_name`` is a private name Flower's source
  uses or torch's modules, tensors and optimizers have (``grid._runtime_client``),
  also when a function looks such names up from a literal list.

What ``ALLOWED`` names is not a patch (its reason says why); what ``PENDING`` names
is in a file another change owns and waits to move into pflower/patches.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("flwr", "torch")
PATCHES = Path("pflower") / "patches"
SPECIAL = ("__kwdefaults__", "__defaults__", "__code__")
LOOKUPS = ("getattr", "hasattr", "setattr", "delattr")

# what the scan names -> why it is no patch
ALLOWED = {
    "TaskIdentity.task_id": "Flower's public setter (server_app/nodes.py, as start_grid)",
    "TaskIdentity.run_id": "Flower's public setter (server_app/nodes.py, as start_grid)",
    "TaskIdentity.node_id": "Flower's public setter (server_app/nodes.py, as start_grid)",
}
# what the scan names -> where it is and what it waits for (another change owns the file)
PENDING: dict[str, str] = {}  # none now: site_info asks grid.deployed(), build.py
# pflower.patches.hooks_left, roles.py and fedfac name torch's public batch norms


# torch's sources whose private names the scan knows: modules, tensors, optimizers
TORCH_SOURCES = ("nn/modules/module.py", "_tensor.py", "nn/parameter.py", "optim/optimizer.py")


@cache
def private_names() -> frozenset[str]:
    """The private names Flower's installed source uses, and those of torch's
    modules, tensors and optimizers (read, not imported)."""
    token = re.compile(r"\b_[a-z][a-z0-9_]*\b")
    paths = [*_source("flwr").rglob("*.py"), *(_source("torch") / n for n in TORCH_SOURCES)]
    return frozenset(n for p in paths for n in token.findall(p.read_text(errors="replace")))


def _source(library: str) -> Path:
    spec = find_spec(library)
    assert spec is not None and spec.origin is not None, library
    return Path(spec.origin).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _from_library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _library_module(value: ast.AST) -> bool:
    """``import_module("flwr...")``, ``sys.modules["flwr..."]`` or its ``.get``."""
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Constant):
        name = value.args[0].value
        called = ast.unparse(value.func)
        looked_up = called.endswith("import_module") or called == "sys.modules.get"
        return looked_up and isinstance(name, str) and _from_library(name)
    if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "sys.modules":
        key = value.slice
        return (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and _from_library(key.value)
        )
    return False


def names_of_libraries(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names a module binds to flwr or torch (by import or lookup), and those it
    binds to any other import."""
    ours, others = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                (ours if _from_library(alias.name) else others).add(bound)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound = alias.asname or alias.name
                (ours if _from_library(node.module) else others).add(bound)
        elif isinstance(node, ast.Assign) and _library_module(node.value):
            ours |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return ours, others - ours


def findings(relative: str, text: str) -> list[tuple[str, int, str]]:
    """Each (file, line, what) in one module's source that only pflower/patches may do."""
    tree = ast.parse(text)
    ours, others = names_of_libraries(tree)
    private = private_names()
    found: list[tuple[int, str]] = []

    def from_ours(node: ast.AST) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in ours

    def foreign(node: ast.AST) -> bool:  # not self/cls, not another library's name
        root = _root(node)
        if isinstance(node, ast.Name) and node.id in ("self", "cls"):
            return False
        return not (isinstance(root, ast.Name) and root.id in others)

    def rebinding(target: ast.AST, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for item in target.elts:
                rebinding(item, line)
        elif isinstance(target, ast.Attribute) and from_ours(target):
            found.append((line, ast.unparse(target)))
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute):
            if target.value.attr in SPECIAL:
                found.append((line, ast.unparse(target)))
        if isinstance(target, ast.Attribute) and target.attr in SPECIAL:
            found.append((line, ast.unparse(target)))

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                rebinding(target, line)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            rebinding(node.target, line)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                rebinding(target, line)
        elif isinstance(node, ast.ImportFrom) and node.module and _from_library(node.module):
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(_private(p) for p in parts):
                found.append((line, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _from_library(alias.name) and any(_private(p) for p in alias.name.split(".")):
                    found.append((line, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if from_ours(node.value) or (node.attr in private and foreign(node.value)):
                found.append((line, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            key = node.slice
            if node.value.attr == "__dict__" and isinstance(key, ast.Constant):
                if isinstance(key.value, str) and _private(key.value) and key.value in private:
                    found.append((line, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in LOOKUPS and len(node.args) >= 2:
                obj, name = node.args[0], node.args[1]
                literal = isinstance(name, ast.Constant) and isinstance(name.value, str)
                if node.func.id in ("setattr", "delattr") and from_ours(obj):
                    found.append((line, ast.unparse(node)))
                elif literal and _private(name.value) and foreign(obj):
                    if name.value in private or from_ours(obj):
                        found.append((line, ast.unparse(node)))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _looked_up_from_a_list(node, private)
    return [(relative, line, what) for line, what in sorted(set(found))]


def _looked_up_from_a_list(
    function: ast.FunctionDef | ast.AsyncFunctionDef, private: frozenset[str]
) -> list[tuple[int, str]]:
    """Flower's or torch's private names in a literal list of a function that looks
    attributes up by a computed name."""
    computed = any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in LOOKUPS
        and len(n.args) >= 2
        and not isinstance(n.args[1], ast.Constant)
        for n in ast.walk(function)
    )
    if not computed:
        return []
    return [
        (item.lineno, ast.unparse(item))
        for n in ast.walk(function)
        if isinstance(n, (ast.Tuple, ast.List, ast.Set))
        for item in n.elts
        if isinstance(item, ast.Constant)
        and isinstance(item.value, str)
        and _private(item.value)
        and item.value in private
    ]


def product_files() -> list[Path]:
    """Every module of the packages the wheel installs, but pflower/patches."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    files = [p for package in packages for p in sorted((ROOT / package).rglob("*.py"))]
    return [p for p in files if not p.relative_to(ROOT).is_relative_to(PATCHES)]


@cache
def scan() -> tuple[tuple[str, int, str], ...]:
    out = []
    for path in product_files():
        out += findings(path.relative_to(ROOT).as_posix(), path.read_text())
    return tuple(out)


def test_no_module_outside_pflower_patches_rebinds_or_reads_flower_or_torch_privates() -> None:
    listed = ALLOWED.keys() | PENDING.keys()
    places = [f"{f}:{line}: {what}" for f, line, what in scan() if what not in listed]
    assert places == [], (
        "a Flower or torch internal rebound or read outside pflower/patches (make it a "
        "patch there, with its version check and off switch):\n" + "\n".join(places)
    )


def test_each_place_listed_as_allowed_or_waiting_is_still_there() -> None:
    """A place that moved into pflower/patches leaves the lists, so they never hide
    a new one."""
    seen = {what for _, _, what in scan()}
    assert sorted((ALLOWED.keys() | PENDING.keys()) - seen) == []


def test_the_scan_names_a_planted_rebinding_or_private_read() -> None:
    """Each kind of place, planted in a module's source, is named with its line."""
    planted = {
        "from flwr.supernode.runtime import run_clientapp as runner\n"
        "runner.push_message = print\n": "runner.push_message",
        "import flwr.supernode.runtime.run_clientapp as r\nsetattr(r, 'flwr_exit', print)\n": (
            "setattr(r, 'flwr_exit', print)"
        ),
        "from importlib import import_module\nm = import_module('flwr.common')\n"
        "m.now = print\n": "m.now",
        "import sys\nm = sys.modules['torch.optim']\ndel m.SGD\n": "m.SGD",
        "def f(x=1): pass\nf.__defaults__ = (2,)\n": "f.__defaults__",
        "from torch import nn\nBN = nn.modules.batchnorm._BatchNorm\n": (
            "nn.modules.batchnorm._BatchNorm"
        ),
        "from torch._dynamo import config\n": "from torch._dynamo import ...",
        "def f(self):\n    return self._grid._runtime_client\n": "self._grid._runtime_client",
        "def f(view, c):\n    view._client = c\n": "view._client",
        "def f(grid):\n    return getattr(grid, '_client', None)\n": (
            "getattr(grid, '_client', None)"
        ),
        "def f(m):\n    for n in ('_forward_hooks',):\n        getattr(m, n)\n": (
            "'_forward_hooks'"
        ),
        "def f(msg):\n    return msg.metadata.__dict__['_message_id']\n": (
            "msg.metadata.__dict__['_message_id']"
        ),
    }
    for source, what in planted.items():
        lines = range(1, source.count("\n") + 1)
        assert [(w, line in lines) for _, line, w in findings("x.py", source)] == [(what, True)]
    # not Flower's or torch's: our own privates, another library's, Flower's public API
    clean = (
        "import os\nclass A:\n    def f(self, other):\n        self._grid = 1\n"
        "        os._exit(0)\n        return other._wakes\n"
        "from flwr.common import Message\ndef g(m):\n    m.content = 1\n"
    )
    assert findings("x.py", clean) == []
