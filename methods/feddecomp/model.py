"""FedDecomp's model transform and split rule.

Every ``nn.Linear`` and ``nn.Conv2d`` weight W (classifier included) becomes
``sigma + tau``: sigma is the original weight (full rank, shared) and
tau = (B @ A) / rank is low rank and personal. ``torch.nn.utils.parametrize``
does the bookkeeping, so the layers stay the stock torch modules and the
state_dict names are

    <layer>.parametrizations.weight.original   sigma
    <layer>.parametrizations.weight.0.lora_A   A
    <layer>.parametrizations.weight.0.lora_B   B

Shapes (paper eq. 3-4; docs/feddecomp.md):
  Linear I -> O:        A (r, I),        B (O, r)
  Conv2d O x I x kh x kw: A (r*kh, I*kw), B (O*kh, r*kh), tau* = B @ A reshaped
                        to (O, I, kh, kw) (a plain view, as the reference).
B starts at zeros and A at kaiming-uniform(a=sqrt(5)), so tau starts at 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils import parametrize

from methods import ModelSide
from methods.feddecomp import FedDecompParams
from pflower.config.schema import RunConfig

TAU_PARAMS = ("lora_A", "lora_B")


class LowRankTau(nn.Module):
    """The parametrization ``sigma -> sigma + (B @ A).view(sigma.shape) / rank``."""

    def __init__(self, weight: torch.Tensor, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.shape = tuple(weight.shape)
        out_dim, in_dim = self.shape[0], self.shape[1]
        kh, kw = (self.shape[2], self.shape[3]) if weight.dim() == 4 else (1, 1)
        self.lora_A = nn.Parameter(weight.new_empty(rank * kh, in_dim * kw))
        self.lora_B = nn.Parameter(weight.new_zeros(out_dim * kh, rank * kh))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.frozen: torch.Tensor | None = None  # tau held constant (see frozen_tau)

    def tau(self) -> torch.Tensor:
        return (self.lora_B @ self.lora_A).view(self.shape) / self.rank

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma + (self.tau() if self.frozen is None else self.frozen)


def rank_of(module: nn.Module, cfg: RunConfig) -> int:
    """The paper's rank rule: ``max(1, round(R * min(I, O)))`` with R = R_c for
    conv and R_l for linear layers. ``rank-basis = out`` uses O instead of
    min(I, O) (the reference code); ``linear-rank-abs > 0`` fixes the linear rank."""
    out_dim, in_dim = module.weight.shape[0], module.weight.shape[1]
    is_linear = isinstance(module, nn.Linear)
    if is_linear and FedDecompParams.of(cfg).linear_rank_abs > 0:
        return FedDecompParams.of(cfg).linear_rank_abs
    ratio = (
        FedDecompParams.of(cfg).linear_rank_ratio
        if is_linear
        else FedDecompParams.of(cfg).conv_rank_ratio
    )
    basis = out_dim if FedDecompParams.of(cfg).rank_basis == "out" else min(in_dim, out_dim)
    return max(1, round(ratio * basis))


def decompose(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The FedDecomp transform (in place): add a personal low-rank tau to every
    linear and 2-d conv weight. ``decomp-reverse`` is recorded on the model so
    the split rule can be derived from the model alone."""
    targets = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for module in targets:
        weight = module.weight
        parametrize.register_parametrization(
            module, "weight", LowRankTau(weight, rank_of(module, cfg))
        )
    model.feddecomp_reverse = FedDecompParams.of(cfg).reverse
    return model


def tau_modules(model: nn.Module) -> list[tuple[str, LowRankTau]]:
    """(module name, parametrization) of every decomposed weight."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LowRankTau)]


def tau_entries(model: nn.Module) -> set[str]:
    """State_dict names of every A and B."""
    return {f"{name}.{p}" for name, _ in tau_modules(model) for p in TAU_PARAMS}


def tau_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every A and B (the tau phase trains these)."""
    return [getattr(m, p) for _, m in tau_modules(model) for p in TAU_PARAMS]


def non_tau_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every other parameter: sigma, biases, BatchNorm affine (the sigma phase)."""
    taus = {id(p) for p in tau_parameters(model)}
    return [p for p in model.parameters() if id(p) not in taus]


@contextmanager
def frozen_tau(model: nn.Module) -> Iterator[None]:
    """Within the block tau is computed once and held constant (sigma phase,
    evaluation): a forward pass then costs one addition per layer instead of
    a B @ A product. A and B must not change inside the block."""
    mods = [m for _, m in tau_modules(model)]
    with torch.no_grad():
        for m in mods:
            m.frozen = m.tau()
    try:
        yield
    finally:
        for m in mods:
            m.frozen = None


def feddecomp_split(model: nn.Module) -> set[str]:
    """Personal: every A and B. Shared: sigma, biases, BatchNorm affine and
    running stats. With ``decomp-reverse`` (FedDecomp_Reverse, paper Table 5)
    the roles swap: A and B are shared, everything else stays on the client."""
    taus = tau_entries(model)
    if getattr(model, "feddecomp_reverse", False):
        return set(model.state_dict()) - taus
    return taus


MODEL_SIDES = {"feddecomp": ModelSide(feddecomp_split, transform=decompose)}
