"""Factorized-FL (NeurIPS 2022): both variants share the rank-1 factorized model
and the similarity-matched per-client aggregation; they differ in the split rule
(alpha shares u, beta shares u, v and sparse mu).

Config defaults (``ffl-*``) are the reference's single-domain permuted-label
values (rank 1, l1 = mu threshold = 5e-4, tau 0, epsilon 1, min-aggr 10); for
the domain-heterogeneous scenario (``partitioner=domain permute-labels=true``)
the reference uses ``ffl-sim-threshold=0.95 ffl-epsilon=20 ffl-min-aggr=4``.
Local schedule: see ``client_app.factorized_fl`` for the reference optimiser."""

from __future__ import annotations

from methods import Method
from models.factorized_fl import V, alpha_personal, beta_personal, factorize
from pfl_privacy.disclosure import Disclosure
from run_config.schema import RunConfig


def alpha_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """alpha keeps v personal but appends the v of the last layer before the head
    to every upload: the server matches clients by it (the paper's protocol)."""
    return (Disclosure("matching-vector", (f"*{V}",), "method='factorized-fl-alpha'"),)


_CLIENT = "client_app.factorized_fl:FactorizedFLClient"
_STRATEGY = "strategies.factorized_fl:FactorizedFLStrategy"

METHODS = {
    m.name: m
    for m in (
        Method(
            "factorized-fl-alpha",
            alpha_personal,
            _CLIENT,
            _STRATEGY,
            transform=factorize,
            disclosures=alpha_disclosures,
        ),
        Method("factorized-fl-beta", beta_personal, _CLIENT, _STRATEGY, transform=factorize),
    )
}
