"""Clients that take part in a run without training (FedFac's new clients): the
hooks the base strategy calls around its common path, passing everything through
by default. A method with such clients sets ``strategy.bystanders`` to its own
(methods/fedfac/new_clients.py) and overrides none of Flower's Strategy API.
"""

from __future__ import annotations

from flwr.common import EvaluateRes, FitRes
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy


class Bystanders:
    """No bystanders: every client trains, every reply takes the common path."""

    def prepare(self, client_manager: ClientManager) -> None:
        """Called before each round's fit instructions are made."""

    def sits_out(self, client_key: str | None) -> bool:
        """Whether a sampled client is sent no fit instruction (it does not train)."""
        return False

    def trained_fits(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> list[tuple[ClientProxy, FitRes]]:
        """The fit replies the common path validates and aggregates; the method has
        taken (checked, recorded) any other."""
        return results

    def trained_evaluations(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]
    ) -> list[tuple[ClientProxy, EvaluateRes]]:
        """The evaluations the round's record averages; the method has taken any other."""
        return results
