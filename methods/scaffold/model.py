"""SCAFFOLD's model: the backbone (``net``) beside two control variates of its
parameters' shapes, the server's c (``control``, shared) and the client's c_i
(``own_control``, personal), both starting at zero as in the paper."""

from __future__ import annotations

import torch
from torch import nn

from methods import ModelSide
from pflower.config.schema import RunConfig


class Controls(nn.Module):
    """A zero buffer per parameter of ``net`` (buffer names cannot hold '.')."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        for name, p in net.named_parameters():
            self.register_buffer(name.replace(".", "__"), torch.zeros_like(p.detach()))

    def of(self, net: nn.Module) -> list[torch.Tensor]:
        """The buffers in the order of ``net.parameters()``."""
        return [getattr(self, name.replace(".", "__")) for name, _ in net.named_parameters()]


class ScaffoldModel(nn.Module):
    """``net`` predicts; ``control`` is c as the server last sent it, ``own_control`` c_i."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.net = backbone
        self.control = Controls(backbone)
        self.own_control = Controls(backbone)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def with_controls(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    return ScaffoldModel(model)


def own_control(model: nn.Module) -> set[str]:
    """The split rule: the client's control variate stays home."""
    return {n for n in model.state_dict() if n.startswith("own_control.")}


MODEL_SIDES = {"scaffold": ModelSide(own_control, transform=with_controls)}
