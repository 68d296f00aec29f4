"""FedCP (KDD 2023): a Conditional Policy Network routes each feature between a
personal head and a global head.

State dict: ``features.*`` (phi, shared), ``head.*`` (personal head h_p),
``global_head.*`` (h_g, shared, frozen during local training), ``cpn.*``
(the CPN, shared). The context vector is a non-persistent buffer derived from
h_p, so it is neither shipped nor stored; the frozen copy phi_g used by the MMD
loss lives on the client, not in this module.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from methods import ModelSide
from methods.fedcp import FedCPParams
from pflower.config.schema import RunConfig

# kernel bandwidths of the reference's RBF MMD
MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


class FedCPModel(nn.Module):
    """phi -> CPN(h * c) gives (pm, gm); output h_p(h * pm) + h_g(h * gm)."""

    def __init__(self, backbone: nn.Module, tau: float = 1.0, noisy_eval: bool = False) -> None:
        super().__init__()
        head: nn.Linear = backbone.head
        dim = head.in_features
        self.features = backbone.features
        self.head = head
        self.global_head = copy.deepcopy(head)
        self.cpn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.LayerNorm(2 * dim), nn.ReLU())
        self.tau = tau
        self.noisy_eval = noisy_eval
        self.register_buffer("context", torch.zeros(dim), persistent=False)
        self.refresh_context()

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    @torch.no_grad()
    def refresh_context(self) -> None:
        """c = the personal head's weight summed over classes, L2-normalised."""
        self.context.copy_(F.normalize(self.head.weight.detach().sum(dim=0), dim=0))

    def routes(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pm, gm), each (B, D), pm + gm = 1. Gumbel-softmax (soft) in training
        and with ``noisy_eval``; a plain softmax at evaluation otherwise."""
        logits = self.cpn(h * self.context).view(h.shape[0], 2, -1)
        if self.training or self.noisy_eval:
            probs = F.gumbel_softmax(logits, tau=self.tau, hard=False, dim=1)
        else:
            probs = F.softmax(logits / self.tau, dim=1)
        return probs[:, 0], probs[:, 1]

    def forward_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits, features h, pm)."""
        h = self.features(x)
        pm, gm = self.routes(h)
        return self.head(h * pm) + self.global_head(h * gm), h, pm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_parts(x)[0]


def mmd_rbf(
    x: torch.Tensor, y: torch.Tensor, bandwidths: tuple[float, ...] = MMD_BANDWIDTHS
) -> torch.Tensor:
    """Biased MMD^2 estimate between row sets x and y with a sum of RBF kernels
    exp(-0.5 d^2 / a). Hand-written (as the reference): the few lines the loss needs
    do not justify a dependency, and it must match the reference's kernel exactly."""
    xx, yy, xy = x @ x.T, y @ y.T, x @ y.T
    rx, ry = xx.diag(), yy.diag()
    # squared distances; clamp the tiny negatives that rounding produces
    dxx = (rx[:, None] + rx[None, :] - 2 * xx).clamp_min(0)
    dyy = (ry[:, None] + ry[None, :] - 2 * yy).clamp_min(0)
    dxy = (rx[:, None] + ry[None, :] - 2 * xy).clamp_min(0)
    total = torch.zeros((), device=x.device, dtype=x.dtype)
    for a in bandwidths:
        total = total + (
            torch.exp(-0.5 * dxx / a).mean()
            + torch.exp(-0.5 * dyy / a).mean()
            - 2 * torch.exp(-0.5 * dxy / a).mean()
        )
    return total


def fedcp_transform(model: nn.Module, cfg: RunConfig) -> FedCPModel:
    """Wrap any backbone (``features`` + linear ``head``) into the FedCP model."""
    return FedCPModel(model, noisy_eval=FedCPParams.of(cfg).noisy_eval)


def fedcp_split(model: nn.Module) -> set[str]:
    """Personal: the personal head h_p only; phi, h_g and the CPN are shared."""
    return {n for n in model.state_dict() if n.startswith("head.")}


MODEL_SIDES = {"fedcp": ModelSide(fedcp_split, transform=fedcp_transform)}
