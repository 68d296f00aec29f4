"""Baseline local schedules that differ from plain training."""

from __future__ import annotations

from typing import Any

import torch
from flwr.common import Scalar

from client_app.base import PFLClient, score_fine_tuned
from client_app.train import train_epochs
from methods.baselines import FedAvgFTParams, FedRepParams


class FedRepClient(PFLClient):
    """FedRep: ``head-epochs`` on the head (body frozen), then ``local-epochs`` on
    the body (head frozen), a fresh optimizer per phase."""

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        head = list(self.model.head.parameters())
        body = list(self.model.features.parameters())
        x, y, cfg = self.x_train, self.y_train, self.cfg
        head_loss = train_epochs(
            self.model, head, x, y, FedRepParams.of(cfg).head_epochs, cfg, generator
        )
        body_loss = train_epochs(self.model, body, x, y, cfg.local_epochs, cfg, generator)
        return {"train-loss": body_loss, "head-loss": head_loss}


class FedAvgFTClient(PFLClient):
    """FedAvg + local fine-tuning: FedAvg's training; each evaluation scores a copy
    of the received global model fine-tuned for ``finetune-epochs`` on the
    client's own train split. The copy is discarded: it never leaves the client
    and the next round starts from the global model again."""

    def score(self) -> tuple[float, dict[str, Scalar]]:
        return score_fine_tuned(self, FedAvgFTParams.of(self.cfg).finetune_epochs)


CLIENTS = {"fedrep": FedRepClient, "fedavg-ft": FedAvgFTClient}
