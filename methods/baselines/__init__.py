"""The baselines: trivial choices of the three parts of a method.

Their local schedule is one epoch of SGD with the step size each backbone trains
stably at (mlp: lr 0.05; cnn4: lr 0.01 with momentum 0.9, since lr 0.05 collapsed
FedAvg's CNN; ResNets with BatchNorm: lr 0.1 with momentum 0.9).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from methods import Method
from pflower.config.params import MethodParams

PER_BACKBONE = {
    "mlp": {"lr": 0.05, "momentum": 0.0, "batch-size": 32},
    "cnn4": {"lr": 0.01, "momentum": 0.9, "batch-size": 50},
    "resnet": {"lr": 0.1, "momentum": 0.9, "batch-size": 50},
}


def baseline_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    model = str(raw.get("model", "mlp"))
    family = "resnet" if model.startswith("resnet") else {"logreg": "mlp"}.get(model, model)
    return {"local-epochs": 1, "optimizer": "sgd", "weight-decay": 0.0, **PER_BACKBONE[family]}


class FedRepParams(MethodParams):
    namespace: ClassVar[str] = "fedrep"
    head_epochs: int = Field(1, alias="head-epochs", ge=1)  # on the head, before the body


class FedAvgFTParams(MethodParams):
    namespace: ClassVar[str] = "fedavg-ft"
    finetune_epochs: int = Field(1, alias="finetune-epochs", ge=0)  # before each evaluation


METHODS = (
    Method("fedavg", schedule=baseline_schedule, pfllib="FedAvg"),
    Method("fedavg-ft", params=FedAvgFTParams, schedule=baseline_schedule),
    Method(
        "local",
        schedule=baseline_schedule,
        pfllib="Local",
        per_client="nothing leaves a client, so there is nothing to aggregate",
    ),
    Method("fedper", schedule=baseline_schedule, pfllib="FedPer"),
    Method("fedrep", params=FedRepParams, schedule=baseline_schedule, pfllib="FedRep"),
    Method("fedbn", schedule=baseline_schedule, pfllib="FedBN"),
)
