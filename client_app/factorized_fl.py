"""Factorized-FL's local schedule and wire hooks.

Local training: every parameter (u, v, mu, biases, BN, head) on
cross-entropy + ``ffl-l1`` * sum |mu|, for ``local-epochs``. The reference
trains with SGD lr 1e-3, momentum 0.9, weight decay 1e-6, 5 local epochs,
batch 256: pass ``lr=0.001 momentum=0.9 weight-decay=1e-6 local-epochs=5
batch-size=256`` to reproduce it (the global defaults are left alone).

Wire: ``receive`` decodes the (possibly sparse) shared tensors; ``upload`` sends
the encoded shared tensors, and for alpha also the v of the last layer before
the head, which the server uses for matching only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import NDArrays, Scalar
from torch import nn

from client_app.base import PFLClient
from models.factorized_fl import Wire, mu_l1
from models.roles import get_arrays, set_arrays


class FactorizedFLClient(PFLClient):
    """Both variants: the split rule and the wire decide what travels."""

    @property
    def wire(self) -> Wire:
        if not hasattr(self, "_wire"):
            self._wire = Wire.of(self.model, self.roles.shared, self.cfg)
        return self._wire

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy plus the L1 sparsity penalty on every mu (differentiable)."""
        return F.cross_entropy(model(x), y) + self.cfg.ffl_l1 * mu_l1(model)

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        if parameters:
            dense, _ = self.wire.decode(parameters)
            set_arrays(self.model, self.roles.shared, dense)

    def upload(self, config: dict[str, Scalar]) -> NDArrays:
        out = self.wire.encode(get_arrays(self.model, self.roles.shared))
        if self.wire.match_extra:
            (v,) = get_arrays(self.model, [self.wire.match])
            out.append(np.ascontiguousarray(v.reshape(-1)))
        return out
