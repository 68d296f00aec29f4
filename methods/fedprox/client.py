"""FedProx's local schedule: cross-entropy plus mu/2 ||w - w_g||^2, w_g the received
global model, fixed for the round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import LossFn, cross_entropy, train_epochs
from methods.fedprox import FedProxParams


def with_proximal_term(
    anchor: Sequence[torch.Tensor], mu: float, loss_fn: LossFn = cross_entropy
) -> LossFn:
    """``loss_fn`` plus mu/2 ||w - anchor||^2 over the model's parameters, in their
    order (``anchor``: detached copies). Its gradient adds mu (w - anchor) to the
    loss's, the perturbation the paper's solver applies."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = list(model.parameters())
        if len(params) != len(anchor):
            raise ValueError(f"the anchor has {len(anchor)} tensors, the model {len(params)}")
        pull = sum(((w - g) ** 2).sum() for w, g in zip(params, anchor))
        return loss_fn(model, x, y) + mu / 2 * pull

    return loss


class FedProxClient(PFLClient):
    """Every parameter for ``local-epochs`` on the proximal objective, from the
    received model; the anchor lives only for this call (nothing is left on the
    model, which a simulated worker reuses for the next client)."""

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        m, cfg = self.model, self.cfg
        # nothing is personal: the model is exactly the received global one here
        anchor = [p.detach().clone() for p in m.parameters()]
        train_loss = train_epochs(
            m,
            list(m.parameters()),
            self.x_train,
            self.y_train,
            cfg.local_epochs,
            cfg,
            generator,
            loss_fn=with_proximal_term(anchor, FedProxParams.of(cfg).mu, self.loss),
        )
        return {"train-loss": train_loss}


CLIENTS = {"fedprox": FedProxClient}
