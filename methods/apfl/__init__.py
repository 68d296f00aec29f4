"""APFL (Deng, Kamani and Mahdavi, 2020, "Adaptive Personalized Federated Learning";
docs/apfl.md): every client trains the global model w as FedAvg does and beside it a
local model v of its own; its personalised model is the mix of their parameters,
alpha v + (1 - alpha) w, with a mixing weight alpha in [0, 1] that it learns.

Split: the local model (``local_model.*``) and alpha stay home; the global copy
(``global_model.*``) travels. Schedule (the paper's Algorithm 1, with its adaptive
alpha), each batch from the same point: w steps on its own loss; v steps on the loss
of the mix (the gradient with respect to v); alpha steps on the mix's loss too, its
gradient <v - w, grad f(mix)>, then is clipped to [0, 1]. Aggregation: FedAvg's
sample-weighted mean of w. Evaluation: the mix, with the received w.

``apfl.variant='pfllib'`` runs PFLlib's reading instead (docs/apfl.md lists where it
differs). The schedule is the baselines' per backbone (as Ditto's), not tuned.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams
from pflower.config.schema import RunConfig
from pflower.privacy.disclosure import Disclosure, DisclosureKind

# PFLlib's weight decay on alpha (clientapfl.py:76, after the authors' FedTorch code)
PFLLIB_ALPHA_DECAY = 0.02


def _positive(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


class ApflParams(MethodParams):
    namespace: ClassVar[str] = "apfl"
    auto_keys: ClassVar[tuple[str, ...]] = ("alpha-lr", "alpha-decay", "alpha", "variant")
    # PFLlib: -al 1.0 (main.py:465) and its reading of the schedule (docs/apfl.md)
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {
        "pfllib": {"alpha": 1.0, "variant": "pfllib"}
    }

    # the mixing weight of the local model, where alpha starts (the authors' code's 0.5)
    alpha: float = Field(0.5, alias="alpha", ge=0, le=1)
    # alpha learned by its gradient each batch (the paper's adaptive alpha), or held
    adaptive_alpha: bool = Field(True, alias="adaptive-alpha")
    # alpha's step size; auto: the run's lr (the paper's eta_t, PFLlib's too)
    alpha_lr: float = Field(0.05, alias="alpha-lr", ge=0)
    # a weight decay on alpha, added to its gradient; auto: 0 (the paper), 0.02 (pfllib)
    alpha_decay: float = Field(0.0, alias="alpha-decay", ge=0)
    # 'paper': v on the mix's loss, alpha's gradient at the mix, the mix evaluated;
    # 'pfllib': v on its own loss, PFLlib's alpha gradient, v set to the mix each round
    variant: Literal["paper", "pfllib"] = Field("paper", alias="variant")

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        pfllib = raw.get(f"{cls.namespace}.variant") == "pfllib"
        return {
            "alpha-lr": _positive(raw.get("lr")) or 0.05,
            "alpha-decay": PFLLIB_ALPHA_DECAY if pfllib else 0.0,
        }


LOCAL_MODEL_TRACK = DisclosureKind(
    "local-model-track",
    "the local model v, approximately: v starts at the global model, and each round it "
    "moves by about alpha times the client's update of w (y - x), which the server "
    "sees; from a client's first round the server can follow v (the content audit "
    "rebuilds it from what was sent and received)",
)


def apfl_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """v's track: under SecAgg+ the server sees only the round's sum of updates."""
    return (
        Disclosure(
            LOCAL_MODEL_TRACK,
            ("local_model.*",),
            "method='apfl'",
            audited=not cfg.secure_aggregation,
        ),
    )


METHODS = (
    Method(
        "apfl",
        params=ApflParams,
        pfllib="APFL",
        schedule=baseline_schedule,
        disclosures=apfl_disclosures,
        disclosure_kinds=(LOCAL_MODEL_TRACK,),
    ),
)
