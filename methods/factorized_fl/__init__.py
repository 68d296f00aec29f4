"""Factorized-FL (NeurIPS 2022; docs/factorized_fl.md): every conv/linear weight is
the rank-1 product u v^T plus a sparse bias mu; both variants share the
similarity-matched per-client aggregation and differ in the split rule (alpha
shares u; beta shares u, v and the sparse mu).

``profile = "authors"`` sets every key as the authors' code ran it (``AUTHORS``: no
L1 in effect, mu dense on the wire, their init, SGD state kept, no match cap); our
defaults (``OURS``) follow the paper, but for alpha's init on conv backbones, where the
authors' won our ablation (docs/factorized_fl.md).

The keys' defaults are the reference's single-domain permuted-label values (rank 1,
l1 = mu threshold = 5e-4, similarity threshold 0, epsilon 1, min-aggr 10); with
``partitioner=domain`` the ``auto`` ones take the reference's domain-heterogeneous
values (0.95, 20, 4). The reference's local schedule: SGD lr 1e-3, momentum 0.9,
weight decay 1e-6, 5 epochs, batch 256.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from pflower.config.params import MethodParams
from pflower.config.schema import RunConfig
from pflower.privacy.disclosure import Disclosure, DisclosureKind

V = ".parametrizations.weight.original1"  # a factorized layer's v (methods/factorized_fl/model.py)


# What the authors' code ran where it differs from ours (github wyjeong/Factorized-FL
# at a21a3e1; docs/factorized_fl.md has the file and line of each): profile="authors".
AUTHORS: dict[str, Any] = {
    "l1": 0.0,  # its L1 is summed over detached state_dict() copies: no gradient
    "mu-wire": "dense",  # mu sent and averaged whole; the threshold only at evaluation
    "init": "authors",  # u, v Xavier as drawn; the head's mu Xavier-dense
    "optimizer-state": "kept",  # one SGD per client for the whole run
    "match-cap": 0.0,  # no cap on how often one client is kept
}
OURS: dict[str, Any] = {
    "l1": 5e-4,
    "mu-wire": "sparse",
    "init": "scaled",
    "optimizer-state": "fresh",
    "match-cap": 2.0,
}
AUTHORS_MODEL = "resnet9"  # modules/nets.py:23-62
FLAT_MODELS = (None, "mlp", "logreg")  # no conv: the ablation did not measure them


class FactorizedFLParams(MethodParams):
    namespace: ClassVar[str] = "factorized-fl"
    auto_keys: ClassVar[tuple[str, ...]] = (
        *("sim-threshold", "epsilon", "min-aggr"),
        *OURS,
    )
    profiles: ClassVar[tuple[str, ...]] = ("ours", "authors")
    authors_model: ClassVar[str] = AUTHORS_MODEL

    rank: int = Field(1, ge=1)
    l1: float = Field(5e-4, ge=0)
    mu_threshold: float = Field(5e-4, alias="mu-threshold", ge=0)
    sim_threshold: float = Field(0.0, alias="sim-threshold", ge=-1, le=1)
    min_aggr: int = Field(10, alias="min-aggr", ge=1)
    epsilon: float = Field(1.0, ge=0)
    # what the similarity compares: v (the paper) or v minus its initial value, which
    # every client shares (docs/factorized_fl.md: v barely leaves it at this budget)
    match: Literal["v", "v-change"] = "v"
    # one client is kept in at most match-cap x the lower median of how many other
    # clients' aggregates each client is kept in (those most similar to it): a
    # client that is everyone's nearest neighbour cannot enter every aggregate (0: off)
    match_cap: float = Field(2.0, alias="match-cap", ge=0)
    # beta's mu on the wire: the entries with |mu| >= mu-threshold (sparse), or every
    # entry (dense: the authors' code; the threshold then applies at evaluation only)
    mu_wire: Literal["sparse", "dense"] = Field("sparse", alias="mu-wire")
    # scaled: Xavier u, v rescaled to the layer's default weight spread, mu zero;
    # authors: u, v Xavier as drawn, the head's mu Xavier-dense (layers.py:17-30)
    init: Literal["scaled", "authors"] = "scaled"
    # fresh: SGD's momentum restarts every round; kept: each client's optimizer state
    # is its personal state, kept across rounds (and restarts) and never sent
    optimizer_state: Literal["fresh", "kept"] = Field("fresh", alias="optimizer-state")

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        profile = dict(AUTHORS if raw.get("profile") == "authors" else OURS)
        if raw.get("method") == "factorized-fl-alpha" and raw.get("model") not in FLAT_MODELS:
            # measured (docs/factorized_fl.md, the ablation): alpha on a conv backbone
            # gains on every seed with the authors' init (its personal head full rank)
            profile["init"] = "authors"
        if raw.get("partitioner") == "domain":
            matching = {"sim-threshold": 0.95, "epsilon": 20.0, "min-aggr": 4}
        else:
            matching = {"sim-threshold": 0.0, "epsilon": 1.0, "min-aggr": 10}
        return {**matching, **profile}

    def check(self, cfg: RunConfig) -> None:
        if cfg.profile == "authors" and cfg.model != AUTHORS_MODEL:
            raise ValueError(
                f"config key 'model': profile 'authors' of Factorized-FL runs the authors' "
                f"'{AUTHORS_MODEL}' (modules/nets.py:23-62), got '{cfg.model}': set "
                f"model='{AUTHORS_MODEL}', or profile='ours' to factorize another backbone"
            )


MATCHING_VECTOR = DisclosureKind(
    "matching-vector",
    "the personal factor v of the last layer before the head, as is (the server matches "
    "clients by it)",
)


def alpha_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """alpha keeps v personal but appends the v of the last layer before the head
    to every upload: the server matches clients by it (the paper's protocol)."""
    return (Disclosure(MATCHING_VECTOR, (f"*{V}",), "method='factorized-fl-alpha'"),)


def reference_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "local-epochs": 5,
        "batch-size": 256,
        "optimizer": "sgd",
        "lr": 0.001,
        "momentum": 0.9,
        "weight-decay": 1e-6,
    }


_PER_CLIENT = "its aggregation is a per-client mixture of the individual uploads"
_COMMON: dict[str, Any] = dict(
    params=FactorizedFLParams,
    schedule=reference_schedule,
    per_client=_PER_CLIENT,
)

METHODS = (
    Method(
        "factorized-fl-alpha",
        disclosures=alpha_disclosures,
        disclosure_kinds=(MATCHING_VECTOR,),
        attacks=("match-magnet",),
        **_COMMON,
    ),
    Method("factorized-fl-beta", **_COMMON),
)
