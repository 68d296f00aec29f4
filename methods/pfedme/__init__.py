"""pFedMe (Dinh, Tran and Nguyen, NeurIPS 2020, "Personalized Federated Learning with
Moreau Envelopes"; docs/pfedme.md): each client's personal model theta is the
proximal point of its loss at the global model, theta(w) = argmin f_i(theta) +
lambda/2 ||theta - w||^2, and the global model minimises the mean of the clients'
Moreau envelopes, whose gradient at w is lambda (w - theta(w)).

Split: the personal model theta (``personal_model.*``, parameters and buffers) stays
home; the client's copy of the global model w (``global_model.*``) travels. Schedule
(the paper's Algorithm 1), each batch: K gradient steps at ``pfedme.personal-lr`` on
f_i(theta; batch) + lambda/2 ||theta - w||^2 from the last theta (theta starts at the
received w each round), then w <- w - eta lambda (w - theta), a step of the run's
optimizer on that gradient (the paper's step under plain SGD). Aggregation: the mean
of the clients' w moved by beta, w <- (1 - beta) w + beta mean (a ``MeanPart`` with a
server step, as SCAFFOLD's model part); it is a mean, so SecAgg+ and DP apply.
Evaluation: theta, the paper's personalised accuracy.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import MeanPart, Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams, check_proximal_pull
from pflower.config.schema import RunConfig
from pflower.privacy.disclosure import Disclosure, DisclosureKind


class PFedMeParams(MethodParams):
    namespace: ClassVar[str] = "pfedme"
    auto_keys: ClassVar[tuple[str, ...]] = ("lambda", "personal-lr", "beta", "mu")
    # PFLlib's main.py defaults: -lam 1.0 (:447), -lrp 0.01 (:452), -K 5 (:450, ours
    # too); its -bt 0.0 (:446) would never move the global model (serverpFedMe.py:224),
    # so the profile keeps the paper's beta = 1 (plain mean); mu 0.001 is
    # pFedMeOptimizer's default (fedoptimizer.py:34), which clientpFedMe.py:21 keeps
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {
        "pfllib": {"lambda": 1.0, "personal-lr": 0.01, "beta": 1.0, "mu": 0.001}
    }

    # K: gradient steps on the inner problem per batch (the paper's K = 5)
    k: int = Field(5, alias="k", ge=1)
    # lambda: the pull of theta to w (the authors' non-convex MNIST run: 15)
    lam: float = Field(15.0, alias="lambda", gt=0)
    # the inner steps' size (the authors' non-convex MNIST run: 0.09)
    personal_lr: float = Field(0.09, alias="personal-lr", gt=0)
    # the server's step: w <- (1 - beta) w + beta mean (1: the mean itself)
    beta: float = Field(1.0, alias="beta", gt=0)
    # an L2 term mu/2 ||theta||^2 in the inner problem (the paper: none)
    mu: float = Field(0.0, alias="mu", ge=0)
    # which model is scored: 'personal' (theta, the paper's personalised accuracy) or
    # 'global' (w, with theta's buffers: what PFLlib's numbers measure, docs/pfedme.md)
    evaluate: Literal["personal", "global"] = Field("personal", alias="evaluate")

    def check(self, cfg: RunConfig) -> None:
        # the inner steps are plain gradient steps on a problem of curvature at least
        # lambda + mu: past 2 / (lambda + mu) theta diverges
        if self.personal_lr * (self.lam + self.mu) >= 2:
            raise ValueError(
                f"config key 'pfedme.personal-lr' ({self.personal_lr}) with 'pfedme.lambda' "
                f"({self.lam}) and 'pfedme.mu' ({self.mu}): the inner steps diverge when "
                "personal-lr * (lambda + mu) >= 2; lower 'pfedme.personal-lr'"
            )
        # w's step is the run's optimizer on the gradient lambda (w - theta)
        check_proximal_pull("pfedme.lambda", self.lam, cfg)


PERSONAL_MODEL_TRACK = DisclosureKind(
    "personal-model-track",
    "the personal model theta, on average over the round: each batch moves w by "
    "eta lambda (theta - w), so the client's update of w is a weighted sum of the "
    "round's thetas; with one local batch the server rebuilds theta exactly, as "
    "w + (y - w) / (eta lambda)",
)


def pfedme_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """theta's track: under SecAgg+ the server sees only the round's sum of updates."""
    return (
        Disclosure(
            PERSONAL_MODEL_TRACK,
            ("personal_model.*",),
            "method='pfedme'",
            audited=not cfg.secure_aggregation,
        ),
    )


def beta_step(cfg: RunConfig, share: float) -> float:
    """w + beta (mean - w): the paper's w <- (1 - beta) w + beta mean."""
    return PFedMeParams.of(cfg).beta


METHODS = (
    Method(
        "pfedme",
        aggregation="mean",  # the paper's Algorithm 1: the plain mean over the sampled clients
        pfllib="pFedMe",
        params=PFedMeParams,
        schedule=baseline_schedule,
        disclosures=pfedme_disclosures,
        disclosure_kinds=(PERSONAL_MODEL_TRACK,),
        means=(MeanPart("", step=beta_step),),
    ),
)
