"""The virtual environment pfl-research runs in (``.venv-pfl``, beside ``.venv``):
its pins differ from ours, so it is its own environment, made on first use.

It sees the product's environment underneath (a ``.pth`` file): pfl and its own
dependencies are installed into ``.venv-pfl`` and win; torch and numpy come from
ours, so both frameworks run the very same torch build. ``pip`` needs the package
index once (offline: a clear error, and the rows of pfl-research are marked failed).
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

from benchmarks.presets import REPO

PFL_VERSION = "0.6.0"
VENV = REPO / ".venv-pfl"


def pfl_python() -> Path:
    """The environment's interpreter, made (venv, ``.pth``, ``pip install``) if missing."""
    python = VENV / "bin" / "python"
    ready = VENV / ".installed"
    if ready.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    target = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(target) / "_product_venv.pth").write_text(site.getsitepackages()[0] + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", f"pfl[pytorch]=={PFL_VERSION}"]
    done = subprocess.run(pip, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"installing pfl-research {PFL_VERSION} into {VENV} failed (it needs the package "
            f"index once): {done.stderr.strip()[-400:]}"
        )
    ready.touch()
    return python
