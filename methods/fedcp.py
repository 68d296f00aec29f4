"""FedCP = (personal head only, CE + MMD with CPN routing, sample-weighted mean)."""

from __future__ import annotations

from methods import Method
from models.fedcp import fedcp_split, fedcp_transform
from pfl_privacy.disclosure import Disclosure
from run_config.schema import RunConfig


def fedcp_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """The paper's h_g <- 0.5 h_g + 0.5 h_p before upload: the server, which sent
    h_g, solves for h_p; under SecAgg+ only for the sum of the round's h_p."""
    if cfg.secure_aggregation:
        return (Disclosure("head-sum", ("head.*",), "method='fedcp'", audited=False),)
    return (Disclosure("head-blend", ("head.*",), "method='fedcp'"),)


METHODS = {
    "fedcp": Method(
        "fedcp",
        fedcp_split,
        "client_app.fedcp:FedCPClient",
        "strategies.fedcp:FedCPStrategy",
        transform=fedcp_transform,
        disclosures=fedcp_disclosures,
    )
}
