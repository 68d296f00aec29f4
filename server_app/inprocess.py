"""An in-process federation: the real ServerApp strategy and the real ClientApp
clients, driven by Flower's own round loop (``flwr.server.Server``), without Ray
or gRPC. For tests and studies that need many short runs, or every message.

Each client is one Flower ``Context`` (node config + persistent state), and every
message builds a fresh client from it through ``client_app.app.build_client``,
as a SuperNode does. ``record`` (optional) sees every message and reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from flwr.common import (
    Context,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
    RecordDict,
)
from flwr.server import Server, SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from client_app.app import build_client
from server_app.app import build_server

Recorder = Callable[[str, str, Any, Any], None]  # (kind, client, instruction, reply)


class LocalProxy(ClientProxy):
    """One simulated node: a fresh client per message, state kept in its Context."""

    def __init__(
        self,
        node_id: int,
        context: Context,
        overrides: dict[str, Any],
        record: Recorder | None = None,
    ) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id
        self.context = context
        self.overrides = overrides
        self.record = record

    def _client(self) -> Any:
        return build_client(self.context, self.overrides)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        res = self._client().fit(ins)
        if self.record:
            self.record("fit", self.cid, ins, res)
        return res

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        res = self._client().evaluate(ins)
        if self.record:
            self.record("evaluate", self.cid, ins, res)
        return res

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        return self._client().get_parameters(ins)

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        raise NotImplementedError

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        return DisconnectRes(reason="")


def build_inprocess(
    config: dict[str, Any], num_clients: int, record: Recorder | None = None
) -> tuple[Server, int]:
    """Flower's Server with the run's strategy and ``num_clients`` local nodes, and
    the number of rounds to run (``server.strategy`` is the run's strategy)."""
    components = build_server(Context(0, 0, {}, RecordDict(), {}), config)
    manager = SimpleClientManager()
    for i in range(num_clients):
        node = {"partition-id": i, "num-partitions": num_clients}
        context = Context(0, i + 1, node, RecordDict(), {})
        manager.register(LocalProxy(i + 1, context, config, record))
    server = Server(client_manager=manager, strategy=components.strategy)
    server.set_max_workers(1)  # one client at a time: reproducible, like one actor
    return server, components.config.num_rounds


def run_inprocess(
    config: dict[str, Any], num_clients: int, record: Recorder | None = None
) -> dict[str, Any]:
    """Run ``config`` with ``num_clients`` in this process; return results.json.

    ``config`` must set ``run-name`` (and usually ``output-dir``).
    """
    if not config.get("run-name"):
        raise ValueError("run_inprocess() needs a 'run-name' to find its results")
    threads = torch.get_num_threads()  # build_client pins simulated clients to one thread
    try:
        server, rounds = build_inprocess(config, num_clients, record)
        server.fit(rounds, timeout=None)
    finally:
        torch.set_num_threads(threads)
    path = Path(config.get("output-dir", "outputs")).resolve() / config["run-name"] / "results.json"
    if not path.exists():
        raise RuntimeError(f"the run wrote no results at {path}")
    return json.loads(path.read_text())
