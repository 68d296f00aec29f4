"""FedDecomp (docs/feddecomp.md): every weight = shared full-rank sigma + personal
low-rank tau = B A.

Split: every A and B personal. Schedule: ``lora-epochs`` on tau, then the rest of
``local-epochs`` on sigma. Aggregation: the plain mean of sigma (paper eq. 7;
``aggregation=weighted`` on request). The paper's schedule: E = 5 (2 on tau, 3 on
sigma), SGD lr 0.1, momentum 0.9, batch 100; CIFAR-10's best rank ratios R_c = R_l
= 0.6.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from pflower.config.params import MethodParams
from pflower.config.schema import RunConfig


class FedDecompParams(MethodParams):
    namespace: ClassVar[str] = "feddecomp"
    auto_keys: ClassVar[tuple[str, ...]] = ("lora-epochs",)

    rank_basis: Literal["min", "out"] = Field("min", alias="rank-basis")
    conv_rank_ratio: float = Field(0.6, alias="conv-rank-ratio", gt=0, le=1)
    linear_rank_ratio: float = Field(0.6, alias="linear-rank-ratio", gt=0, le=1)
    linear_rank_abs: int = Field(0, alias="linear-rank-abs", ge=0)
    lora_epochs: int = Field(2, alias="lora-epochs", ge=0)
    schedule: Literal["alternating", "simultaneous"] = "alternating"
    reverse: bool = False

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        """The paper's 2 of 5 epochs on tau, in proportion when local-epochs changes:
        at least 1 epoch on tau and 1 on sigma."""
        epochs = raw.get("local-epochs")
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            return {"lora-epochs": 2}  # the schema names the bad local-epochs
        if raw.get("feddecomp.schedule", "alternating") == "alternating" and epochs < 2:
            raise ValueError(
                f"config key 'local-epochs': FedDecomp's alternating round needs at least 2 "
                f"epochs (lora-epochs on tau, the rest on sigma), got {epochs}; leave it "
                "'auto' (5, the paper's) or set feddecomp.lora-epochs yourself"
            )
        return {"lora-epochs": max(1, min(round(epochs * 2 / 5), epochs - 1))}

    def check(self, cfg: RunConfig) -> None:
        if self.schedule == "alternating" and self.lora_epochs > cfg.local_epochs:
            raise ValueError(
                f"config key 'feddecomp.lora-epochs' ({self.lora_epochs}) must be <= "
                f"'local-epochs' ({cfg.local_epochs}): a FedDecomp round is lora-epochs on "
                "tau, then local-epochs - lora-epochs on sigma (the paper: 5 and 2, the "
                "'auto' default)"
            )


def paper_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "local-epochs": 5,
        "batch-size": 100,
        "optimizer": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "weight-decay": 0.0,
    }


METHODS = (
    Method(
        "feddecomp",
        aggregation="mean",
        params=FedDecompParams,
        schedule=paper_schedule,
    ),
)
