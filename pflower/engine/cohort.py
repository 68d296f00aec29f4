"""The cohort engine (run-config key ``local-training = "cohort"``): the in-process
engine, whose round trains its sampled clients as one step with no Flower
``Message`` a client. Opt-in and labelled as its own engine; in-process only (the
ServerApp refuses it under ``flwr run`` and in deployment).

Flower's round loop, the strategy and every server step (reply checks, bounds,
streamed folding, aggregation, checkpoint, records) are the per-client engine's:
once ``configure_fit`` has sampled a round and made each client's payload, the
cohort trains every sampled client, split over ``parallel`` worker threads, and
each client's proxy hands Flower its reply when Flower asks for it. Each client is
the same client as in the per-client engine: built from its node's Context, with
its data, its personal state (kept in the Context or spilled, as there) and its
own seeded generator, so the same seeds give the same batches and the same
numbers (tests/test_cohort.py compares every client's scores and losses).

What it leaves out, client by client: the Message and its record conversions, and
the ClientApp's mods as such; of those mods, the site policy and the injected
dropouts are applied here as the mods apply them. SecAgg+ and the simulated
model-poisoning attacks need the message path and are refused.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.common import (
    Code,
    Context,
    FitIns,
    FitRes,
    MessageType,
    Parameters,
    Status,
    parameters_to_ndarrays,
)
from flwr.server.client_proxy import ClientProxy

from client_app.app import (
    InjectedDropout,
    PolicyRefusal,
    build_numpy_client,
    dropout_name,
    dropped_out,
    policy_refusal,
)
from client_app.batched import batch_orders, batchable, train_at_once
from client_app.codec import receives_views, to_parameters
from client_app.errors import PublicError, error_reply_text, site_name
from methods import parse_run_config
from pflower.config.node import NodeConfig
from pflower.config.schema import ConfigError, RunConfig
from pflower.patches import read_only_arrays

COHORT = "cohort"
log = logging.getLogger("flwr.pflower")


def refusal(config: dict[str, Any]) -> str | None:
    """Why a run cannot use the cohort engine, or None."""
    cfg = parse_run_config(config)
    if cfg.secure_aggregation:
        return "SecAgg+ masks each client's message; the cohort sends none"
    if cfg.attack not in ("none", "label-flip"):
        return f"attack '{cfg.attack}' falsifies a client's message; the cohort sends none"
    return None


def check(config: dict[str, Any]) -> None:
    """ConfigError naming ``local-training`` when the run cannot train as a cohort."""
    why = refusal(config)
    if why is not None:
        raise ConfigError(f"config key 'local-training': 'cohort' cannot run here: {why}")


class Cohort:
    """A round's sampled clients trained together; each client's reply (or its
    failure) kept for its proxy."""

    def __init__(self, overrides: dict[str, Any], parallel: int) -> None:
        self.overrides, self.parallel = overrides, max(1, parallel)
        self.cfg: RunConfig = parse_run_config(overrides)
        self.replies: dict[int, FitRes | BaseException] = {}
        self.ready: dict[int, threading.Event] = {}  # this round's nodes: set when replied
        self.lock = threading.Lock()

    def attach(self, strategy: Any) -> None:
        """Train each round's cohort as soon as the strategy has configured it."""
        configure = strategy.configure_fit

        def configure_fit(
            server_round: int, parameters: Parameters, client_manager: Any
        ) -> list[tuple[ClientProxy, FitIns]]:
            sent = configure(server_round, parameters, client_manager)
            self.train(server_round, sent)
            return sent

        strategy.configure_fit = configure_fit

    def train(self, server_round: int, sent: list[tuple[ClientProxy, FitIns]]) -> None:
        """Start every sampled client's fit, split over the worker threads (each a
        share of torch's threads, as the per-client engine's workers), in the order
        Flower asks for the replies: Flower's threads fold each reply as it comes
        while the cohort trains on."""
        members = [(innermost(proxy), ins) for proxy, ins in sent]
        with self.lock:
            self.replies.clear()
            self.ready = {proxy.node_id: threading.Event() for proxy, _ in members}
        chunks = [members[i :: self.parallel] for i in range(self.parallel)]
        pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="cohort")
        for chunk in chunks:
            if chunk:
                pool.submit(self._train_whole_chunk, server_round, chunk)
        pool.shutdown(wait=False)  # its threads end with their chunks

    def _train_whole_chunk(self, server_round: int, chunk: list[tuple[Any, FitIns]]) -> None:
        try:
            self._train_chunk(server_round, chunk)
        except BaseException as err:  # a bug of ours: every client still unanswered fails
            log.exception("the cohort's worker failed")
            for proxy, _ in chunk:
                if not self.ready[proxy.node_id].is_set():
                    self._keep(proxy.node_id, RuntimeError(f"the cohort's worker failed: {err!r}"))

    def _train_chunk(self, server_round: int, chunk: list[tuple[Any, FitIns]]) -> None:
        """A worker's share: clients whose schedule the batched step reproduces wait
        to train together (client_app/batched.py); the others fit one after another."""
        waiting: dict[tuple[Any, ...], list[Waiting]] = {}
        for proxy, ins in chunk:
            try:
                client = self._client(server_round, proxy.context)
                client.wire.views = True  # each reply serialized before the next trains
                if receives_views(client):  # read-only views on the payload's bytes
                    arrays = read_only_arrays(ins.parameters.tensors)
                else:
                    arrays = parameters_to_ndarrays(ins.parameters)
                if batchable(client, client.cfg):
                    evaluation = client.fit_begin(arrays, ins.config)
                    start = {k: p.detach().clone() for k, p in client.model.named_parameters()}
                    orders = batch_orders(client, ins.config)
                    entry = Waiting(proxy, ins, client, arrays, evaluation, start, orders)
                    waiting.setdefault(same_batches(client), []).append(entry)
                    continue
                reply: FitRes | BaseException = _fit_res(client.fit(arrays, ins.config))
            except Exception as err:  # the client's failure, as the per-client engine has it
                reply = _failure(proxy.context, err)
            self._keep(proxy.node_id, reply)
        for group in waiting.values():
            self._train_group(group)

    def _train_group(self, group: list[Waiting]) -> None:
        first = group[0].client
        try:
            data = [(w.client.x_train, w.client.y_train) for w in group]
            starts, orders = [w.start for w in group], [w.orders for w in group]
            trained, losses = train_at_once(first.model, starts, data, orders, first.cfg)
        except Exception as err:
            for w in group:
                self._keep(w.proxy.node_id, _failure(w.proxy.context, err))
            return
        for w, params, loss in zip(group, trained, losses, strict=True):
            try:
                with torch.no_grad():  # the worker's one model holds this client's weights
                    for name, p in w.client.model.named_parameters():
                        p.copy_(params[name])
                metrics = {"train-loss": loss}
                reply: FitRes | BaseException = _fit_res(
                    w.client.fit_end(w.arrays, w.ins.config, metrics, w.evaluation)
                )
            except Exception as err:
                reply = _failure(w.proxy.context, err)
            self._keep(w.proxy.node_id, reply)

    def _keep(self, node_id: int, reply: FitRes | BaseException) -> None:
        with self.lock:
            self.replies[node_id] = reply
            self.ready[node_id].set()

    def _client(self, server_round: int, context: Context) -> Any:
        """The node's client for this fit, after the checks the ClientApp's mods make."""
        why = policy_refusal(context.node_config, self.cfg, MessageType.TRAIN, masked=False)
        if why is not None:
            raise PolicyRefusal(why)
        site = dropout_name(NodeConfig.of(context.node_config))
        if dropped_out(self.cfg.dropout_rate, self.cfg.seed, str(server_round), site):
            raise InjectedDropout(
                f"client {site} dropped out (dropout-rate={self.cfg.dropout_rate})"
            )
        return build_numpy_client(context, self.overrides)

    def reply(self, node_id: int) -> FitRes:
        """The node's reply of this round's cohort; its failure raised as the
        per-client engine raises a failed reply."""
        with self.lock:
            ready = self.ready.get(node_id)
        if ready is not None:
            ready.wait()
        with self.lock:
            reply = self.replies.pop(node_id, None)
        if reply is None:
            raise RuntimeError(f"node {node_id}: not trained in this round's cohort")
        if isinstance(reply, BaseException):
            raise RuntimeError(f"node {node_id}: {reply}") from reply
        return reply


def innermost(proxy: ClientProxy) -> Any:
    """The engine's own proxy under the strategy's wrappers (streaming.py, outcome.py)."""
    while hasattr(proxy, "inner"):
        proxy = proxy.inner
    return proxy


@dataclass
class Waiting:
    """A client between ``fit_begin`` and the batched step."""

    proxy: Any
    ins: FitIns
    client: Any
    arrays: list[np.ndarray]
    evaluation: dict[str, Any]
    start: dict[str, torch.Tensor]
    orders: list[torch.Tensor]


def same_batches(client: Any) -> tuple[Any, ...]:
    """Clients with equal keys train in one batched step: as many samples, the same
    schedule and optimizer."""
    c = client.cfg
    schedule = (c.local_epochs, c.batch_size, c.optimizer, c.lr, c.momentum, c.weight_decay)
    return (int(client.y_train.shape[0]), *schedule)


def _fit_res(fit: tuple[list[np.ndarray], int, dict[str, Any]]) -> FitRes:
    upload, count, metrics = fit
    return FitRes(Status(Code.OK, ""), to_parameters(upload), count, metrics)


def _failure(context: Context, err: BaseException) -> BaseException:
    """What a site would send: a public error as it is; else its name, the phase
    and the exception's class (client_app/errors.py)."""
    if isinstance(err, PublicError):
        return err
    node = context.node_config
    log.error("%s failed in %s: %r", site_name(node), MessageType.TRAIN, err)
    return PublicError(error_reply_text(node, MessageType.TRAIN, err))
