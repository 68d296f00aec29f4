"""FedALA's model: the backbone (``net``, shared: it receives the global model and
trains), beside the client's own state for the top ``fedala.layers`` parameter
tensors: its previous local model's values (``previous``) and the element-wise
mixing weights W (``weights``, ones at the start, as the paper's and PFLlib's), and
its phase (``phase``: 0 before its first fit, 1 with a local model whose first W
learning is still to come, 2 after it). All three are buffers, so they are stored and
restored with the rest of the personal state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from methods import ModelSide
from methods.fedala import FedAlaParams
from pflower.config.schema import ConfigError, RunConfig

NO_LOCAL, START, SETTLED = 0, 1, 2  # the phases


def mix(previous: torch.Tensor, received: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """ALA's local aggregation: theta_prev + (theta_global - theta_prev) * W."""
    return previous + (received - previous) * weight


class Tops(nn.Module):
    """One buffer per top parameter of ``net`` (buffer names cannot hold '.'):
    a copy of its value, or ``fill`` everywhere."""

    def __init__(self, net: nn.Module, names: tuple[str, ...], fill: float | None) -> None:
        super().__init__()
        params = dict(net.named_parameters())
        for name in names:
            p = params[name].detach()
            value = p.clone() if fill is None else torch.full_like(p, fill)
            self.register_buffer(name.replace(".", "__"), value)

    def of(self, names: tuple[str, ...]) -> list[torch.Tensor]:
        """The buffers in the order of ``names``."""
        return [getattr(self, name.replace(".", "__")) for name in names]


class FedAlaModel(nn.Module):
    """``net`` predicts and travels; ``previous``, ``weights`` and ``phase`` stay home.
    ``top`` names the mixed parameters of ``net`` (set once, from the run config)."""

    phase: torch.Tensor

    def __init__(self, backbone: nn.Module, layers: int) -> None:
        super().__init__()
        self.net = backbone
        names = tuple(name for name, _ in backbone.named_parameters())
        self.top = names[-layers:] if layers else names
        self.previous = Tops(backbone, self.top, fill=None)
        self.weights = Tops(backbone, self.top, fill=1.0)
        self.register_buffer("phase", torch.tensor([NO_LOCAL], dtype=torch.long))

    def top_parameters(self) -> list[nn.Parameter]:
        params = dict(self.net.named_parameters())
        return [params[name] for name in self.top]

    def mixed_top(self) -> list[torch.Tensor]:
        """The top parameters mixed from the previous local model, the values now in
        ``net`` (the received ones) and W."""
        pairs = zip(self.previous.of(self.top), self.top_parameters(), self.weights.of(self.top))
        return [mix(prev, got.detach(), w) for prev, got, w in pairs]

    def set_top(self, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.top_parameters(), values, strict=True):
                p.copy_(value)

    def keep_local(self) -> None:
        """After training: ``net``'s top parameters become the previous local model."""
        with torch.no_grad():
            for kept, p in zip(self.previous.of(self.top), self.top_parameters(), strict=True):
                kept.copy_(p)
            self.phase.clamp_(min=START)

    @contextmanager
    def personalised(self) -> Iterator[None]:
        """``net`` with its top parameters mixed by the kept W (a client with a local
        model), put back as received on leaving."""
        if int(self.phase) == NO_LOCAL:
            yield
            return
        received = [p.detach().clone() for p in self.top_parameters()]
        self.set_top(self.mixed_top())
        try:
            yield
        finally:
            self.set_top(received)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def with_local_state(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform."""
    return FedAlaModel(model, FedAlaParams.of(cfg).layers)


def local_state(model: nn.Module) -> set[str]:
    """The split rule: the previous local model's top, W and the phase stay home."""
    own = ("previous.", "weights.")
    return {n for n in model.state_dict() if n.startswith(own) or n == "phase"}


def check_layers(model: nn.Module, cfg: RunConfig) -> None:
    """ConfigError naming 'fedala.layers' where the backbone has fewer tensors."""
    assert isinstance(model, FedAlaModel)
    layers, total = FedAlaParams.of(cfg).layers, len(list(model.net.parameters()))
    if layers > total:
        raise ConfigError(
            f"config key 'fedala.layers': {layers} top parameter tensors, but model "
            f"'{cfg.model}' has {total} (0 mixes them all)"
        )


MODEL_SIDES = {"fedala": ModelSide(local_state, transform=with_local_state, check=check_layers)}
