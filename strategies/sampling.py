"""Sampling: who is asked in a round, once the federation has registered; and a
client manager of numbered clients (``IndexedClients``), whose proxies are made only
for the clients asked, so that a client never sampled costs no object."""

from __future__ import annotations

import logging
import math
import random
import time
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.criterion import Criterion

from pflower.flower_lines import registration_order

log = logging.getLogger("flwr.pflower")

WAIT_S = 600  # how long a round waits for min-available-clients
SETTLE_S = 30  # how long the first round waits for registrations to settle


class IndexedClients(ClientManager):
    """A federation whose clients are numbered 0..N-1 in the sampler's rank order
    (simulation: the partition ids), a proxy made only when a client is asked for:
    the federation is a number, not a dict of N proxies (Flower's client managers
    hold one a node). ``all()`` still gives every client, made on the spot (tests,
    small federations): the sampler never calls it."""

    @abstractmethod
    def size(self) -> int:
        """How many clients the federation has now."""

    @abstractmethod
    def proxy_at(self, index: int) -> ClientProxy:
        """A proxy for client ``index`` (its rank: ``Sampler.place`` is index + 1)."""

    def num_available(self) -> int:
        return self.size()

    def register(self, client: ClientProxy) -> bool:
        return False  # the engine's federation is fixed: nothing registers here

    def unregister(self, client: ClientProxy) -> None:
        return None

    def all(self) -> dict[str, ClientProxy]:
        proxies = (self.proxy_at(i) for i in range(self.size()))
        return {p.cid: p for p in proxies}

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        deadline = time.monotonic() + timeout
        while self.size() < num_clients:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def sample(
        self,
        num_clients: int,
        min_num_clients: int | None = None,
        criterion: Criterion | None = None,
    ) -> list[ClientProxy]:
        """Flower's ``SimpleClientManager.sample`` (its unseeded global generator)."""
        self.wait_for(num_clients if min_num_clients is None else min_num_clients)
        if criterion is not None:
            chosen = [p for p in self.all().values() if criterion.select(p)]
            return random.sample(chosen, min(num_clients, len(chosen)))
        if num_clients > self.size():
            log.info(
                "sampling failed: %d clients asked for, %d available", num_clients, self.size()
            )
            return []
        return [self.proxy_at(i) for i in random.sample(range(self.size()), num_clients)]


class Sampler:
    """Waits once for the federation to settle, then samples a fraction of it: the
    same clients for the same seed and round in every run and engine (Flower's
    ``ClientManager.sample`` draws from Python's unseeded global generator)."""

    def __init__(self, min_available_clients: int, seed: int = 0) -> None:
        self.min_available = min_available_clients
        self.seed = seed
        self.settled = False
        self._order: dict[int, int] = {}  # simulation: node id -> its partition id

    def wait_for_federation(self, client_manager: ClientManager) -> int:
        """Once per run, before the first round: nodes register asynchronously,
        so wait until the number of connected clients stops changing (at most
        SETTLE_S). Returns the number connected."""
        if not self.settled:
            deadline = time.monotonic() + SETTLE_S
            last, since = -1, time.monotonic()
            while time.monotonic() < deadline:
                n = client_manager.num_available()
                if n != last:
                    last, since = n, time.monotonic()
                elif n > 0 and time.monotonic() - since >= 1.0:
                    break
                time.sleep(0.1)
            self.settled = True
        return client_manager.num_available()

    def sample(
        self, client_manager: ClientManager, fraction: float, server_round: int, kind: str
    ) -> list[ClientProxy]:
        """ceil(fraction x available) clients (at least 1), after waiting up to WAIT_S
        for ``min-available-clients``; drawn by a generator seeded by the run's seed,
        the round and ``kind`` (fit, evaluate) from the clients in partition order
        (simulation: the engine's registration order; else by node id)."""
        self.wait_for_federation(client_manager)
        wanted = self.min_available
        if client_manager.num_available() < wanted:
            log.info("waiting up to %ds for %d clients (min-available-clients)", WAIT_S, wanted)
            if not client_manager.wait_for(wanted, timeout=WAIT_S):
                log.warning(
                    "only %d of %d clients connected: going on",
                    client_manager.num_available(),
                    wanted,
                )
        if isinstance(client_manager, IndexedClients):  # the same draw, from the numbers
            total = client_manager.size()
            n = max(1, int(math.ceil(fraction * total)))
            draw = range(total) if n >= total else self._draw(range(total), n, kind, server_round)
            return [client_manager.proxy_at(i) for i in draw]
        available = list(client_manager.all().values())
        n = max(1, int(math.ceil(fraction * len(available))))
        ranked = sorted(available, key=lambda p: (self.place(p), p.node_id))
        if n >= len(ranked):
            return ranked
        return self._draw(ranked, n, kind, server_round)

    def _draw(self, ranked: Any, n: int, kind: str, server_round: int) -> list[Any]:
        """``n`` of ``ranked`` (a sequence: the draw depends on its length only, so
        clients drawn from their numbers are those drawn from the list of proxies)."""
        return random.Random(f"{self.seed}/{kind}/{server_round}").sample(ranked, n)

    def places(self, sent: Iterable[tuple[Any, ...]]) -> dict[int, int]:
        """Node id -> rank key (``place``) of a round's (proxy, ...) instructions."""
        return {item[0].node_id: self.place(item[0]) for item in sent}

    def place(self, proxy: ClientProxy) -> int:
        """A client's rank key: in simulation its number in the federation, partition
        id + 1 (the in-process engine's node id; the Ray simulation registered its
        random node ids in partition order), else its node id (a deployment)."""
        partition = getattr(proxy, "partition_id", None)
        if partition is None:
            node_id = int(getattr(proxy, "node_id", 0) or proxy.cid)
            if node_id not in self._order:
                self._order = registration_order(getattr(proxy, "grid", None))
            partition = self._order.get(node_id)
            if partition is None:
                return node_id
        return int(partition) + 1
