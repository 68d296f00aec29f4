"""``fab-reuse``: a ClientApp does not unpack a FAB installed already."""

from __future__ import annotations

import hashlib
import io
import tomllib
import zipfile
from pathlib import Path

from pflower.patches.core import check, enabled


def installed_fab(content: bytes, install_dir: Path | None = None) -> Path | None:
    """The directory where Flower installed this exact FAB before, named as Flower
    names it (publisher, name, version from its pyproject.toml; its hash), or None."""
    from flwr.common.config import get_metadata_from_config
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    try:
        with zipfile.ZipFile(io.BytesIO(content)) as fab:
            fab_id, fab_version = get_metadata_from_config(
                tomllib.loads(fab.read("pyproject.toml").decode())
            )
    except (KeyError, ValueError, zipfile.BadZipFile, tomllib.TOMLDecodeError):
        return None  # not a FAB Flower would install: its own install_from_fab says why
    publisher, name = fab_id.split("/", 1)
    digest = hashlib.sha256(content).hexdigest()[:FAB_HASH_TRUNCATION]
    base = install_dir.expanduser() if install_dir else get_flwr_home()
    path = base / APP_DIR / f"{publisher}.{name}.{fab_version}.{digest}"
    return path if path.is_dir() else None


def fab_reuse() -> bool:
    """``fab-reuse``: a ClientApp whose FAB is installed already does not unpack it
    again. Flower's ``install_from_fab`` unpacks every file of the FAB into a temporary
    directory and checks their hashes on every message, then, finding the directory of
    that FAB's hash installed, returns it untouched (0.6 s of a warm cifar-cnn4
    message). Here that directory is looked up first; the first message of a FAB
    installs it as Flower does."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.supernode.runtime import run_clientapp as runner

    unpack = runner.install_from_fab

    def install_from_fab(
        fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False
    ) -> Path:
        if skip_prompt and isinstance(fab_file, bytes):  # Flower returns it without a prompt
            if (path := installed_fab(fab_file, install_dir)) is not None:
                return path
        return unpack(fab_file, install_dir, skip_prompt)

    runner.install_from_fab = install_from_fab
    return True
