"""Checked, atomic .npz files: a client's personal state on disk and the server's
checkpoint are both written and read through here (neither side imports the other).

Each file holds its arrays and a digest of them (their names, dtypes, shapes and
bytes), checked when it is read: sha256 (a deployed site's personal state, small), or
xxHash's XXH3-128 (the server's checkpoint and a simulated run's spilled personal
state, large: many times faster than sha256;
docs/notes/2026-12-06-the-client-paths-cpu-and-cnn4-as-a-cohort.md measured it).
Either digest catches a corrupt or truncated file (a flipped bit, a lost member) as
the zip's own CRC-32 of each member does; neither is a signature (the file carries it).
A file is written straight from the arrays' memory, a megabyte at a time: the zip's
CRC, the write and the digest read each piece while it is in the cache (``np.savez``
copies each array once more first).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import tempfile
import zipfile
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

# the digest's member, by algorithm (a file has one; "sha256" is the files' of before)
DIGESTS = {"sha256": "__sha256__", "xxh3": "__xxh3_128__"}
_CHUNK = 1 << 20  # bytes written and hashed at a time, while in the cache
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


def _hasher(algorithm: str) -> Any:
    return hashlib.sha256() if algorithm == "sha256" else xxhash.xxh3_128()


def _data(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without copying them (``tobytes()``'s bytes)."""
    return memoryview(array.reshape(-1).view(np.uint8))


def _about(h: Any, key: str, a: np.ndarray) -> None:
    h.update(key.encode())
    h.update(str(a.dtype).encode())
    h.update(str(a.shape).encode())


def _digest(arrays: dict[str, np.ndarray], algorithm: str = "sha256") -> str:
    h = _hasher(algorithm)
    for key in sorted(arrays):
        a = np.require(arrays[key], requirements="C")  # 0-d stays 0-d
        _about(h, key, a)
        h.update(_data(a))
    return h.hexdigest()


def read_checked_npz(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """(arrays, hex digest) of a file written by ``write_checked_npz``;
    ValueError if the file is unreadable (a member's CRC too) or its digest does not
    match."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        algorithm = next(a for a, key in DIGESTS.items() if key in arrays)
        stored = str(arrays.pop(DIGESTS[algorithm]))
    except Exception as err:  # noqa: BLE001 - any unreadable file means the same thing
        raise ValueError(f"unreadable ({type(err).__name__}: {err})") from None
    if stored != _digest(arrays, algorithm):
        raise ValueError("checksum mismatch")
    return arrays, stored


def write_checked_npz(path: Path, arrays: dict[str, np.ndarray], algorithm: str = "sha256") -> str:
    """Write ``arrays`` and their digest (``DIGESTS``) as an .npz (``np.load`` reads
    it): to a temporary file in the same directory, fsync, then rename (a crash leaves
    the old file or the new); returns the digest (hex), as ``read_checked_npz`` does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            h = _hasher(algorithm)
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
                for key in sorted(arrays):
                    _member(npz, key, np.require(arrays[key], requirements="C"), h)
                digest = h.hexdigest()
                _member(npz, DIGESTS[algorithm], np.array(digest), None)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest


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


def _member(npz: zipfile.ZipFile, key: str, array: np.ndarray, h: Any) -> None:
    """``key.npy`` as ``np.savez`` writes it (the same header and bytes), the array's
    memory a piece at a time, each piece hashed into ``h`` as it is written."""
    if array.dtype.hasobject:
        raise ValueError(f"{key}: object arrays are not stored")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    if h is not None:
        _about(h, key, array)
    data = _data(array)
    with npz.open(f"{key}.npy", "w", force_zip64=True) as out:
        out.write(header.getvalue())
        for at in range(0, len(data), _CHUNK):
            piece = data[at : at + _CHUNK]
            out.write(piece)
            if h is not None:
                h.update(piece)
