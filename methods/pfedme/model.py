"""pFedMe's model: the backbone twice from the same initialisation, the client's copy
of the global model w (``global_model``, shared) and the personal model theta
(``personal_model``, personal: parameters and buffers), so theta is stored and
restored with the rest of the personal state, across rounds and restarts."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from methods import ModelSide
from methods.pfedme import PFedMeParams
from pflower.config.schema import RunConfig

PERSONAL = "personal_model."


class PFedMeModel(nn.Module):
    """``global_model`` (w) travels; ``personal_model`` (theta) stays home and predicts.
    ``personal=False`` (``pfedme.evaluate='global'``) predicts with w's parameters and
    theta's buffers: w itself never runs forward, so its buffers hold no statistics."""

    def __init__(self, backbone: nn.Module, personal: bool = True) -> None:
        super().__init__()
        self.global_model = backbone
        self.personal_model = copy.deepcopy(backbone)
        self.personal = personal  # set once, from the run config: the same on every client

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.personal:
            return self.personal_model(x)
        return functional_call(
            self.personal_model, dict(self.global_model.named_parameters()), (x,)
        )


def with_personal_model(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    return PFedMeModel(model, personal=PFedMeParams.of(cfg).evaluate == "personal")


def personal_model(model: nn.Module) -> set[str]:
    """The split rule: every entry of theta stays home."""
    return {n for n in model.state_dict() if n.startswith(PERSONAL)}


MODEL_SIDES = {"pfedme": ModelSide(personal_model, transform=with_personal_model)}
