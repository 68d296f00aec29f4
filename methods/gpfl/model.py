"""GPFL's model: the backbone's extractor and head around a Conditional Valve (CoV)
and a Global Category Embedding layer (GCE).

State dict: ``features.*`` (the extractor, shared), ``cov.*`` (the CoV, shared),
``gce.weight`` (the GCE's embeddings C, one row per class, shared), ``head.*`` (the
personal head) and the two conditional inputs ``global_input`` (g) and
``personal_input`` (p_i), buffers that stay home. The frozen copy C^ of the received
GCE lives on the client, not in this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from methods import ModelSide
from models.backbones import Backbone
from pflower.config.schema import RunConfig

GLOBAL_INPUT, PERSONAL_INPUT = "global_input", "personal_input"


def generator(dim: int) -> nn.Sequential:
    """One of the CoV's two generators: Linear, ReLU, LayerNorm (as the authors')."""
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.LayerNorm(dim))


class ConditionalValve(nn.Module):
    """(gamma, beta) from a conditional input c; the feature f becomes
    relu((gamma + 1) * f + beta) (the paper's Eq. 1): with gamma = beta = 0 the valve
    passes relu(f)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = generator(dim)
        self.beta = generator(dim)

    def forward(self, f: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.relu(f * (self.gamma(c) + 1) + self.beta(c))


class GPFLModel(nn.Module):
    """f = features(x); f_P = cov(f, p_i), f_G = cov(f, g); the prediction head(f_P)."""

    global_input: torch.Tensor
    personal_input: torch.Tensor

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        dim, classes = backbone.head.in_features, backbone.head.out_features
        self.features = backbone.features
        self.head = backbone.head
        self.cov = ConditionalValve(dim)
        self.gce = nn.Embedding(classes, dim)
        # zeros until first set (PFLlib's start, clientgpfl.py:31-32)
        self.register_buffer(GLOBAL_INPUT, torch.zeros(dim))
        self.register_buffer(PERSONAL_INPUT, torch.zeros(dim))

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    @torch.no_grad()
    def set_conditional_inputs(self, embeddings: torch.Tensor, proportions: torch.Tensor) -> None:
        """g = the mean of the class embeddings; p_i = their mean weighted by the
        client's class proportions. Constants for the CoV: no gradient reaches C."""
        self.global_input.copy_(embeddings.mean(dim=0))
        self.personal_input.copy_(proportions.to(embeddings.dtype) @ embeddings)

    def both(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the personal logits head(f_P), the global feature f_G)."""
        f = self.features(x)
        return self.head(self.cov(f, self.personal_input)), self.cov(f, self.global_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.cov(self.features(x), self.personal_input))


def with_valve_and_embeddings(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform: any backbone (``features`` + linear ``head``)."""
    return GPFLModel(model)  # type: ignore[arg-type]


def head_and_inputs(model: nn.Module) -> set[str]:
    """The split rule: the head and the two conditional inputs stay home."""
    own = {GLOBAL_INPUT, PERSONAL_INPUT}
    return {n for n in model.state_dict() if n.startswith("head.") or n in own}


MODEL_SIDES = {"gpfl": ModelSide(head_and_inputs, transform=with_valve_and_embeddings)}
