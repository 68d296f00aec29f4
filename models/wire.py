"""The wire: how a method's shared tensors travel, both ways.

Built identically on the server and on every client from the model, its roles and
the run config (a method's card names its wire class), so both sides derive the
same specs without talking. The base wire sends the shared tensors as they are;
a method whose protocol sends them in another form says so in its own wire
(Factorized-FL: sparse mu as (layout, values), alpha's matching vector appended
to the upload; FedFac: only the shared rows of its split layers, the split itself
at the head of every payload).

Server: ``encode_down`` (dense shared -> payload), ``up_spec`` and ``check_up``
(what a reply must be). Client: ``decode_down`` (payload -> dense shared, the rows
it does not carry from the model as it stands) and ``encode_up`` (model -> upload).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common import Parameters
from torch import nn

from models.roles import TensorSpec, get_arrays, view_arrays, wire_spec

if TYPE_CHECKING:
    from models.roles import Roles

NDArrays = list[np.ndarray]


class Wire:
    """The shared tensors, as they are, in the roles' order."""

    # the upload as views on a CPU model's memory, for a caller that serializes it before
    # the model changes (client_app/codec.py FastClient, the cohort); a copy otherwise
    views = False
    # the attacks on this method's own protocol, by name (its package's ATTACKS; simulation
    # only, client_app/attacks.py): set where the method builds its wire (methods/__init__.py)
    attacks: Mapping[str, Callable[..., Any]] = MappingProxyType({})

    def __init__(self, model: nn.Module, roles: Roles, cfg: Any) -> None:
        self.names = tuple(roles.shared)
        self.spec = wire_spec(model, self.names)  # the dense shared tensors (server state)

    @classmethod
    def of_spec(cls, spec: list[TensorSpec]) -> Wire:
        """The base wire of the shared tensors ``spec`` names."""
        wire = cls.__new__(cls)
        wire.names, wire.spec = tuple(s.name for s in spec), list(spec)
        return wire

    def down_spec(self) -> list[TensorSpec]:
        """What the server sends."""
        return self.spec

    def up_spec(self) -> list[TensorSpec]:
        """What a client must send back."""
        return self.spec

    def upload_reference(self, payload: NDArrays) -> NDArrays:
        """The payload's tensors lined up with an upload's entries by name (an empty
        array where the upload carries what the payload lacks): what an update is
        measured against, on a compacted or headed wire (FedFac's masks) too."""
        sent = {s.name: a for s, a in zip(self.down_spec(), payload, strict=True)}
        return [sent.get(s.name, np.zeros(0, np.uint8)) for s in self.up_spec()]

    def encode_down(self, dense: NDArrays) -> NDArrays:
        """Server: the dense shared tensors (global or one client's) -> the payload."""
        return dense

    def decode_down(self, arrays: NDArrays, model: nn.Module) -> NDArrays:
        """Client: a payload -> the dense shared tensors to load into ``model``."""
        return arrays

    def encode_up(self, model: nn.Module) -> NDArrays:
        """Client: what leaves it, from its trained model."""
        return (view_arrays if self.views else get_arrays)(model, self.names)

    def decode_up(self, arrays: NDArrays) -> tuple[NDArrays, Any]:
        """Server: an accepted upload -> (dense shared tensors, what else it carries)."""
        return arrays, None

    def check_up(self, arrays: NDArrays) -> str | None:
        """Checks an upload needs beyond its spec (None: acceptable)."""
        return None


# ---- tensors as .npy bytes, in one copy -------------------------------------------------

_headers: dict[tuple[str, bool, tuple[int, ...]], bytes] = {}
_lock = threading.Lock()
_MOST_HEADERS = 4096


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` as ``np.save(..., allow_pickle=False)`` writes it, in one copy of its
    data (``np.save`` into a ``BytesIO``, then ``getvalue``: two copies and a buffer
    grown as it goes). The header is numpy's own, made once per dtype and shape."""
    if array.dtype.hasobject:
        raise ValueError("object arrays are not sent")
    fortran = bool(array.flags.f_contiguous and not array.flags.c_contiguous)
    key = (array.dtype.str, fortran, tuple(array.shape))
    header = _headers.get(key)
    if header is None:
        fp = io.BytesIO()
        np.lib.format.write_array_header_1_0(fp, np.lib.format.header_data_from_array_1_0(array))
        header = fp.getvalue()
        with _lock:
            if len(_headers) < _MOST_HEADERS:
                _headers[key] = header
    raw = array.T if fortran else np.ascontiguousarray(array)
    return b"".join((header, raw.reshape(-1).view(np.uint8)))


def to_parameters(arrays: NDArrays) -> Parameters:
    """Flower's ``ndarrays_to_parameters``: the same bytes, in one copy a tensor."""
    return Parameters(tensors=[npy_bytes(a) for a in arrays], tensor_type="numpy.ndarray")
