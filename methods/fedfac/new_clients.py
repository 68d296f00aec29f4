"""FedFac's new clients (paper Section 3.2), apart from its aggregation: which
clients are held out, the fit instructions they are not sent, the held-out claims
checked against the run config and the node, their evaluation (LocalTrain), and
Ensemble's final round: ``NewClients``, the base strategy's bystander hooks
(strategies/bystanders.py), so FedFacStrategy overrides none of Flower's API.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from methods.fedfac import FedFacParams
from methods.fedfac.model import HELD_OUT, PHASE
from models.roles import CLIENT_KEY
from pflower.config.schema import RunConfig
from strategies.base import payload_bytes
from strategies.bystanders import Bystanders

if TYPE_CHECKING:
    from methods.fedfac.strategy import FedFacStrategy

log = logging.getLogger("flwr.pflower")


def held_out_keys(cfg: RunConfig, num_clients: int) -> set[str]:
    """The held-out clients' keys: named sites, else the last partitions."""
    sites = {k.strip() for k in FedFacParams.of(cfg).new_client_sites.split(",") if k.strip()}
    if sites:
        return sites
    n = FedFacParams.of(cfg).new_clients
    return {f"client-{i}" for i in range(num_clients - n, num_clients)}


class NewClients(Bystanders):
    """FedFac's held-out clients behind the base strategy's hooks: they are sent no
    fit instruction, their replies are checked claims, and their evaluations are
    recorded apart (LocalTrain), or made by Ensemble's exchange in the last round."""

    def __init__(self, strategy: FedFacStrategy) -> None:
        self.strategy = strategy
        self.num_clients = 0  # the federation's size, once known
        self.held_out: set[str] = set()  # the new clients' keys

    def prepare(self, client_manager: ClientManager) -> None:
        """Once: wait for the federation, then fix who is held out."""
        if self.num_clients:
            return
        cfg = self.strategy.cfg
        num_clients = self.strategy.sampler.wait_for_federation(client_manager)
        held_out = held_out_keys(cfg, num_clients)
        if len(held_out) >= num_clients:
            sites = FedFacParams.of(cfg).new_client_sites.strip()
            key = "fedfac.new-client-sites" if sites else "fedfac.new-clients"
            raise ValueError(
                f"config key '{key}': {len(held_out)} held out of {num_clients} "
                "clients leaves none to train"
            )
        self.num_clients, self.held_out = num_clients, held_out

    def sits_out(self, client_key: str | None) -> bool:
        return client_key in self.held_out  # known new clients never train

    def trained_fits(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        """A new client's decline (first round, before its key was known) is checked
        as a claim and left out."""
        trained = []
        for proxy, res in results:
            if res.metrics.get(HELD_OUT):
                held_out_claim(self.strategy, self.held_out, server_round, proxy, res.metrics)
            else:
                trained.append((proxy, res))
        return trained

    def trained_evaluations(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> list[tuple[ClientProxy, EvaluateRes]]:
        """Record the new clients' accuracy (LocalTrain: their own evaluation; Ensemble:
        the final round's), return the trained clients' evaluations."""
        s, params = self.strategy, FedFacParams.of(self.strategy.cfg)
        claims = [(p, r) for p, r in results if r.metrics.get(HELD_OUT)]
        new = [
            (p, r)
            for p, r in claims
            if held_out_claim(s, self.held_out, server_round, p, r.metrics)
        ]
        trained = [(p, r) for p, r in results if not r.metrics.get(HELD_OUT)]
        if new and params.new_client_mode == "localtrain":
            accs = [float(r.metrics["accuracy"]) for _, r in new]
            s.note(server_round, accuracy_new_clients=float(np.mean(accs)))
        last = server_round == s.cfg.num_server_rounds
        if new and trained and params.new_client_mode == "ensemble" and last:
            accs = ensemble_round(s, server_round, [p for p, _ in new], [p for p, _ in trained])
            if accs:
                s.note(server_round, accuracy_new_clients=float(np.mean(accs)))
        if new:
            s.note(server_round, new_client_mode=params.new_client_mode)
        return trained


def held_out_claim(
    strategy: FedFacStrategy,
    held_out: set[str],
    server_round: int,
    proxy: ClientProxy,
    metrics: dict,
) -> bool:
    """Whether a reply's held-out claim stands: its key is one the run config lists
    and is bound to this node. Any other claim is rejected (logged): a trained
    site posing as new would be sent every other site's model by Ensemble."""
    key = str(metrics.get(CLIENT_KEY))
    problem = None if key in held_out else "it is not a held-out client of this run"
    problem = problem or strategy.clients.bind(proxy.node_id, key)
    if problem is not None:
        log.warning(
            "round %d: rejected held-out claim from %r (node %d): %s",
            server_round,
            key,
            proxy.node_id,
            problem,
        )
    return problem is None


def ensemble_round(
    strategy: FedFacStrategy, server_round: int, new: list[ClientProxy], trained: list[ClientProxy]
) -> list[float]:
    """Ensemble for new clients (the sites consented: ensemble-share-models):
    each trained client sends its personalised model; each new client gets them
    all and scores the mean of their predictions on its own test split."""

    def share(proxy: ClientProxy) -> FitRes | None:
        key = strategy.clients.key_of(proxy)
        config = {**strategy.client_config(key, server_round), PHASE: "share-model"}
        ins = FitIns(strategy.payload_for(key, server_round), config)
        try:
            return proxy.fit(ins, None, server_round)
        except Exception as err:  # noqa: BLE001 - a vanished client: go on without it
            log.warning(
                "round %d: ensemble: no model from node %d (%s)",
                server_round,
                proxy.node_id,
                err,
            )
            return None

    with ThreadPoolExecutor() as pool:
        replies = list(pool.map(share, trained))
    models: NDArrays = []
    shared_by = []
    for proxy, res in zip(trained, replies):
        if res is None:
            continue
        arrays = parameters_to_ndarrays(res.parameters)
        problem = next(
            (p for s, a in zip(strategy.model_spec, arrays) if (p := s.matches(a))), None
        )
        if len(arrays) != len(strategy.model_spec) or problem:
            log.warning(
                "round %d: ensemble: rejected model from node %d: %s",
                server_round,
                proxy.node_id,
                problem or "wrong tensor count",
            )
            continue
        models += arrays
        shared_by.append(str(res.metrics.get(CLIENT_KEY)))
    if not shared_by:
        log.error("round %d: ensemble: no trained client shared its model", server_round)
        return []
    payload = ndarrays_to_parameters(models)
    config = {**strategy.client_config(None, server_round), PHASE: "ensemble"}
    accs = []
    for proxy in new:
        res = proxy.evaluate(EvaluateIns(payload, config), None, server_round)
        accs.append(float(res.metrics["accuracy"]))
    strategy.note(
        server_round,
        bytes_ensemble_down=len(new) * payload_bytes(payload),
        ensemble_models_from=sorted(shared_by),
    )
    log.info("round %d: ensemble accuracy of new clients %s", server_round, accs)
    return accs
