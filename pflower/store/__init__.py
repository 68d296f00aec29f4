"""Checked, atomic .npz files: a client's personal state on disk and the server's
checkpoint are both written and read through here (neither side imports the other).
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

_CHECKSUM = "__sha256__"
# a simulated run's clients keep their personal state here, inside the run's directory
# (beside the server's checkpoint), so that the run can resume with it
PERSONAL_STATE_DIR = "personal-state"
# what a site's personal-state store did during this process's current ClientApp task
# (restored, corrupt, saved: each with its sha256): the site's own SuperExec puts it
# in that task's ledger line and empties it (deploy/site_guard.py); bounded, as nothing
# empties it in a simulation
STATE_EVENTS: deque[dict[str, Any]] = deque(maxlen=32)


def clients_that_train(num_clients: int, rounds: int, fraction_fit: float) -> int:
    """The most clients a simulated run of ``rounds`` rounds can train, each round
    asking ceil(fraction-fit x clients) (at least 1), as the sampler does: only these
    can hold personal state, whatever the federation's size."""
    per_round = max(1, math.ceil(fraction_fit * num_clients))
    return min(num_clients, max(0, rounds) * per_round)


def state_on_disk(run_dir: Path) -> tuple[int, int]:
    """(clients, bytes) of the personal state a simulated run keeps on disk."""
    clients, size = 0, 0
    root = Path(run_dir) / PERSONAL_STATE_DIR
    if not root.is_dir():
        return 0, 0
    with os.scandir(root) as folders:
        for folder in folders:
            if folder.is_dir():
                clients += 1
                with os.scandir(folder.path) as files:
                    size += sum(f.stat().st_size for f in files if f.is_file())
    return clients, size


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.reshape(-1).view(np.uint8))  # tobytes()'s bytes, without copying them
    return h.hexdigest()


def read_checked_npz(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """(arrays, sha256) of a file written by ``write_checked_npz``; ValueError if
    the file is unreadable or its checksum does not match."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        stored = str(arrays.pop(_CHECKSUM))
    except Exception as err:  # noqa: BLE001 - any unreadable file means the same thing
        raise ValueError(f"unreadable ({type(err).__name__}: {err})") from None
    if stored != _digest(arrays):
        raise ValueError("checksum mismatch")
    return arrays, stored


def write_checked_npz(path: Path, arrays: dict[str, np.ndarray]) -> str:
    """Write ``arrays`` with a sha256 of their contents: to a temporary file in the
    same directory, fsync, then rename (a crash leaves the old file or the new);
    returns the sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    checksum = np.array(_digest(arrays))
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays, **{_CHECKSUM: checksum})  # straight to the file: no copy
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(checksum)


def append_line(path: Path, data: bytes) -> None:
    """Append one line whole or not at all (O_APPEND: concurrent appends never
    interleave): a write cut short (a full disk) is truncated away and raised, so a
    log read later never holds half a line."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
        except OSError:
            os.ftruncate(fd, size)
            raise
        if written != len(data):
            os.ftruncate(fd, size)
            raise OSError(28, f"{path}: {written} of {len(data)} bytes written (no space left?)")
    finally:
        os.close(fd)
