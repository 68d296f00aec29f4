"""FedRoD's local schedule: balanced softmax on the generic model, cross-entropy on
the personalised logits for the personal head, in the same steps."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import train_epochs
from methods.fedrod.model import FedRoDModel


def balanced_softmax(
    logits: torch.Tensor, y: torch.Tensor, log_prior: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy of the logits shifted by the log label prior (Ren et al. 2020):
    its minimiser is the class-balanced classifier. A class the client lacks gets
    log(1e-8): it leaves the softmax's normaliser."""
    return F.cross_entropy(logits + log_prior, y)


class FedRoDClient(PFLClient):
    """One optimizer over every tensor: the generic loss reaches the body and the
    generic head only, the personal loss the personal head only (detached inputs)."""

    model: FedRoDModel

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        classes = self.model.head.out_features
        counts = torch.bincount(self.y_train, minlength=classes).float()
        log_prior = torch.log(counts / counts.sum() + 1e-8).to(self.x_train.device)

        def loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            generic, personal = model.both(xb)  # type: ignore[operator]
            own = F.cross_entropy(generic.detach() + personal, yb)
            return balanced_softmax(generic, yb, log_prior) + own

        m, cfg = self.model, self.cfg
        train_loss = train_epochs(
            m,
            list(m.parameters()),
            self.x_train,
            self.y_train,
            cfg.local_epochs,
            cfg,
            generator,
            loss_fn=loss,
        )
        return {"train-loss": train_loss}


CLIENTS = {"fedrod": FedRoDClient}
