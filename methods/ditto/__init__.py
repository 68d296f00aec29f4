"""Ditto (Li, Hu, Beirami and Smith, ICML 2021; docs/ditto.md): every client trains
the global model as FedAvg does, and beside it a personal model of its own, pulled
towards the global one by lambda/2 ||v - w||^2.

Split: the personal copy (``personal.*``) stays home; the global copy travels.
Schedule: ``local-epochs`` of cross-entropy on the global copy from the received
w, then ``ditto.personal-epochs`` on the personal copy with the proximal term to
that same received w (the paper's Algorithm 1). Aggregation: FedAvg's sample-
weighted mean of the global copy. Evaluation: the personal model.

The paper tunes lambda per device from {0.1, 1, 2} on clean data and fixes it at 1
for devices with too little validation data to tune: 1 here. Its local solver is
SGD; the schedule is the baselines' per backbone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams, check_proximal_pull
from pflower.config.schema import RunConfig


class DittoParams(MethodParams):
    namespace: ClassVar[str] = "ditto"
    auto_keys: ClassVar[tuple[str, ...]] = ("personal-epochs",)

    lam: float = Field(1.0, alias="lambda", ge=0)  # the pull of the personal model to w
    personal_epochs: int = Field(1, alias="personal-epochs", ge=1)  # auto: local-epochs

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        epochs = raw.get("local-epochs")
        ok = isinstance(epochs, int) and not isinstance(epochs, bool) and epochs >= 1
        return {"personal-epochs": epochs if ok else 1}

    def check(self, cfg: RunConfig) -> None:
        check_proximal_pull("ditto.lambda", self.lam, cfg)


METHODS = (
    Method(
        "ditto",
        params=DittoParams,
        schedule=baseline_schedule,
        # PFLlib's -mu default 0 (main.py:449) leaves the personal model unpulled (Local's):
        # the profile keeps ours, lambda 1
        pfllib="Ditto",
    ),
)
