"""DualFed (docs/dualfed.md): a shared encoder and global classifier, a personal
projector and personal classifier (and BN statistics); stage-wise local training;
the plain mean, as the reference averages models unweighted.

The paper's schedule (for an ImageNet-pretrained encoder): SGD lr 0.01, momentum
0.5, batch 256, E = 1 per stage, SupCon temperature 0.2 and lambda 40. From random
init on images the ``auto`` values differ, each for a reason measured in
docs/dualfed.md: batch 50 (batch 256 leaves the personal branch too few steps),
supcon-lambda 1 (40 swamps the personal branch's CE), stage 2 at 20 epochs and lr
0.1 (h_s stays flat otherwise), and the global head's prediction moved to the
client's label prior where a chi-square test finds its labels skewed.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from pflower.config.defaults import is_image
from pflower.config.params import MethodParams


def _from_scratch_on_images(raw: dict[str, Any]) -> bool:
    return is_image(raw) and not raw.get("pretrained-weights")


class DualFedParams(MethodParams):
    namespace: ClassVar[str] = "dualfed"
    auto_keys: ClassVar[tuple[str, ...]] = (
        "supcon-lambda",
        "global-head-epochs",
        "global-head-lr",
        "global-prior",
    )

    supcon_lambda: float = Field(1.0, alias="supcon-lambda", ge=0)
    supcon_temperature: float = Field(0.2, alias="supcon-temperature", gt=0)
    # stage 2: h_s on the frozen z
    global_head_epochs: int = Field(1, alias="global-head-epochs", ge=1)
    global_head_lr: float = Field(0.01, alias="global-head-lr", gt=0)
    schedule: Literal["stagewise", "simultaneous"] = "stagewise"
    combine: Literal["logits", "probabilities"] = "probabilities"
    # the personal branch's cross-entropy: on h_p(u) alone (the paper), or on the combined
    # prediction (h_s frozen in stage 1), so h_p learns what h_s gets wrong on this client
    personal_loss: Literal["personal", "combined"] = Field("personal", alias="personal-loss")
    # the global head's prediction as the combination uses it: as is (the paper), or moved
    # to this client's label prior (h_s(z) + log of the client's training label frequencies:
    # Bayes' rule for a label shift from a balanced federation; the counts stay local), or
    # that only where a chi-square test finds the client's labels unlike uniform at 5%
    global_prior: Literal["none", "client", "client-if-skewed"] = Field(
        "none", alias="global-prior"
    )
    projector_hidden: int = Field(256, alias="projector-hidden", ge=1)

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        scratch = _from_scratch_on_images(raw)
        return {
            "supcon-lambda": 40.0 if raw.get("pretrained-weights") else 1.0,
            "global-head-epochs": 20 if scratch else raw.get("local-epochs", 1),
            "global-head-lr": 0.1 if scratch else raw.get("lr", 0.01),
            "global-prior": "client-if-skewed" if scratch else "none",
        }


def dualfed_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "local-epochs": 1,
        "batch-size": 50 if _from_scratch_on_images(raw) else 256,
        "optimizer": "sgd",
        "lr": 0.01,
        "momentum": 0.5,
        "weight-decay": 0.0,
        "augment": "flip-rotate",  # the paper's: flips and rotations
    }


METHODS = (
    Method(
        "dualfed",
        aggregation="mean",
        params=DualFedParams,
        schedule=dualfed_schedule,
    ),
)
