"""GPFL's local schedule.

receive: the extractor, the CoV and the GCE from the server; C^ <- the received GCE
(frozen, for the magnitude-level loss); 'paper': g and p_i from it. Train every
tensor on CE(head(f_P), y) + the angle-level loss + lambda x the magnitude-level loss,
with mu added to the CoV's and the GCE's weight decay; 'pfllib': then g and p_i from
the trained GCE.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from flwr.common import NDArrays, Scalar

from client_app.base import PFLClient
from client_app.train import make_optimizer, train_epochs
from methods.gpfl import GpflParams
from methods.gpfl.model import GPFLModel
from pflower.config.schema import RunConfig


def angle_loss(f_g: torch.Tensor, y: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """The angle-level guidance (Eq. 3): cross-entropy of the cosines between each
    f_G and every class embedding, averaged over the batch."""
    cosines = F.normalize(f_g, dim=1) @ F.normalize(embeddings, dim=1).T
    return F.cross_entropy(cosines, y)


def magnitude_loss(f_g: torch.Tensor, targets: torch.Tensor, per_sample: bool) -> torch.Tensor:
    """The magnitude-level guidance ||f_G - C^[y]||_2 (Eq. 4): per sample, averaged
    over the batch (the paper's expectation), or (``per_sample=False``, PFLlib's
    clientgpfl.py:77) the one norm of the whole batch's differences."""
    diff = f_g - targets
    return diff.norm(dim=1).mean() if per_sample else diff.norm()


def gpfl_optimizer(model: GPFLModel, cfg: RunConfig, mu: float) -> torch.optim.Optimizer:
    """The run's optimizer over every tensor, with mu added to the weight decay of the
    CoV and the GCE: the gradient of mu/2 (||CoV||^2 + ||C||^2), applied as PFLlib
    applies it (``weight_decay=mu`` on their optimizers, clientgpfl.py:21-29), so the
    reported loss leaves it out as PFLlib's does."""
    decayed = [*model.cov.parameters(), *model.gce.parameters()]
    own = {id(p) for p in decayed}
    opt = make_optimizer([p for p in model.parameters() if id(p) not in own], cfg)
    opt.add_param_group({"params": decayed, "weight_decay": cfg.weight_decay + mu})
    return opt


def class_proportions(y: torch.Tensor, classes: int) -> torch.Tensor:
    """The share of each class among ``y`` (all zeros for no samples)."""
    counts = torch.bincount(y, minlength=classes).float()
    return counts / counts.sum().clamp_min(1.0)


class GpflClient(PFLClient):
    """Keeps C^, the frozen copy of the received GCE, outside the model's state_dict:
    it is neither shipped nor stored, only refreshed on receive."""

    model: GPFLModel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params = GpflParams.of(self.cfg)
        classes = self.model.head.out_features
        self.proportions = class_proportions(self.y_train, classes).to(self.device)
        self.frozen = self.model.gce.weight.detach().clone()

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        super().receive(parameters, config)  # extractor, CoV, GCE <- global; the rest kept
        self.frozen = self.model.gce.weight.detach().clone()
        if self.params.variant == "paper":
            self.model.set_conditional_inputs(self.frozen, self.proportions)

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local loss of one batch: CE + angle + lambda x magnitude (mu is in the
        optimizer's weight decay)."""
        m, params = self.model, self.params
        logits, f_g = m.both(x)
        loss = F.cross_entropy(logits, y) + angle_loss(f_g, y, m.gce.weight)
        if params.lam > 0:
            targets = self.frozen[y]
            loss = loss + params.lam * magnitude_loss(f_g, targets, params.variant == "paper")
        return loss

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        m = self.model
        loss = train_epochs(
            m,
            list(m.parameters()),
            self.x_train,
            self.y_train,
            self.cfg.local_epochs,
            self.cfg,
            generator,
            loss_fn=lambda _, x, y: self.objective(x, y),
            optimizer=gpfl_optimizer(m, self.cfg, self.params.mu),
        )
        if self.params.variant == "pfllib":  # clientgpfl.py:102-108, from the trained GCE
            m.set_conditional_inputs(m.gce.weight.detach(), self.proportions)
        return {"train-loss": loss}


CLIENTS = {"gpfl": GpflClient}
