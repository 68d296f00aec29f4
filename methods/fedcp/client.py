"""FedCP's local schedule.

receive: phi, h_g and the CPN from the server; the frozen copy phi_g <- phi;
the context is recomputed from the kept personal head. Train phi, h_p and the
CPN on CE + mmd-lambda * MMD(phi(x), phi_g(x)) with h_g frozen, then blend
h_g <- 0.5 h_p + 0.5 h_g before the shared tensors go up.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch
import torch.nn.functional as F
from flwr.common import NDArrays, Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import evaluate, train_epochs
from methods.fedcp import FedCPParams
from methods.fedcp.model import FedCPModel, mmd_rbf

GLOBAL_RNG = threading.Lock()  # held while a client's training draws from torch's global RNG


class FedCPClient(PFLClient):
    """Keeps phi_g, the frozen copy of the received extractor, outside the model's
    state_dict: it is neither shipped nor stored, only refreshed on receive."""

    model: FedCPModel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phi_g: nn.Module = copy.deepcopy(self.model.features).requires_grad_(False)

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        super().receive(parameters, config)  # phi, h_g, CPN <- global; h_p kept
        self.phi_g.load_state_dict(self.model.features.state_dict())
        self.model.refresh_context()

    def _loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits, h, _ = self.model.forward_parts(x)
        loss = F.cross_entropy(logits, y)
        if FedCPParams.of(self.cfg).mmd_lambda > 0:
            self.phi_g.train(model.training)  # same mode as phi, as the reference
            with torch.no_grad():
                h_global = self.phi_g(x)
            loss = loss + FedCPParams.of(self.cfg).mmd_lambda * mmd_rbf(h, h_global)
        return loss

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        m = self.model
        params = [*m.features.parameters(), *m.head.parameters(), *m.cpn.parameters()]
        # the gumbel noise comes from torch's global RNG (F.gumbel_softmax takes no
        # generator): seed it from the round's generator, and restore it afterwards;
        # one client at a time holds it (the in-process engine trains clients side by side)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with GLOBAL_RNG, torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            loss = train_epochs(
                m,
                params,
                self.x_train,
                self.y_train,
                self.cfg.local_epochs,
                self.cfg,
                generator,
                loss_fn=self._loss,
            )
        with torch.no_grad():
            for g, p in zip(m.global_head.parameters(), m.head.parameters(), strict=True):
                g.mul_(0.5).add_(p, alpha=0.5)
        return {"train-loss": loss}

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """Accuracy, and the PIR: the mean share pm of features routed to h_p."""
        pm_sum = torch.zeros((), device=self.device)

        def predict(x: torch.Tensor) -> torch.Tensor:
            nonlocal pm_sum
            logits, _, pm = self.model.forward_parts(x)
            pm_sum += pm.sum()
            return logits

        extra: dict[str, float] = {}
        loss, acc = evaluate(self.model, self.x_test, self.y_test, predict=predict, extra=extra)
        cells = int(self.y_test.shape[0]) * self.model.feature_dim
        return loss, {"accuracy": acc, "pir": float(pm_sum) / max(cells, 1), **extra}


CLIENTS = {"fedcp": FedCPClient}
