"""Where the two supported Flower lines differ, in one place (docs/FLOWER_VERSIONS.md).

flwr 1.39 is the default line: its SuperNodes speak gRPC to the SuperLink's Fleet
API. flwr 1.42 is the second: HTTP Fleet on the SuperLink's shared port, and some
internals moved. Code that must reach such an internal asks here, not Flower.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType


def installed(library: str) -> str:
    """The installed version of ``library`` ("" when it is not installed)."""
    try:
        return version(library)
    except PackageNotFoundError:
        return ""


def fleet_over_http() -> bool:
    """Whether the installed Flower's SuperNodes reach the SuperLink over HTTP on its
    shared port (``--port``, 8000; 1.40 on) rather than gRPC on the Fleet API's own
    (``--fleet-api-address``, 9092; 1.39)."""
    major, minor = (int(part) for part in (installed("flwr") or "0.0").split(".")[:2])
    return (major, minor) >= (1, 40)


def default_fleet_port() -> int:
    """The port a SuperNode dials by default: the SuperLink's HTTP port (8000) on
    HTTP-Fleet lines, the gRPC Fleet API's (9092) on 1.39."""
    return 8000 if fleet_over_http() else 9092


def fleet_pull_handler() -> ModuleType:
    """The module whose ``pull_messages(request, state, store)`` answers a SuperNode's
    pull: one handler both Fleet servicers call in 1.42, the gRPC one's own in 1.39."""
    try:
        return import_module("flwr.superlink.servicer.fleet.fleet_handlers")
    except ImportError:
        return import_module("flwr.server.superlink.fleet.message_handler.message_handler")


def registration_order(grid: object) -> dict[int, int]:
    """Simulation: each node's place in the order Flower's engine registered it, which
    is its partition id (both lines' ``_register_nodes`` create node ``i`` for partition
    ``i`` with a random id, into the in-memory LinkState's ``nodes`` dict). Empty where
    the grid has no in-memory LinkState (a deployment)."""
    state = getattr(grid, "state", None)  # InMemoryGrid's, through a wrapping grid too
    nodes = getattr(state, "nodes", None)
    if not isinstance(nodes, Mapping):  # a dict, or pflower.patches' compact nodes
        return {}
    with getattr(state, "lock", None) or nullcontext():
        return {node_id: place for place, node_id in enumerate(list(nodes))}
