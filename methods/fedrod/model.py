"""FedRoD's model: the backbone's body and head (the generic head, shared) and a
personal head beside the generic one, started at zero so that the personalised
prediction starts as the generic one."""

from __future__ import annotations

import torch
from torch import nn

from methods import ModelSide
from models.backbones import Backbone
from pflower.config.schema import RunConfig


class FedRoDModel(nn.Module):
    """z = features(x); generic logits head(z); personalised: head(z) + personal_head(z)."""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.features = backbone.features
        self.head = backbone.head  # the generic head, shared
        self.personal_head = nn.Linear(backbone.feature_dim, backbone.head.out_features)
        nn.init.zeros_(self.personal_head.weight)
        nn.init.zeros_(self.personal_head.bias)

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def both(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(generic logits, the personal head's logits on detached features)."""
        z = self.features(x)
        return self.head(z), self.personal_head(z.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.features(x)
        return self.head(z) + self.personal_head(z)


def with_personal_head(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    return FedRoDModel(model)


def personal_head(model: nn.Module) -> set[str]:
    """The split rule: the personal head stays home."""
    return {n for n in model.state_dict() if n.startswith("personal_head.")}


MODEL_SIDES = {"fedrod": ModelSide(personal_head, transform=with_personal_head)}
