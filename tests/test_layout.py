"""The layout's rules (#47): a method ends at its package. No shared module names
a method or one of its keys: what is special about a method lives on its card
(methods/<name>/__init__.py) or its Params."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from methods import get_method, method_names

ROOT = Path(__file__).resolve().parents[1]
SHARED = (
    *("server_app", "client_app", "strategies", "models", "pfl_data", "pfl_privacy"),
    *("pfl_store", "pfl_patches", "run_config", "pflower_cli", "deploy", "harness"),
)
# a config that names no method runs FedAvg: the one name a shared module needs
ALLOWED = {("run_config/schema.py", "fedavg")}
ENGLISH = {"local"}  # method names that are also words: matched as a whole literal only
WORD = re.compile(r"[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)?")


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def method_names_in_code(path: Path) -> list[str]:
    """The method names and method keys (``fedfac.new-clients``) in a module's string
    literals, docstrings and comments left out."""
    names = set(method_names())
    namespaces = {get_method(m).params.namespace for m in names} - {""}
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            for word in WORD.findall(node.value):
                if word in ENGLISH and node.value.strip(" '\"") != word:
                    continue  # "a local path" is English; "local" alone names the method
                if word in names or ("." in word and word.split(".")[0] in namespaces):
                    found.append(word)
    return found


def test_no_shared_module_names_a_method() -> None:
    hits = {}
    for package in SHARED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            words = [w for w in method_names_in_code(path) if (rel, w) not in ALLOWED]
            if words:
                hits[rel] = sorted(set(words))
    assert hits == {}


def test_the_scan_finds_a_planted_method_name(tmp_path) -> None:
    planted = tmp_path / "leak.py"
    planted.write_text(
        '"""fedcp in a docstring is fine."""\nMODES = {"fedcp": {"fedfac.new-clients": 1}}\n'
    )
    assert method_names_in_code(planted) == ["fedcp", "fedfac.new-clients"]


def test_a_methods_own_attack_is_declared_on_its_card() -> None:
    """The attacks on a method's own machinery are listed on its card: named with
    another method, the config error names the methods that own it."""
    import pytest

    from methods import ConfigError, parse_run_config

    with pytest.raises(ConfigError, match="'attack': 'fa-steer' .*fedfac-static / fedfac-dynamic"):
        parse_run_config({"method": "fedavg", "attack": "fa-steer"})
    assert parse_run_config({"method": "fedfac-dynamic", "attack": "fa-steer"}).attack == "fa-steer"
    with pytest.raises(ConfigError, match="'match-magnet' .*factorized-fl-alpha, not"):
        parse_run_config({"method": "factorized-fl-beta", "attack": "match-magnet"})
