"""Baseline local schedules that differ from plain training."""

from __future__ import annotations

from typing import Any

import torch
from flwr.common import Scalar

from client_app.base import PFLClient
from client_app.train import train_epochs


class FedRepClient(PFLClient):
    """FedRep: ``head-epochs`` on the head (body frozen), then ``local-epochs`` on
    the body (head frozen), a fresh optimizer per phase."""

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        head = list(self.model.head.parameters())
        body = list(self.model.features.parameters())
        x, y, cfg = self.x_train, self.y_train, self.cfg
        head_loss = train_epochs(self.model, head, x, y, cfg.head_epochs, cfg, generator)
        body_loss = train_epochs(self.model, body, x, y, cfg.local_epochs, cfg, generator)
        return {"train-loss": body_loss, "head-loss": head_loss}
