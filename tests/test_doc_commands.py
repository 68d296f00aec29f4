"""Every command written in the README and docs/ that takes ``--run-config`` goes
through the pre-flight (``check``) as a user would paste it: one that the page
says fails must fail with exit 2 and one line, every other must pass. A path a
page writes for the user's own data (/data/..., /srv/...) stands for a small image
folder made here; data this machine cannot have (a hub name, ImageNet weights,
offline) must fail with exit 2 naming its key."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pflower_cli.__main__ import check

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
USER_PATH = re.compile(r"(/(?:data|srv)/[\w./-]+)")
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


def _image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(120):  # enough for the default federation's 100 clients
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")
    return root


def test_the_pages_hold_the_commands_this_test_runs() -> None:
    assert len(CASES) >= 12
    assert any("dev.sh check" in c.values[0] for c in CASES)


def _user_data(path: str, tmp_path: Path) -> str:
    """A stand-in for the user's own data at ``path``: an image folder, or a parquet
    file in the Hugging Face schema made from one."""
    folder = _image_folder(tmp_path / path.strip("/").replace(".parquet", ""))
    if not path.endswith(".parquet"):
        return str(folder)
    import datasets

    out = tmp_path / "parquet" / Path(path).name
    out.parent.mkdir(exist_ok=True)
    datasets.load_dataset("imagefolder", data_dir=str(folder), split="train").to_parquet(str(out))
    return str(out)


def check_args(argv: list[str]) -> list[str]:
    """What ``check`` gets: after ``dev.sh check|run`` or ``pflower_cli check``;
    ``run . FEDERATION ...`` for ``flwr run``; a bare ``--run-config`` as it is."""
    if argv[:2] == ["flwr", "run"]:
        return argv[1:]
    for i, arg in enumerate(argv):
        if arg in ("check", "run") and i > 0:
            return argv[i + 1 :]
    return argv


@pytest.mark.parametrize(("command", "after"), CASES)
def test_every_documented_command_passes_the_preflight(command, after, tmp_path, capsys) -> None:
    missing = [p for p in re.findall(r"\.\./shared/[\w./-]+", command) if not (ROOT / p).exists()]
    if missing:
        pytest.skip(f"needs {missing} beside the checkout")
    argv = shlex.split(command)
    for i, arg in enumerate(argv):  # the user's own data: made here
        for key, value in re.findall(r"(dataset|client-data-paths)=['\"]([^'\"]+)['\"]", arg):
            paths = [
                _user_data(p, tmp_path) if USER_PATH.fullmatch(p) else p for p in value.split(",")
            ]
            arg = arg.replace(f"{key}='{value}'", f"{key}='{','.join(paths)}'")
        argv[i] = arg
    code = check(check_args(argv))
    out, err = capsys.readouterr()
    if any(s in after for s in SAID_TO_FAIL):
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
    elif code == 2 and any(s in err for s in OFFLINE):  # needs the internet
        assert "config key '" in err and len(err.strip().splitlines()) == 1
    else:
        assert code == 0, (command, err)
        assert out.startswith("ok: ")
