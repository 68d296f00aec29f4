"""Factorized-FL's local schedule: every parameter (u, v, mu, biases, BN, head) on
cross-entropy + ``factorized-fl.l1`` * sum |mu|, for ``local-epochs`` (the
reference's SGD schedule is the ``auto`` one). What travels is the wire's
(``FactorizedWire``: sparse mu, and alpha's matching vector on the upload).

``factorized-fl.optimizer-state = "kept"`` (the authors' code builds one SGD per
client for the whole run: client.py:30, 48): the optimizer's state (SGD's momentum
buffers) is part of the client's personal state, so it survives between rounds
and a restart like its personal tensors, and it never leaves the client (it is
in no upload: the wire sends model tensors only).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient, train_every_parameter
from client_app.train import make_optimizer
from methods.factorized_fl import FactorizedFLParams
from methods.factorized_fl.model import FactorizedWire, mu_l1

log = logging.getLogger("flwr.pflower")

OPTIMIZER = "factorized-fl.optimizer/"  # personal-state entries: <param>#<state key>


def optimizer_arrays(opt: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, np.ndarray]:
    """The optimizer's per-parameter state as named arrays (``<param>#<key>``)."""
    out = {}
    for p, state in opt.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{names[id(p)]}#{key}"] = value.detach().cpu().numpy().copy()
    return out


def load_optimizer_arrays(
    opt: torch.optim.Optimizer, params: dict[str, nn.Parameter], arrays: dict[str, np.ndarray]
) -> list[str]:
    """Put ``arrays`` (from ``optimizer_arrays``) into ``opt``'s state; returns the
    entries that do not fit this model (then nothing is loaded: a fresh start)."""
    loaded: dict[nn.Parameter, dict[str, torch.Tensor]] = {}
    misfit = []
    for entry, array in arrays.items():
        name, _, key = entry.rpartition("#")
        p = params.get(name)
        shape_ok = p is not None and (array.ndim == 0 or tuple(array.shape) == tuple(p.shape))
        if not shape_ok:
            misfit.append(entry)
            continue
        loaded.setdefault(p, {})[key] = torch.as_tensor(array).to(p.device)
    if misfit:
        return misfit
    for p, state in loaded.items():
        opt.state[p] = state
    return []


class FactorizedFLClient(PFLClient):
    """Both variants: the split rule and the wire (FactorizedWire) decide what travels."""

    wire: FactorizedWire
    kept_optimizer: dict[str, np.ndarray] | None = None  # optimizer-state 'kept'

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy plus the L1 sparsity penalty on every mu (differentiable)."""
        return F.cross_entropy(model(x), y) + FactorizedFLParams.of(self.cfg).l1 * mu_l1(model)

    @property
    def keeps_optimizer(self) -> bool:
        return FactorizedFLParams.of(self.cfg).optimizer_state == "kept"

    def personal_state(self) -> dict[str, np.ndarray]:
        state = super().personal_state()
        if self.keeps_optimizer and self.kept_optimizer:
            state.update({OPTIMIZER + k: v for k, v in self.kept_optimizer.items()})
        return state

    def load_personal_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_personal_state(state)
        kept = {k[len(OPTIMIZER) :]: v for k, v in state.items() if k.startswith(OPTIMIZER)}
        self.kept_optimizer = kept or None

    def kept_optimizer_for(self) -> torch.optim.Optimizer:
        """SGD of the run's settings with this client's kept state, if it fits."""
        named = dict(self.model.named_parameters())
        opt = make_optimizer(list(self.model.parameters()), self.cfg)
        if self.kept_optimizer:
            misfit = load_optimizer_arrays(opt, named, self.kept_optimizer)
            if misfit:
                log.warning(
                    "client %s: kept optimizer state does not fit this model (%s): a fresh one",
                    self.client_key,
                    ", ".join(misfit[:3]),
                )
        return opt

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        if not self.keeps_optimizer:
            return super().local_train(config, generator)
        opt = self.kept_optimizer_for()
        loss = train_every_parameter(self, generator, opt)
        names = {id(p): n for n, p in self.model.named_parameters()}
        self.kept_optimizer = optimizer_arrays(opt, names)
        return {"train-loss": loss}


CLIENTS = {"factorized-fl-alpha": FactorizedFLClient, "factorized-fl-beta": FactorizedFLClient}
