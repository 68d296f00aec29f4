"""SCAFFOLD's local schedule (the paper's Algorithm 1, option II)."""

from __future__ import annotations

from typing import Any

import torch
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import train_epochs
from methods.scaffold.model import ScaffoldModel


class ScaffoldClient(PFLClient):
    """``local-epochs`` of SGD on the received model with each gradient corrected by
    ``c - c_i``, then c_i+ = c_i - c + (x - y) / (K lr) over its K steps; the
    ``control`` arrays go back as c + (c_i+ - c_i)."""

    model: ScaffoldModel

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, net = self.cfg, self.model.net
        params = list(net.parameters())
        x = [p.detach().clone() for p in params]
        c, c_i = self.model.control.of(net), self.model.own_control.of(net)
        drift = [a - b for a, b in zip(c, c_i)]
        steps, ce = 0, []

        def corrected(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            # the gradient of <c - c_i, w> is c - c_i: the correction, whatever the optimizer
            nonlocal steps
            steps += 1
            loss = self.loss(model, xb, yb)
            ce.append(loss.detach())
            return loss + sum((d * w).sum() for d, w in zip(drift, model.parameters()))

        train_epochs(
            net, params, self.x_train, self.y_train, cfg.local_epochs, cfg, generator, corrected
        )
        if steps:
            with torch.no_grad():
                for c_g, own, start, y in zip(c, c_i, x, params):
                    new = own - c_g + (start - y) / (steps * cfg.lr)
                    c_g.add_(new - own)  # the upload: c + (c_i+ - c_i)
                    own.copy_(new)
        return {"train-loss": float(torch.stack(ce).mean()) if ce else 0.0}


CLIENTS = {"scaffold": ScaffoldClient}
