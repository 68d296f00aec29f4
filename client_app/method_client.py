"""A method's client: its package's ``CLIENTS`` entry (methods/__init__.py), else
the base's schedule, built on the model, roles and wire the server builds alike."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from client_app.base import ClientSetup, PFLClient
from client_app.state import PersonalStore
from methods import Method, side_table
from pflower.config.schema import RunConfig
from pflower.data import ClientData


def client_class(method: Method) -> type[PFLClient]:
    """The class of ``method``'s local schedule."""
    return side_table(method.package, "client").get(method.name, PFLClient)


def build_method_client(
    method: Method,
    model: nn.Module,
    data: ClientData,
    cfg: RunConfig,
    store: PersonalStore | Callable[[int], PersonalStore],
    device: torch.device,
    client_key: str,
    setup: ClientSetup | None = None,
) -> PFLClient:
    """``method``'s client of ``model`` on ``device``, as ``setup`` says (a bare
    client's defaults when None). ``store``: where it keeps its personal state, or a
    choice of it by the bytes that state takes (``PFLClient.personal_bytes``), made
    before the client is built."""
    model = model.to(device)
    roles = method.roles(model, cfg)
    wire = method.build_wire(model, roles, cfg)
    cls = client_class(method)
    if callable(store):  # a choice by size (a store is not callable)
        store = store(cls.personal_bytes(model, roles, wire))
    return cls(model, roles, data, cfg, store, device, client_key, wire, setup=setup)
