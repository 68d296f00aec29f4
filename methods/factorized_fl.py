"""Factorized-FL (NeurIPS 2022): both variants share the rank-1 factorized model
and the similarity-matched per-client aggregation; they differ in the split rule
(alpha shares u, beta shares u, v and sparse mu)."""

from __future__ import annotations

from client_app.factorized_fl import FactorizedFLClient
from methods import Method
from models.factorized_fl import alpha_personal, beta_personal, factorize
from strategies.factorized_fl import FactorizedFLStrategy

METHODS = {
    m.name: m
    for m in (
        Method(
            "factorized-fl-alpha",
            alpha_personal,
            FactorizedFLClient,
            FactorizedFLStrategy,
            factorize,
        ),
        Method(
            "factorized-fl-beta", beta_personal, FactorizedFLClient, FactorizedFLStrategy, factorize
        ),
    )
}
