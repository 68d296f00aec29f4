"""Ditto's local schedule (the paper's Algorithm 1)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import train_epochs
from methods.ditto import DittoParams
from methods.ditto.model import DittoModel


class DittoClient(PFLClient):
    """The global copy: ``local-epochs`` of cross-entropy from the received w (what
    goes back). The personal copy: ``ditto.personal-epochs`` of cross-entropy plus
    lambda/2 ||v - w||^2 to that received w, a fresh optimizer per copy."""

    model: DittoModel

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, x, y = self.cfg, self.x_train, self.y_train
        received = [p.detach().clone() for p in self.model.global_model.parameters()]
        glob, own = self.model.global_model, self.model.personal
        global_loss = train_epochs(
            glob, list(glob.parameters()), x, y, cfg.local_epochs, cfg, generator
        )
        lam = DittoParams.of(cfg).lam

        def proximal(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            pull = sum(((v - w) ** 2).sum() for v, w in zip(model.parameters(), received))
            return F.cross_entropy(model(xb), yb) + lam / 2 * pull

        personal_loss = train_epochs(
            own,
            list(own.parameters()),
            x,
            y,
            DittoParams.of(cfg).personal_epochs,
            cfg,
            generator,
            loss_fn=proximal,
        )
        return {"train-loss": personal_loss, "global-loss": global_loss}


CLIENTS = {"ditto": DittoClient}
