"""An in-process federation: the real ServerApp strategy and the real ClientApp
clients, driven by Flower's own round loop (``flwr.server.Server``), without Ray
or gRPC. For tests and studies that need many short runs, or every message.

Each client is one Flower ``Context`` (node config + persistent state); every
instruction goes as a Flower ``Message`` through the real ClientApp (its mods
included), which builds a fresh client from the Context as a SuperNode does.
``record`` (optional) sees every instruction and reply.
"""

from __future__ import annotations

import json
import time
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
    Message,
    MessageType,
    Metadata,
    ReconnectIns,
    RecordDict,
)
from flwr.compat.common.recorddict_compat import (
    evaluateins_to_recorddict,
    fitins_to_recorddict,
    recorddict_to_evaluateres,
    recorddict_to_fitres,
)
from flwr.server import Server
from flwr.server.client_proxy import ClientProxy
from threadpoolctl import threadpool_limits

from client_app.app import build_client, make_client_app
from pflower.config.node import NodeConfig
from pflower.config.schema import ConfigError
from pflower.engine.cohort import COHORT, Cohort
from pflower.engine.cohort import check as cohort_check
from pflower.engine.heap import keep_freed_memory
from server_app.app import build_server
from server_app.nodes import LocalNodes
from strategies import outcome
from strategies.device_fold import fold_device

Recorder = Callable[[str, str, Any, Any], None]  # (kind, client, instruction, reply)


class LocalProxy(ClientProxy):
    """One simulated node: a fresh client per message, state kept in its Context."""

    def __init__(
        self,
        node_id: int,
        context: Context,
        overrides: dict[str, Any],
        record: Recorder | None = None,
        cohort: Cohort | None = None,
        app: Any = None,
        nodes: LocalNodes | None = None,
    ) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id
        given = NodeConfig.of(context.node_config).partition_id
        self.partition_id = node_id - 1 if given is None else given
        self.context = context
        self.overrides = overrides
        self.record = record
        self.app = app or make_client_app(overrides)
        self.cohort = cohort  # local-training = "cohort": its fit was trained with the round
        self.nodes = nodes  # its federation: keeps this node's Context while it holds state

    def _kept(self) -> None:
        if self.nodes is not None:
            self.nodes.keep(self.partition_id, self.context)

    def _client(self) -> Any:
        return build_client(self.context, self.overrides)

    def _deliver(self, message_type: str, content: Any, group_id: int | None) -> Any:
        """One message through the ClientApp, as a SuperNode delivers it."""
        meta = Metadata(
            self.context.run_id, "", 0, self.node_id, "", str(group_id or 0), time.time(),
            3600.0, message_type,
        )  # fmt: skip
        reply = self.app(Message(content=content, metadata=meta), self.context)
        if reply.has_error():
            raise RuntimeError(f"node {self.node_id}: {reply.error.reason}")
        return reply.content

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        if self.cohort is not None:
            res = self.cohort.reply(self.node_id)
        else:
            content = self._deliver(MessageType.TRAIN, fitins_to_recorddict(ins, True), group_id)
            res = recorddict_to_fitres(content, keep_input=False)
        self._kept()
        if self.record:
            self.record("fit", self.cid, ins, res)
        return res

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        content = self._deliver(
            MessageType.EVALUATE, evaluateins_to_recorddict(ins, True), group_id
        )
        res = recorddict_to_evaluateres(content)
        self._kept()
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
        return self._client().get_properties(ins)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        return DisconnectRes(reason="")


def build_inprocess(
    config: dict[str, Any],
    num_clients: int,
    record: Recorder | None = None,
    node_configs: list[dict[str, Any]] | None = None,
    parallel: int = 0,
) -> tuple[Server, int]:
    """Flower's Server with the run's strategy and ``num_clients`` local nodes, and
    the number of rounds to run (``server.strategy`` is the run's strategy).
    ``node_configs[i]`` adds to node i's config (a site name, its policy);
    ``parallel`` clients train at once (0: one per torch thread)."""
    if config.get("secure-aggregation"):
        raise ConfigError(
            "config key 'secure-aggregation': the in-process engine has no SecAgg+ "
            "(its clients would refuse every unmasked fit); use the Ray simulation"
        )
    # clients at once, each on its share of torch's threads: one a thread by default,
    # measured faster than one client on every thread (docs/PERFORMANCE.md). Each
    # client's numbers are its own either way: its own generator, single-threaded ops
    # the same at any parallelism, and a round's sum does not depend on arrival order.
    # each node's config parsed here, before anything starts: a bad key stops the run
    nodes = [NodeConfig.of(n) for n in node_configs or [{}] * num_clients]
    keep_freed_memory()  # a round's large buffers reused, not faulted in again
    parallel = max(1, parallel or torch.get_num_threads())
    threads_each = max(1, torch.get_num_threads() // parallel)
    components = build_server(Context(0, 0, {}, RecordDict(), {}), config)
    # clients on one GPU: the server's streamed sum and bounds run there too
    components.strategy.fold_device = fold_device([n.device for n in nodes])
    cohort = None
    if components.strategy.cfg.local_training == COHORT:
        cohort_check(config)
        cohort = Cohort(config, parallel)
        cohort.attach(components.strategy)
    run_id = time.time_ns() % 2**62  # unique per run, as Flower's: names spilled state
    app = make_client_app(config)

    def proxy(i: int, held: Context | None) -> LocalProxy:
        """Client i (node i + 1), made when asked: its Context kept by the federation
        while it holds state, else a new one (docs/PERFORMANCE.md, a million clients)."""
        node = {"partition-id": i, "num-partitions": num_clients, "torch-threads": threads_each}
        node.update(node_configs[i] if node_configs else {})
        context = held or Context(run_id, i + 1, node, RecordDict(), {})
        return LocalProxy(i + 1, context, config, record, cohort, app, manager)

    manager = LocalNodes(num_clients, proxy)
    server = Server(client_manager=manager, strategy=components.strategy)
    server.set_max_workers(parallel)
    # the class-list query: one client at a time (it builds each one's data first)
    components.strategy.class_lists.workers = 1
    return server, components.config.num_rounds


def run_inprocess(
    config: dict[str, Any],
    num_clients: int,
    record: Recorder | None = None,
    node_configs: list[dict[str, Any]] | None = None,
    parallel: int = 0,
) -> dict[str, Any]:
    """Run ``config`` with ``num_clients`` in this process; return results.json.

    ``config`` must set ``run-name`` (and usually ``output-dir``).
    """
    if not config.get("run-name"):
        raise ValueError("run_inprocess() needs a 'run-name' to find its results")
    threads = torch.get_num_threads()  # build_client pins simulated clients to one thread
    # the server's numpy work runs between the clients' training on the same cores:
    # BLAS's own threads would spin against torch's
    # (docs/notes/2026-11-28-blas-threads-and-one-client-per-thread.md measured it)
    with threadpool_limits(limits=1, user_api="blas"):
        try:
            server, rounds = build_inprocess(config, num_clients, record, node_configs, parallel)
            server.fit(rounds, timeout=None)
            outcome.judge(server.strategy)  # RunFailed (results.json written) if it failed
        finally:
            torch.set_num_threads(threads)
    path = Path(config.get("output-dir", "outputs")).resolve() / config["run-name"] / "results.json"
    if not path.exists():
        raise RuntimeError(f"the run wrote no results at {path}")
    return json.loads(path.read_text())
