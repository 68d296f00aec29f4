"""The run's aggregation rule, decided once for the server and the clients.

The server aggregates with it (strategies/) and a client weighs its fit reply by it
(client_app/): under SecAgg+ a reply's weight scales its masked upload, so a plain
mean must be sent with weight 1 by every client.
"""

from __future__ import annotations

from pflower.config.schema import RunConfig


def aggregation_rule(cfg: RunConfig, method_default: str) -> str:
    """The rule the server aggregates by: ``mean`` under DP (its noise is calibrated
    to an equal-weight mean of clipped updates), else the run's ``aggregation``, its
    ``default`` the method card's rule ``method_default``."""
    if cfg.dp_mode != "off":
        return "mean"
    return method_default if cfg.aggregation == "default" else cfg.aggregation


def weighs_by_samples(cfg: RunConfig, method_default: str) -> bool:
    """Whether a fit reply reports its sample count as its weight: always, but under
    SecAgg+ for a plain mean (the mask carries the weight, so it must be 1)."""
    return not (cfg.secure_aggregation and aggregation_rule(cfg, method_default) == "mean")
