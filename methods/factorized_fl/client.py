"""Factorized-FL's local schedule: every parameter (u, v, mu, biases, BN, head) on
cross-entropy + ``factorized-fl.l1`` * sum |mu|, for ``local-epochs`` (the
reference's SGD schedule is the ``auto`` one). What travels is the wire's
(``FactorizedWire``: sparse mu, and alpha's matching vector on the upload).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from client_app.base import PFLClient
from methods.factorized_fl import FactorizedFLParams
from methods.factorized_fl.model import mu_l1


class FactorizedFLClient(PFLClient):
    """Both variants: the split rule and the wire (FactorizedWire) decide what travels."""

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy plus the L1 sparsity penalty on every mu (differentiable)."""
        return F.cross_entropy(model(x), y) + FactorizedFLParams.of(self.cfg).l1 * mu_l1(model)


CLIENTS = {"factorized-fl-alpha": FactorizedFLClient, "factorized-fl-beta": FactorizedFLClient}
