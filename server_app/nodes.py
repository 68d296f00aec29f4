"""A simulated federation as numbers: what the server holds for a client that is not
asked in a round is nothing (docs/PERFORMANCE.md, "A million simulated clients").

* ``GridNodes``: Flower's simulation, through its in-memory grid. Flower's legacy
  loop (``start_grid``) keeps a ``GridClientProxy`` per node in its own dict and in
  the client manager, and rebuilds the set of node ids before every client-manager
  call (a million-element set each); here the node ids are one array in registration
  order (8 bytes a node: the registration order is the partition order, the
  sampler's rank), read again only when the count changes, and a proxy is made for
  each client asked.
* ``LocalNodes``: the in-process engine's clients, each made when asked, its Context
  kept only while its state holds something.
* ``run_simulated``: Flower's ``start_grid`` with a ``GridNodes`` in place of its
  node-registration thread (a deployment keeps ``start_grid``: its nodes come and go),
  and without the run's last step, ``disconnect_all_clients``: a proxy and a thread-pool
  task for every node, each a ``reconnect`` that Flower's grid proxy answers without a
  message (``GridClientProxy.reconnect``): 14 s and 0.5 GB that stayed resident at
  200,000 nodes, measured.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
from flwr.common import Context
from flwr.server import Server, ServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.history import History
from flwr.server.server import init_defaults, run_fl
from flwr.server.strategy import Strategy

from strategies.sampling import IndexedClients


class GridNodes(IndexedClients):
    """The simulation engine's nodes, in the order it registered them (the partition
    order), read from its in-memory LinkState."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid
        self.state = grid.state  # InMemoryGrid's LinkState (through a wrapping grid too)
        self.run_id = grid.run.run_id
        self._ids = np.zeros(0, dtype=np.uint64)
        self._lock = threading.Lock()

    def size(self) -> int:
        return len(self.node_ids())

    def node_ids(self) -> np.ndarray:
        """Every node id, in registration order (read again when the count changed)."""
        with self._lock:
            nodes = self.state.nodes
            if len(nodes) != len(self._ids):
                index = getattr(nodes, "index", None)  # sparse-node-stores' compact nodes
                with getattr(self.state, "lock", None) or nullcontext():
                    if index is not None and len(index.ids) == len(nodes):
                        self._ids = index.ids
                    else:
                        self._ids = np.fromiter(nodes.keys(), dtype=np.uint64, count=len(nodes))
            return self._ids

    def proxy_at(self, index: int) -> ClientProxy:
        proxy = GridClientProxy(
            node_id=int(self.node_ids()[index]), grid=self.grid, run_id=self.run_id
        )
        proxy.partition_id = index  # type: ignore[attr-defined]  # the sampler's rank
        return proxy


def simulated_grid(grid: Any) -> bool:
    """Whether ``grid`` is Flower's simulation's in-memory grid (a LinkState with its
    nodes in memory)."""
    return isinstance(getattr(getattr(grid, "state", None), "nodes", None), Mapping)


class SimulatedServer(Server):
    """Flower's Server, whose end of run asks no node to reconnect: a simulated node's
    grid proxy answers ``reconnect`` with nothing sent (Flower's, 1.39 and 1.42)."""

    def disconnect_all_clients(self, timeout: float | None) -> None:
        return None


def run_simulated(grid: Any, config: ServerConfig, strategy: Strategy) -> History:
    """Flower's ``start_grid`` (flwr.server.compat.app, 1.39 and 1.42) over a
    ``GridNodes``: the same server, config and round loop, without its thread that
    registers a proxy per node, and without the no-op reconnect of every node."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id = 1  # as start_grid: a dummy task identity for the legacy API
    TaskIdentity.run_id = grid.run.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    server = SimulatedServer(client_manager=GridNodes(grid), strategy=strategy)
    server, config = init_defaults(server=server, config=config, strategy=None, client_manager=None)
    return run_fl(server=server, config=config)


class LocalNodes(IndexedClients):
    """The in-process engine's ``count`` clients: client ``i``'s proxy is made by
    ``make(i, its held Context or None)`` when asked, and its Context is kept here only
    while the Context's state holds something (``keep``, after each message)."""

    def __init__(self, count: int, make: Callable[[int, Context | None], ClientProxy]) -> None:
        self.count = count
        self.make = make
        self.contexts: dict[int, Context] = {}  # client -> its Context, while it holds state
        self.lock = threading.Lock()

    def size(self) -> int:
        return self.count

    def keep(self, index: int, context: Context) -> None:
        """After a message: hold the client's Context if its state holds something."""
        with self.lock:
            if len(context.state) > 0:
                self.contexts[index] = context
            else:
                self.contexts.pop(index, None)

    def proxy_at(self, index: int) -> ClientProxy:
        if not 0 <= index < self.count:
            raise IndexError(f"client {index} of {self.count}")
        with self.lock:
            held = self.contexts.get(index)
        return self.make(index, held)
