"""Sampling: who is asked in a round, once the federation has registered."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Iterable
from typing import Any

from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from pflower.flower_lines import registration_order

log = logging.getLogger("flwr.pflower")

WAIT_S = 600  # how long a round waits for min-available-clients
SETTLE_S = 30  # how long the first round waits for registrations to settle


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
        available = list(client_manager.all().values())
        n = max(1, int(math.ceil(fraction * len(available))))
        ranked = sorted(available, key=lambda p: (self.place(p), p.node_id))
        if n >= len(ranked):
            return ranked
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
