"""Every command written in the README and docs/ that takes ``--run-config`` goes
through the pre-flight (``check``) as a user would paste it: one that the page
says fails must fail with exit 2 and one line, every other must pass. A path a
page writes for the user's own data (/data/..., /srv/...) or this repository's
(../shared/data/...) stands for a small image folder or parquet file made here; data this machine cannot have (a hub name, ImageNet weights,
offline) must fail with exit 2 naming its key.

Every such command that runs on this machine's local simulation then goes through
``run`` (``bash scripts/dev.sh run``, the real ``flwr run`` with Ray): the short
ones, on the embedded default data, exactly as written; those naming a dataset for
one round of a tenth of the clients (their training is minutes a round here), so
that every documented config is seen to train, not only to pass ``check``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pflower.cli.__main__ import check, deployment_named, split_args
from tests.helpers import image_folder, local_superlink_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
USER_PATH = re.compile(r"(/(?:data|srv)/[\w./-]+|\.\./shared/[\w./-]+)")
PLACEHOLDER = re.compile(r"<[^>]+>|'X'|'M'")
OFFLINE = ("cannot be reached", "local path via dataset=")
SAID_TO_FAIL = ("exit 2", "config error", "config key '")


def commands(page: Path) -> list[tuple[str, str]]:
    """(command, what the page says of it: its comment, or the rest of its sentence)
    for each command with --run-config."""
    text = page.read_text()
    out = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command, _, comment = line.partition(" # ")
            if "--run-config" in command:
                out.append((" ".join(command.split()), comment))
    prose = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.S)
    for match in re.finditer(r"`([^`]+)`", prose):
        if "--run-config" in match[1]:
            after = re.split(r"[.;]\s", prose[match.end() : match.end() + 300])[0]  # its sentence
            out.append((" ".join(match[1].replace("\\\n", " ").split()), after))
    return out


CASES = [
    pytest.param(cmd, after, id=f"{page.name}:{cmd[:60]}")
    for page in PAGES
    for cmd, after in commands(page)
    if re.search(r"--run-config\s+[\"']", cmd) and not PLACEHOLDER.search(cmd)
]


def test_the_pages_hold_the_commands_this_test_runs() -> None:
    assert len(CASES) >= 12
    assert any("dev.sh check" in c.values[0] for c in CASES)


def _user_data(path: str, tmp_path: Path, classes: tuple[str, ...] = ("a", "b")) -> str:
    """A stand-in for the data at ``path`` (the user's own, or ../shared's): a small
    image folder (of the command's ``class-names`` where it names them), or, for a parquet file (CIFAR-10 on every page), one in the Hugging
    Face schema with CIFAR-10's shape, 10 classes and 700 rows a class: enough for
    the default federation's 100 clients and the per-client partitioners."""
    if not path.endswith(".parquet"):
        root = tmp_path / "data" / Path(path).stem
        return str(image_folder(root, classes, per_class=120, side=32))
    import datasets
    from PIL import Image

    names = [f"class{k}" for k in range(10)]
    shades = [Image.new("RGB", (32, 32), (25 * k, 255 - 25 * k, 100)) for k in range(10)]
    rows = {"img": [shades[k] for k in range(10) for _ in range(700)]}
    rows["label"] = [k for k in range(10) for _ in range(700)]
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=names)}
    )
    out = tmp_path / "parquet" / Path(path).name
    out.parent.mkdir(exist_ok=True)
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(out))
    return str(out)


def check_args(argv: list[str]) -> list[str]:
    """What ``check`` gets: after ``dev.sh check|run`` or ``pflower.cli check``;
    ``run . FEDERATION ...`` for ``flwr run``; a bare ``--run-config`` as it is."""
    if argv[:2] == ["flwr", "run"]:
        return argv[1:]
    for i, arg in enumerate(argv):
        if arg in ("check", "run") and i > 0:
            return argv[i + 1 :]
    return argv


def local_argv(command: str, tmp_path: Path) -> list[str]:
    """The command's words, the user's own data in it made here."""
    argv = shlex.split(command)
    named = re.search(r"class-names=['\"]([^'\"]+)['\"]", command)
    classes = tuple(named[1].split(",")) if named else ("a", "b")
    for i, arg in enumerate(argv):
        for key, value in re.findall(r"(dataset|client-data-paths)=['\"]([^'\"]+)['\"]", arg):
            paths = [
                _user_data(p, tmp_path, classes) if USER_PATH.fullmatch(p) else p
                for p in value.split(",")
            ]
            arg = arg.replace(f"{key}='{value}'", f"{key}='{','.join(paths)}'")
        argv[i] = arg
    return argv


@pytest.mark.parametrize(("command", "after"), CASES)
def test_every_documented_command_passes_the_preflight(command, after, tmp_path, capsys) -> None:
    code = check(check_args(local_argv(command, tmp_path)))
    out, err = capsys.readouterr()
    if any(s in after for s in SAID_TO_FAIL):
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
    elif code == 2 and any(s in err for s in OFFLINE):  # needs the internet
        assert "config key '" in err and len(err.strip().splitlines()) == 1
    else:
        assert code == 0, (command, err)
        assert out.startswith("ok: ")


def runs_here(command: str, after: str) -> bool:
    """A command meant to succeed on the local simulation, with nothing from the
    internet: not one the page says fails, not a named deployment (``. pflower``, or
    a deployment's own tool such as ``python -m deploy.supervise``), not ImageNet
    weights."""
    _, _, rest = split_args(check_args(shlex.split(command)))
    return (
        not any(s in after for s in SAID_TO_FAIL)
        and not command.startswith("python -m deploy.")
        and not deployment_named(rest)
        and "pretrained-weights='imagenet'" not in command
    )


RUN_CASES = [  # one of each: the README and docs/USAGE.md share one
    pytest.param(cmd, id=f"{name}:{cmd[:60]}")
    for cmd, name in {
        tuple(check_args(shlex.split(cmd))): (cmd, page.name)
        for page in PAGES
        for cmd, after in commands(page)
        if re.search(r"--run-config\s+[\"']", cmd) and not PLACEHOLDER.search(cmd)
        if runs_here(cmd, after)
    }.values()
]


@pytest.fixture(scope="module")
def flwr_home(tmp_path_factory):
    """One Flower home (and so one local SuperLink) for these runs, stopped after."""
    from tests.test_flwr_run import _stop_local_superlink

    home = tmp_path_factory.mktemp("flwr-home")
    yield home
    _stop_local_superlink(home)


def test_the_runs_are_the_short_default_ones_and_every_image_one() -> None:
    runs = [c.values[0] for c in RUN_CASES]
    assert len(runs) >= 4
    assert any("method='ditto'" in c for c in runs)  # ADDING_A_METHOD.md's
    assert any("dataset=" in c for c in runs) and any("dataset=" not in c for c in runs)


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN_CASES)
def test_every_documented_local_command_runs(command, tmp_path, flwr_home) -> None:
    argv = check_args(local_argv(command, tmp_path))
    if argv[:1] == ["run"]:  # `flwr run . ...`: what dev.sh run gives flwr run
        argv = argv[1:]
    # the embedded default: as written; the user's own data: one short round
    short = "dataset=" not in command and "client-data-paths=" not in command
    rounds = [] if short else ["--run-config", "num-server-rounds=1 fraction-fit=0.1"]
    out = tmp_path / "out"
    pinned = ["--run-config", f"output-dir='{out}' run-name='doc'"]
    env = {
        **os.environ,
        **local_superlink_env(flwr_home),
        "VENV": str(Path(sys.executable).parent.parent),
        "PFLOWER_SKIP_SETUP": "1",
    }
    proc = subprocess.run(
        ["bash", "scripts/dev.sh", "run", *argv, *rounds, *pinned],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "run finished: every round recorded" in proc.stdout, log[-4000:]
    results = json.loads((out / "doc" / "results.json").read_text())
    assert results["rounds"][-1]["round"] == results["config"]["num-server-rounds"]
    if not short:
        assert results["config"]["num-server-rounds"] == 1
