"""FedBABU (Oh, Kim and Yun, ICLR 2022, "FedBABU: Towards Enhanced Representation for
Federated Image Classification"; docs/fedbabu.md): the head stays at its random
initialisation through the whole federation, only the body is trained and averaged,
and every client fine-tunes the whole model on its own data before it is scored.

Split: the head (``head.*``) never travels. It never changes either: every client
builds it from the run's seed, as the server does, so all heads are one and the same
random head, and keeping it off the wire keeps it bit for bit what it was (a server
mean of equal heads, DP noise or a codec would each move it). Schedule: ``local-epochs``
on the body alone, the head outside the optimizer. Aggregation: FedAvg's
sample-weighted mean of the body. Evaluation: a copy of the received body and the
fixed head, fine-tuned (body and head, the run's optimizer and lr) for
``fedbabu.finetune-epochs`` on the client's train split; the copy is scored and
dropped, so the next round starts from the received body again.

The paper fine-tunes for tau_f = 5 epochs (the authors' code: ``--ft_ep`` 5); PFLlib
for 10 (``--fine_tuning_epochs``), once, after the last round. Its local schedule is
the baselines' per backbone, not tuned.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams


class FedBABUParams(MethodParams):
    namespace: ClassVar[str] = "fedbabu"
    auto_keys: ClassVar[tuple[str, ...]] = ("finetune-epochs",)
    # PFLlib's -fte 10 (main.py:471)
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {"pfllib": {"finetune-epochs": 10}}

    # epochs of fine-tuning the whole model before each evaluation (0: score the
    # received body with the random head, as PFLlib does in every round but the last)
    finetune_epochs: int = Field(5, alias="finetune-epochs", ge=0)


METHODS = (
    Method(
        "fedbabu",
        params=FedBABUParams,
        schedule=baseline_schedule,
        pfllib="FedBABU",
    ),
)
