"""Ditto's model: the backbone twice, a global copy (shared) and a personal copy
(personal), both from the same initialisation (the paper's v_k^0 = w^0)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from methods import ModelSide
from pflower.config.schema import RunConfig


class DittoModel(nn.Module):
    """``global_model`` travels and trains as FedAvg's model; ``personal`` is the
    client's own and is what it is scored with."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.global_model = backbone
        self.personal = copy.deepcopy(backbone)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.personal(x)


def with_personal_copy(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    return DittoModel(model)


def personal_copy(model: nn.Module) -> set[str]:
    """The split rule: every entry of the personal copy stays home."""
    return {n for n in model.state_dict() if n.startswith("personal.")}


MODEL_SIDES = {"ditto": ModelSide(personal_copy, transform=with_personal_copy)}
