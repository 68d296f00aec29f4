"""benchmarks/ holds what a user runs, benchmarks/studies/ the one-off studies: every
module of both imports, every one with a command line answers ``--help`` (exit 0, its
usage printed), benchmarks/ keeps at most 14 modules of its own, each named in
docs/USAGE.md or docs/PERFORMANCE.md, and each study says first what it answered and
where the answer is written. Seconds: nothing here trains."""

from __future__ import annotations

import ast
import importlib
import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("benchmarks", "benchmarks.studies")
MAX_OWN_MODULES = 15  # issue #95: what a user runs, the studies apart; #103: PFLlib's peer


def module_names(package: str) -> list[str]:
    folder = ROOT / package.replace(".", "/")
    return [
        package if path.stem == "__init__" else f"{package}.{path.stem}"
        for path in sorted(folder.glob("*.py"))
    ]


MODULES = [name for package in PACKAGES for name in module_names(package)]


def source_of(name: str) -> Path:
    path = ROOT / name.replace(".", "/")
    module = path.with_suffix(".py")  # benchmarks/presets.py beside benchmarks/presets/
    return module if module.exists() else path / "__init__.py"


def has_cli(name: str) -> bool:
    return 'if __name__ == "__main__":' in source_of(name).read_text()


def help_of(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    """(exit code, stdout) of ``python -m NAME --help``, run in this process as ``-m`` runs
    it (``benchmarks.__main__`` is ``python -m benchmarks``)."""
    target = name.removesuffix(".__main__")
    argv, sys.argv = sys.argv, [target, "--help"]
    try:
        with warnings.catch_warnings():  # the module is imported already: runpy says so
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(target, run_name="__main__", alter_sys=False)
        code: object = "returned without exiting"
    except SystemExit as done:
        code = done.code
    finally:
        sys.argv = argv
    return code, capsys.readouterr().out


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports_and_its_command_line_answers_help(name, capsys) -> None:
    importlib.import_module(name)
    if not has_cli(name):
        return
    code, out = help_of(name, capsys)
    assert code in (0, None), (name, code)
    assert out.startswith("usage: "), (name, out[:200])


def test_the_help_check_fails_on_a_command_line_that_breaks(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "p95_broken_cli.py"
    broken.write_text('import sys\nif __name__ == "__main__":\n    sys.exit(int(sys.argv[1]))\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError):  # "--help" is not a number: the check sees it fail
        help_of("p95_broken_cli", capsys)


def test_benchmarks_keeps_few_modules_each_named_in_the_docs() -> None:
    own = module_names("benchmarks")
    assert len(own) <= MAX_OWN_MODULES, own
    docs = (ROOT / "docs/USAGE.md").read_text() + (ROOT / "docs/PERFORMANCE.md").read_text()
    named = set(re.findall(r"benchmarks[./](\w+)", docs))
    if "python -m benchmarks " in docs:
        named.add("__main__")
    unnamed = [m for m in own if m != "benchmarks" and m.rsplit(".", 1)[1] not in named]
    assert unnamed == [], "name each in docs/USAGE.md or docs/PERFORMANCE.md: what it is for"


@pytest.mark.parametrize("name", module_names("benchmarks.studies")[1:])
def test_each_study_says_first_what_it_answered_and_where(name) -> None:
    doc = ast.get_docstring(ast.parse(source_of(name).read_text())) or ""
    first = doc.split("\n\n")[0]
    assert first.startswith("Answered ("), first
    written = re.findall(r"((?:docs|pflower)/[\w./-]+\.(?:md|py))", first)
    assert written and all((ROOT / w).exists() for w in written), first
