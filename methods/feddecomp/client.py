"""FedDecomp's local schedule."""

from __future__ import annotations

from typing import Any

import torch
from flwr.common import Scalar

from client_app.base import PFLClient
from client_app.train import train_epochs
from methods.feddecomp import FedDecompParams
from methods.feddecomp.model import frozen_tau, non_tau_parameters, tau_parameters


class FedDecompClient(PFLClient):
    """Alternating (default): ``lora-epochs`` on tau only (every A and B), then
    ``local-epochs - lora-epochs`` on sigma only, a fresh optimizer per phase.
    As the reference (``mark_only_weight_as_trainable``), the sigma phase also
    trains the biases and BatchNorm affine parameters, and BatchNorm running
    stats update in both phases (the model is in train mode throughout).
    ``decomp-schedule = simultaneous``: every parameter for ``local-epochs``
    with one optimizer (paper Table 3)."""

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, x, y, model = self.cfg, self.x_train, self.y_train, self.model
        if FedDecompParams.of(cfg).schedule == "simultaneous":
            params = list(model.parameters())
            return {
                "train-loss": train_epochs(model, params, x, y, cfg.local_epochs, cfg, generator)
            }
        tau_loss = train_epochs(
            model, tau_parameters(model), x, y, FedDecompParams.of(cfg).lora_epochs, cfg, generator
        )
        with frozen_tau(model):  # tau is constant in this phase: compute it once
            sigma_loss = train_epochs(
                model,
                non_tau_parameters(model),
                x,
                y,
                cfg.local_epochs - FedDecompParams.of(cfg).lora_epochs,
                cfg,
                generator,
            )
        last = sigma_loss if cfg.local_epochs > FedDecompParams.of(cfg).lora_epochs else tau_loss
        return {"train-loss": last, "tau-loss": tau_loss, "sigma-loss": sigma_loss}

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """Global sigma + own tau on the own test split."""
        with frozen_tau(self.model):
            return super().score()


CLIENTS = {"feddecomp": FedDecompClient}
