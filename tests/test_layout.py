"""The layout's rules (#47): a method ends at its package. No shared module names
a method or one of its keys: what is special about a method lives on its card
(methods/<name>/__init__.py) or its Params."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from methods import get_method, method_names

ROOT = Path(__file__).resolve().parents[1]
# the design's parts (#47): what `ls` shows besides dotfiles, README, pyproject, constraints
TOP_LEVEL = {
    *("server_app", "client_app", "strategies", "models", "methods", "pflower"),
    *("deploy", "docker", "benchmarks", "harness", "tests", "docs", "scripts"),
}
# the wheel: the product's packages, none a test, benchmark or harness
WHEEL = ["server_app", "client_app", "strategies", "models", "methods", "pflower", "deploy"]
SHARED = (*("server_app", "client_app", "strategies", "models", "pflower", "deploy", "harness"),)
# a config that names no method runs FedAvg: the one name a shared module needs
# and the soak harness's workload is one method's run (#93: the FedPer preset)
ALLOWED = {
    ("pflower/config/schema.py", "fedavg"),
    ("harness/soak.py", "fedper"),
    ("harness/soak_check.py", "fedper"),
}
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


def _tracked_top_level() -> set[str]:
    import subprocess

    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {f.split("/")[0] for f in files if not f.startswith(".")}


def test_the_top_level_is_the_designs_parts() -> None:
    import tomllib

    files = {"README.md", "pyproject.toml", "constraints.txt", "constraints-flwr142.txt"}
    assert _tracked_top_level() - files == TOP_LEVEL and len(TOP_LEVEL) <= 13
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == WHEEL


def test_the_flower_142_pins_are_the_139_pins_but_four() -> None:
    """The second Flower line's environment differs from the tested one only where
    flwr 1.42 requires it; the project admits both lines and nothing between."""
    import tomllib

    def pins(name: str) -> dict[str, str]:
        lines = (ROOT / name).read_text().splitlines()
        return dict(ln.split("==", 1) for ln in lines if ln and not ln.startswith("#"))

    old, new = pins("constraints.txt"), pins("constraints-flwr142.txt")
    assert old.keys() == new.keys()
    assert {k for k in old if old[k] != new[k]} == {"flwr", "certifi", "cryptography", "uv"}
    assert old["flwr"].startswith("1.39.") and new["flwr"].startswith("1.42.")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (flwr,) = [d for d in deps if d.startswith("flwr[")]
    assert flwr == "flwr[simulation]>=1.39,<1.43,!=1.40.*,!=1.41.*"


def test_torchs_bound_is_what_the_patches_accept() -> None:
    """pyproject.toml admits the torch lines pflower.patches was checked against (its
    check refuses any other), torchvision the lines paired with them, and both pins
    files pin one of each."""
    import tomllib

    from packaging.requirements import Requirement

    from pflower.patches import TESTED

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    bound = {r.name: r.specifier for r in map(Requirement, deps)}
    accepted = {int(v.split(".")[1]) for v in TESTED["torch"] if v.startswith("2.")}
    assert accepted and all(v.count(".") == 2 and v.endswith(".") for v in TESTED["torch"])
    for minor in range(40):  # torch 2.x goes with torchvision 0.(x + 15)
        assert bound["torch"].contains(f"2.{minor}.1") == (minor in accepted), minor
        assert bound["torchvision"].contains(f"0.{minor + 15}.1") == (minor in accepted), minor
    for pins in ("constraints.txt", "constraints-flwr142.txt"):
        lines = (ROOT / pins).read_text().splitlines()
        pin = dict(ln.split("==", 1) for ln in lines if ln and not ln.startswith("#"))
        assert bound["torch"].contains(pin["torch"]), pins
        assert bound["torchvision"].contains(pin["torchvision"]), pins
        assert int(pin["torchvision"].split(".")[1]) == int(pin["torch"].split(".")[1]) + 15


def _wheel_names(out: Path) -> list[str]:
    """The files of the wheel ``pip wheel . --no-deps`` builds from this checkout:
    offline where hatchling is installed, else in pip's own build environment."""
    import importlib.util
    import sys
    import zipfile

    isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-build-isolation"]
    command = [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", str(out)]
    built = subprocess.run(
        [*command, *isolation], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_holds_the_product_and_no_harness(tmp_path: Path) -> None:
    """A site's wheel installs the product's packages and none of the test harnesses
    (harness/: the loopback federation, the soak, the Ray cluster rig)."""
    names = _wheel_names(tmp_path)
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == set(WHEEL)
    assert "deploy/site.py" in names and "client_app/app.py" in names
    harness = [n for n in names if any(w in n for w in ("soak", "loopback", "ray_cluster"))]
    assert harness == []


def class_sizes(paths: list[Path]) -> dict[str, int]:
    """Lines of every class in these modules, by ``path:Class``."""
    sizes = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                sizes[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return sizes


def test_every_class_in_the_repository_is_under_200_lines() -> None:
    """No class grows back into the 405-line strategy base of #34, FedFac's 328-line
    strategy or the 325-line loopback federation of #47."""
    sizes = class_sizes([p for d in sorted(TOP_LEVEL) for p in (ROOT / d).rglob("*.py")])
    assert (
        "strategies/base.py:PFLStrategy" in sizes
        and "harness/loopback.py:LoopbackFederation" in sizes
    )
    assert {k: v for k, v in sizes.items() if v >= 200} == {}


def test_the_size_check_counts_a_long_class(tmp_path: Path) -> None:
    planted = ROOT / "tests" / f"_planted_{tmp_path.name}.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(200))
    planted.write_text(f"class Big:\n{body}")
    try:
        assert class_sizes([planted]) == {f"tests/{planted.name}:Big": 201}
    finally:
        planted.unlink()


def test_a_methods_keys_are_typed_as_its_own_params() -> None:
    from methods import parse_run_config
    from methods.ditto import DittoParams
    from methods.fedfac import FedFacParams

    cfg = parse_run_config({"method": "fedfac-static", "fedfac.fa-quantile": 0.25})
    assert FedFacParams.of(cfg).fa_quantile == 0.25
    with pytest.raises(TypeError, match="method 'fedfac-static' holds FedFacParams, not Ditto"):
        DittoParams.of(cfg)


SERVER_APP = {"__init__", "app", "grid", "method_strategy", "nodes", "site_info"}


def test_server_app_holds_only_the_server_app() -> None:
    """The ServerApp and what it runs on (its grid, the simulated nodes, the sites'
    data answers, a method's strategy); engines and harnesses that compose both apps
    live above it (pflower/engine/, harness/)."""
    assert {p.stem for p in (ROOT / "server_app").glob("*.py")} == SERVER_APP


@pytest.mark.parametrize(
    "card", sorted(p.parent.name for p in (ROOT / "methods").glob("*/__init__.py"))
)
def test_a_method_card_imports_no_torch(card: str) -> None:
    """The pre-flight reads every card (docs/ADDING_A_METHOD.md): no torch in one."""
    tree = ast.parse((ROOT / "methods" / card / "__init__.py").read_text())
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] == "torch"]
