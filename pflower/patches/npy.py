"""``npy-headers``: Flower's ``bytes_to_ndarray`` reading each distinct .npy header once."""

from __future__ import annotations

import io
import math
import threading
from typing import Any

import numpy as np

from pflower.patches.core import check, enabled

_MAGIC = b"\x93NUMPY"
_MOST_HEADERS = 4096  # distinct headers remembered (a model has a few dozen)
_headers: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}
_lock = threading.Lock()


def _layout(tensor: bytes) -> tuple[int, tuple[int, ...], bool, np.dtype] | None:
    """(data offset, shape, fortran order, dtype) of a .npy byte string, numpy's own
    reading of its header, remembered by the header's bytes; None where Flower's own
    path should read it (not .npy, an unknown version, objects, zero-size items, a
    negative dimension, which np.load refuses)."""
    if tensor[:6] != _MAGIC or len(tensor) < 10:
        return None
    version = tensor[6]
    if version == 1:
        start = 10 + int.from_bytes(tensor[8:10], "little")
    elif version in (2, 3):
        start = 12 + int.from_bytes(tensor[8:12], "little")
    else:
        return None
    header = tensor[:start]
    found = _headers.get(header)
    if found is None:
        fp = io.BytesIO(header)
        major_minor = np.lib.format.read_magic(fp)
        read = (
            np.lib.format.read_array_header_1_0
            if major_minor == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        found = read(fp)
        shape, _, dtype = found
        if dtype.hasobject or dtype.itemsize == 0 or any(d < 0 for d in shape):
            return None  # np.load's own refusal (a negative dimension) or its own path
        with _lock:
            if len(_headers) < _MOST_HEADERS:
                _headers[header] = found
    shape, fortran, dtype = found
    return start, shape, fortran, dtype


def _view(tensor: bytes) -> np.ndarray | None:
    """The array a .npy byte string holds, as a read-only view on its bytes; None
    where ``_layout`` leaves it to Flower's own path."""
    layout = _layout(tensor)
    if layout is None:
        return None
    start, shape, fortran, dtype = layout
    data = np.frombuffer(tensor, dtype=dtype, count=math.prod(shape), offset=start)
    data.flags.writeable = False  # already, on immutable bytes; stated for a bytearray
    return data.reshape(shape[::-1]).transpose() if fortran else data.reshape(shape)


def read_only_arrays(tensors: list[bytes]) -> list[np.ndarray]:
    """Each .npy byte string as a read-only view on its own bytes (no copy), else as
    Flower's ``bytes_to_ndarray`` makes it (a writable copy). Not a patch of Flower:
    the server's streamed fold reads a reply's arrays and never writes them, and the
    copy cost it 0.5-0.7 ms of CPU a CNN4 reply (docs/PERFORMANCE.md)."""
    from flwr.compat.common import parameter

    views = [_view(tensor) for tensor in tensors]
    return [
        parameter.bytes_to_ndarray(tensor) if view is None else view
        for tensor, view in zip(tensors, views, strict=True)
    ]


def npy_headers() -> bool:
    """``npy-headers``: Flower's ``bytes_to_ndarray`` (``np.load`` of each tensor, whose
    header numpy parses with ``ast.literal_eval``: 0.19 ms a tensor, 1.5 ms of a
    CNN's 8 tensors, on the server for every reply and on the client for every
    message, measured) reads a header it has seen before from memory, then the
    array from the bytes after it: the same array (values, dtype, shape, memory
    order, writable and its own) as ``np.load``, which still reads anything else.
    Returns whether it is in place."""
    from flwr.compat.common import parameter

    if getattr(parameter.bytes_to_ndarray, "_pflower_npy", False):
        return True
    if not enabled():
        return False
    check(("flwr",))
    flower = parameter.bytes_to_ndarray

    def bytes_to_ndarray(tensor: bytes) -> Any:
        view = _view(tensor)
        return flower(tensor) if view is None else view.copy(order="K")

    bytes_to_ndarray._pflower_npy = True  # type: ignore[attr-defined]
    bytes_to_ndarray._pflower_flower = flower  # type: ignore[attr-defined]
    parameter.bytes_to_ndarray = bytes_to_ndarray
    return True
