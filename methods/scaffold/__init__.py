"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, ICML 2020;
docs/scaffold.md): stochastic controlled averaging. A client corrects each local
gradient by ``c - c_i`` (the server's control variate minus its own), so local steps
follow the federation's direction rather than its own data's drift.

Split: the client's control variate c_i (``own_control.*``) stays home; the model
(``net.*``) and the server's control variate c (``control.*``) travel. The client
uploads its model y_i and, in the ``control.*`` arrays, c + (c_i+ - c_i) (the
paper's option II: c_i+ = c_i - c + (x - y_i) / (K lr)). Aggregation: a mean in two
parts (``Method.means``, the worked example in docs/ADDING_A_METHOD.md): the model by
the run's rule, moved by ``scaffold.server-lr`` (x + eta_g (mean y - x)); c by equal
weights, moved by the share of the federation in the round (c + |S|/N mean dc), as
the paper's Algorithm 1.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from methods import MeanPart, Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams
from pflower.config.schema import RunConfig
from pflower.privacy.disclosure import Disclosure, DisclosureKind


class ScaffoldParams(MethodParams):
    namespace: ClassVar[str] = "scaffold"

    # eta_g: the paper's Algorithm 1 and its experiments use 1 (PFLlib's -slr too)
    server_lr: float = Field(1.0, alias="server-lr", gt=0)

    def check(self, cfg: RunConfig) -> None:
        # option II's c_i+ = c_i - c + (x - y) / (K lr) reads the K steps as SGD steps of
        # size lr; Adam's steps are not, and the control variates then drive the model
        # off (measured on Fed-Heart-Disease, docs/scaffold.md)
        if cfg.optimizer != "sgd":
            raise ValueError(
                f"config key 'optimizer': SCAFFOLD's control variates assume SGD steps "
                f"(option II divides the model's change by K x lr), got '{cfg.optimizer}': "
                "use optimizer='sgd'"
            )


CONTROL_UPDATE = DisclosureKind(
    "control-variate-update",
    "the client's control variate c_i: each round sends c + (c_i+ - c_i) beside the "
    "model, the server knows c, and c_i starts at zero, so the server sums the client's "
    "control variate exactly (under option II each update is (x - y_i) / (K lr) - c: "
    "the model update and the local step count K)",
)


def scaffold_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """c_i, rebuilt from its updates; under SecAgg+ only the round's sum of updates."""
    return (
        Disclosure(
            CONTROL_UPDATE,
            ("own_control.*",),
            "method='scaffold'",
            audited=not cfg.secure_aggregation,
        ),
    )


def model_step(cfg: RunConfig, share: float) -> float:
    """x + eta_g (mean y - x)."""
    return ScaffoldParams.of(cfg).server_lr


def control_step(cfg: RunConfig, share: float) -> float:
    """c + |S|/N (mean (c + dc_i) - c): the sampled share of the federation."""
    return share


METHODS = (
    Method(
        "scaffold",
        aggregation="mean",  # the paper's Algorithm 1: both means unweighted
        pfllib="SCAFFOLD",
        params=ScaffoldParams,
        schedule=baseline_schedule,
        disclosures=scaffold_disclosures,
        disclosure_kinds=(CONTROL_UPDATE,),
        means=(
            MeanPart("control.", weights="equal", step=control_step),
            MeanPart("", step=model_step),
        ),
    ),
)
