"""FedBABU's local schedule: the body alone during the federation; before each
evaluation, the whole model fine-tuned in a copy that is scored and dropped."""

from __future__ import annotations

from typing import Any

import torch
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient, score_fine_tuned
from client_app.train import train_epochs
from methods.fedbabu import FedBABUParams


class FedBABUClient(PFLClient):
    """Training: ``local-epochs`` on the shared entries' parameters (the body), the
    head left out of the optimizer and its gradient off (``train_epochs`` trains only
    the parameters it is given), so it stays the seeded initial head bit for bit.
    Evaluation: a fine-tuned copy (``finetuned``), never uploaded."""

    def body(self, model: nn.Module) -> list[nn.Parameter]:
        """The parameters of ``model`` the split shares: everything but the head."""
        shared = set(self.roles.shared)
        return [p for name, p in model.named_parameters() if name in shared]

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg = self.cfg
        loss = train_epochs(
            self.model,
            self.body(self.model),
            self.x_train,
            self.y_train,
            cfg.local_epochs,
            cfg,
            generator,
            loss_fn=self.loss,
        )
        return {"train-loss": loss}

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """A copy (received body, fixed head) fine-tuned on every parameter, body and head
        alike (the paper's fine-tuning; PFLlib's ``fine_tune`` default too); the model's
        own score (its random head) beside it."""
        return score_fine_tuned(self, FedBABUParams.of(self.cfg).finetune_epochs)


CLIENTS = {"fedbabu": FedBABUClient}
