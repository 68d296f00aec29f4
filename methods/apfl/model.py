"""APFL's model: the backbone twice, a global copy w (shared) and a local copy v
(personal), both from the same initialisation (as PFLlib's deep copy), and the
client's mixing weight alpha, a one-element buffer (personal), so that v and alpha
are stored and restored with the rest of the personal state."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from methods import ModelSide
from methods.apfl import ApflParams
from pflower.config.schema import RunConfig

LOCAL, ALPHA = "local_model.", "alpha"


class ApflModel(nn.Module):
    """``global_model`` (w) travels and trains as FedAvg's model; ``local_model`` (v)
    and ``alpha`` stay home. The prediction is the model whose parameters are
    alpha v + (1 - alpha) w (the paper's h_alpha), with v's buffers (its BatchNorm
    statistics are the mix's own); ``mix=False`` (PFLlib's reading) predicts with v
    alone, which holds the mix as of the end of the last round."""

    alpha: torch.Tensor

    def __init__(self, backbone: nn.Module, alpha: float, mix: bool = True) -> None:
        super().__init__()
        self.global_model = backbone
        self.local_model = copy.deepcopy(backbone)
        self.register_buffer(ALPHA, torch.tensor([alpha], dtype=torch.float32))
        self.mix = mix  # set once, from the run config: the same on every client

    def mixed_parameters(
        self, alpha: torch.Tensor | None = None, detach_global: bool = False
    ) -> dict[str, torch.Tensor]:
        """alpha v + (1 - alpha) w, by parameter name; ``detach_global``: no gradient
        reaches w through the mix (w steps on its own loss only)."""
        # a scalar, so that a 0-d parameter keeps its shape in the mix
        a = (self.alpha if alpha is None else alpha).reshape(())
        own = self.global_model.named_parameters()
        out = {}
        for (name, v), (_, w) in zip(self.local_model.named_parameters(), own, strict=True):
            out[name] = a * v + (1 - a) * (w.detach() if detach_global else w)
        return out

    def mixed(
        self, x: torch.Tensor, alpha: torch.Tensor | None = None, detach_global: bool = False
    ) -> torch.Tensor:
        """The mixed model's output on ``x`` (the local copy's layers and buffers, the
        mixed parameters)."""
        params = self.mixed_parameters(alpha, detach_global)
        return functional_call(self.local_model, params, (x,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixed(x) if self.mix else self.local_model(x)


def with_local_copy(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    params = ApflParams.of(cfg)
    return ApflModel(model, params.alpha, mix=params.variant == "paper")


def local_copy_and_alpha(model: nn.Module) -> set[str]:
    """The split rule: every entry of the local copy, and alpha, stay home."""
    return {n for n in model.state_dict() if n.startswith(LOCAL) or n == ALPHA}


MODEL_SIDES = {"apfl": ModelSide(local_copy_and_alpha, transform=with_local_copy)}
