"""Where a client keeps its personal state between rounds.

Simulation: Flower's ``context.state`` (kept by the engine per node, in memory).
Deployment: an atomic on-disk store under the site's state directory, so the
personal part survives a SuperNode restart.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Protocol

import numpy as np
from flwr.common import Array, ArrayRecord, Context

log = logging.getLogger("flwr.pflower")

_RECORD = "pflower.personal"
_CHECKSUM = "__sha256__"


class PersonalStore(Protocol):
    def load(self) -> dict[str, np.ndarray] | None: ...

    def save(self, arrays: dict[str, np.ndarray]) -> None: ...


class ContextStore:
    """Personal arrays in ``context.state`` (the simulation fast path)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def load(self) -> dict[str, np.ndarray] | None:
        if _RECORD not in self.context.state:
            return None
        record = self.context.state[_RECORD]
        return {k: v.numpy() for k, v in record.items()}

    def save(self, arrays: dict[str, np.ndarray]) -> None:
        self.context.state[_RECORD] = ArrayRecord(
            # np.require keeps 0-d entries (BN num_batches_tracked) 0-d; ascontiguousarray would not
            array_dict={k: Array(np.require(v, requirements="C")) for k, v in arrays.items()}
        )


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
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


def write_checked_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` with a sha256 of their contents: to a temporary file in the
    same directory, fsync, then rename (a crash leaves the old file or the new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{_CHECKSUM: np.array(_digest(arrays))})
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DiskStore:
    """Personal arrays in ``<state_dir>/<experiment>/<site>.npz``, written
    atomically, with a checksum checked on load."""

    def __init__(self, state_dir: str | Path, experiment: str, site: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in site)
        self.path = Path(state_dir) / experiment / f"{safe}.npz"

    def load(self) -> dict[str, np.ndarray] | None:
        if not self.path.exists():
            return None
        try:
            arrays, digest = read_checked_npz(self.path)
        except ValueError as err:
            log.error(
                "personal state %s is corrupt (%s): re-initialising the personal part",
                self.path,
                err,
            )
            return None
        log.info("restored personal state from %s (sha256 %s)", self.path, digest)
        return arrays

    def save(self, arrays: dict[str, np.ndarray]) -> None:
        write_checked_npz(self.path, arrays)
