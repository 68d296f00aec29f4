"""The patches of Flower and torch internals (pflower.patches): one table of what is
patched and the versions checked, a refusal in one line for any other version, and
a switch that runs Flower and torch as they are."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pflower.patches

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_the_table_lists_every_patch_and_every_patch_function_is_in_it() -> None:
    doc = pflower.patches.__doc__ or ""
    functions = {"linkstate-index", "supernode-backoff", "object-retries", "superexec-fork"}
    functions |= {"optimizers-without-dynamo", "secagg-masks"}
    assert set(pflower.patches.PATCHES) == functions
    for name in functions:
        assert f"``{name}``" in doc  # the table row
    for library in pflower.patches.TESTED:
        assert all(v.rstrip(".") in doc for v in pflower.patches.TESTED[library])


def test_the_installed_versions_are_the_checked_ones() -> None:
    pflower.patches.check()  # raises on this machine's versions otherwise


def test_an_untested_version_is_refused_in_one_line_naming_the_switch(monkeypatch) -> None:
    monkeypatch.setattr(pflower.patches, "version", lambda lib: "9.9.9")
    with pytest.raises(pflower.patches.UntestedVersion) as err:
        pflower.patches.check(("flwr",))
    message = str(err.value)
    assert "\n" not in message and "flwr 9.9.9" in message and "PFLOWER_FLOWER_PATCHES=0" in message
    assert "linkstate-index" in message
    monkeypatch.setenv("PFLOWER_FLOWER_PATCHES", "0")
    pflower.patches.check(("flwr", "torch"))  # the switch: nothing patched, nothing to check


def test_no_other_module_patches_a_flower_or_torch_internal() -> None:
    """Assignments into flwr or torch modules live in pflower.patches only."""
    import re

    assign = re.compile(
        r"^\s*(loop|superexec|vce_api|InMemoryLinkState|torch\.optim)\.\w+\s*=", re.M
    )
    kwdefaults = re.compile(r"__kwdefaults__\[")
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".venv") or rel.parts[0] == "tests":
            continue
        if rel.parts[:2] == ("pflower", "patches"):
            continue
        text = path.read_text()
        if assign.search(text) or kwdefaults.search(text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_switch_runs_flower_and_torch_as_they_are() -> None:
    code = (
        "import os; os.environ['PFLOWER_FLOWER_PATCHES'] = '0'; import torch; "
        "from client_app.train import SGD, Adam; import server_app.app; "
        "from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState as S; "
        "assert SGD is torch.optim.SGD and Adam is torch.optim.Adam; "
        "assert not getattr(S, '_pflower_indexed', False); print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
