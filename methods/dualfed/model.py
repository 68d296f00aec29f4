"""DualFed's model: shared encoder, personal projector, dual classifiers.

z = features(x) (pre-projection, shared encoder); u = projector(z) (post-projection,
personal); prediction = personal_head(u) + head(z), where ``head`` is the global
classifier h_s and ``personal_head`` the personal classifier h_p.
"""

from __future__ import annotations

import torch
from torch import nn

from methods import ModelSide
from methods.dualfed import DualFedParams
from models.backbones import Backbone
from models.roles import batchnorm_entries
from pflower.config.schema import RunConfig

PERSONAL_PREFIXES = ("projector.", "personal_head.")


class DualFedModel(nn.Module):
    """Encoder f -> z; projector g: Linear-ReLU-BN-Linear-BN -> u; h_p(u) + h_s(z)."""

    def __init__(self, backbone: Backbone, projector_hidden: int = 256) -> None:
        super().__init__()
        dim, classes = backbone.feature_dim, backbone.head.out_features
        self.features = backbone.features
        self.projector = nn.Sequential(
            nn.Linear(dim, projector_hidden),
            nn.ReLU(inplace=True),
            nn.BatchNorm1d(projector_hidden),
            nn.Linear(projector_hidden, dim),
            nn.BatchNorm1d(dim),
        )
        self.personal_head = nn.Linear(dim, classes)
        self.head = backbone.head  # the global classifier h_s, on z

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def personal_logits(self, z: torch.Tensor) -> torch.Tensor:
        """h_p(g(z))."""
        return self.personal_head(self.projector(z))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.features(x)
        return self.personal_logits(z) + self.head(z)


def to_dualfed(model: nn.Module, cfg: RunConfig) -> DualFedModel:
    """The method's transform: wrap any backbone (its ``features`` and ``head``)."""
    if not isinstance(model, Backbone):
        raise TypeError(f"DualFed needs a Backbone with features/head, got {type(model).__name__}")
    return DualFedModel(model, DualFedParams.of(cfg).projector_hidden)


def dualfed_personal(model: nn.Module) -> set[str]:
    """Projector, personal classifier and every BN running statistic stay local;
    encoder parameters, the encoder's BN affine and the global classifier are shared."""
    names = {n for n in model.state_dict() if n.startswith(PERSONAL_PREFIXES)}
    return names | batchnorm_entries(model, running_stats_only=True)


MODEL_SIDES = {"dualfed": ModelSide(dualfed_personal, transform=to_dualfed)}
