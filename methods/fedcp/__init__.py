"""FedCP (docs/fedcp.md): a conditional policy network (CPN) routes each sample's
features between a global head and a personal head.

Split: the personal head. Schedule: CE + ``mmd-lambda`` x MMD to the received
extractor's features, the global head frozen, then h_g <- 0.5 h_g + 0.5 h_p before
upload (the paper's). Aggregation: the sample-weighted mean of the extractor, the
global head and the CPN. The paper's schedule: SGD lr 0.005, no momentum, batch
10, 1 epoch; lambda = 5.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from methods import Method
from pflower.config.defaults import PFLLIB_SCHEDULE
from pflower.config.params import MethodParams
from pflower.config.schema import RunConfig
from pflower.privacy.disclosure import Disclosure, DisclosureKind


class FedCPParams(MethodParams):
    namespace: ClassVar[str] = "fedcp"
    auto_keys: ClassVar[tuple[str, ...]] = ("mmd-lambda",)
    # PFLlib's -lam 1.0 (main.py:447); the paper's 5 is ours
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {"pfllib": {"mmd-lambda": 1.0}}

    mmd_lambda: float = Field(5.0, alias="mmd-lambda", ge=0)
    noisy_eval: bool = Field(False, alias="noisy-eval")  # the CPN's gumbel noise at evaluation


HEAD_BLEND = DisclosureKind(
    "head-blend",
    "the personal head, exactly: the upload is 0.5 h_g + 0.5 h_p and the server sent h_g, "
    "so h_p = 2 upload - h_g",
)
HEAD_SUM = DisclosureKind(
    "head-sum",
    "the sum of the round's personal heads (SecAgg+ unmasks only the sum of the blends, "
    "and the server knows h_g)",
)


def fedcp_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """The paper's h_g <- 0.5 h_g + 0.5 h_p before upload: the server, which sent
    h_g, solves for h_p; under SecAgg+ only for the sum of the round's h_p."""
    if cfg.secure_aggregation:
        return (Disclosure(HEAD_SUM, ("head.*",), "method='fedcp'", audited=False),)
    return (Disclosure(HEAD_BLEND, ("head.*",), "method='fedcp'"),)


def paper_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    # the paper's schedule is PFLlib's default (FedCP's authors wrote PFLlib)
    return dict(PFLLIB_SCHEDULE)


METHODS = (
    Method(
        "fedcp",
        pfllib="FedCP",
        params=FedCPParams,
        schedule=paper_schedule,
        disclosures=fedcp_disclosures,
        disclosure_kinds=(HEAD_BLEND, HEAD_SUM),
    ),
)
