"""The run's aggregation rule, decided once for the server and the clients.

The server aggregates with it (strategies/) and a client weighs its fit reply by it
(client_app/): under SecAgg+ a reply's weight scales its masked upload, so a plain
mean must be sent with weight 1 by every client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class MeanPart:
    """Some of a method's shared arrays, averaged with weights of their own and moved to
    by a server step of their own (a card's ``Method.means``; strategies/parts.py runs it).

    The arrays are the shared entries whose names start with ``prefix``; an array takes
    the first part that names it, and an array no part names is averaged by the run's
    rule and taken as it is (FedAvg's). ``weights``: "rule", the run's rule (by sample
    count where it is ``weighted``), or "equal", one per reply whatever the rule. ``step``:
    (run config, share) -> s, the new value being ``x + s (mean - x)`` where ``x`` is the
    part's value before the round and ``share`` the replies kept over the federation's
    size (SCAFFOLD's c moves by |S|/N of the mean change); None: s = 1, the mean itself.
    """

    prefix: str
    weights: Literal["rule", "equal"] = "rule"
    step: Callable[[RunConfig, float], float] | None = None
