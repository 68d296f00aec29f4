"""FedProto's model: the backbone (``features`` and ``head``, all personal) beside two
shared buffers, ``proto_sums`` (classes x feature dim) and ``proto_counts`` (classes),
zero at the start: no global prototype before the first aggregation. Received, they
hold the server's means; after local training, the client's own sums and counts."""

from __future__ import annotations

import torch
from torch import nn

from methods import ModelSide
from methods.fedproto import SHARED
from models.backbones import Backbone
from pflower.config.schema import RunConfig


def global_prototypes(
    sums: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prototypes, present): each class's mean sum over its mean count, and whether it
    has one (mean count > 0); a class without one gets a zero row."""
    present = counts > 0
    safe = torch.where(present, counts, torch.ones_like(counts))
    return sums / safe[:, None] * present[:, None], present


class FedProtoModel(nn.Module):
    """``features`` embeds, ``head`` classifies (the backbone's own); the buffers carry
    the prototypes. ``forward`` is the head's logits (the training objective's)."""

    proto_sums: torch.Tensor
    proto_counts: torch.Tensor

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.features = backbone.features
        self.head = backbone.head
        classes, dim = backbone.head.out_features, backbone.head.in_features
        self.register_buffer("proto_sums", torch.zeros(classes, dim))
        self.register_buffer("proto_counts", torch.zeros(classes))

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def prototypes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The global prototypes the buffers hold, and which classes have one."""
        return global_prototypes(self.proto_sums, self.proto_counts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def nearest_prototype(z: torch.Tensor, protos: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Scores whose argmax is the nearest present prototype of each embedding: minus
    the mean squared distance (PFLlib's MSELoss), -inf for classes without one."""
    dist = ((z[:, None, :] - protos[None, :, :]) ** 2).mean(dim=2)
    return torch.where(present[None, :], -dist, torch.full_like(dist, float("-inf")))


def with_prototypes(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    return FedProtoModel(model)  # type: ignore[arg-type]


def whole_model(model: nn.Module) -> set[str]:
    """The split rule: everything but the two prototype buffers stays home."""
    return {n for n in model.state_dict() if n not in SHARED}


MODEL_SIDES = {"fedproto": ModelSide(whole_model, transform=with_prototypes)}
