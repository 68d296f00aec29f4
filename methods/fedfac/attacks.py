"""The attack on FedFac's own machinery (client_app/attacks.py runs it):

``fa-steer`` replaces a full upload's factor-analysis rows: a random (1 - fa-quantile)
share of each Lambda layer's neurons get one common incoming-weight direction (times
``attack-scale`` its honest update's norm), to make the server's factor analysis mark
those neurons shared, and the others personal, for everyone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from flwr.common import NDArrays

from methods.fedfac import FedFacParams

if TYPE_CHECKING:
    from client_app.attacks import Starts
    from methods.fedfac.client import FedFacClient


class FaSteer:
    """fa-steer, on ``client``'s uploads."""

    factor = None  # the updates are rewritten, not scaled

    def __init__(self, client: FedFacClient, scale: float, rng: np.random.Generator) -> None:
        self.client, self.scale, self.rng = client, scale, rng

    def falsify(self, upload: NDArrays, starts: Starts) -> NDArrays:
        wire = self.client.wire
        if not wire.full_upload():
            return upload  # the split is fixed (static FedFac after round 1)
        out = list(upload)
        quantile = FedFacParams.of(self.client.cfg).fa_quantile
        for layer in wire.sizes:
            i = wire.position[f"{layer}.weight"]
            w = upload[i].astype(np.float64)
            start = starts[i][1].astype(np.float64)
            rows = w.shape[0]
            chosen = self.rng.permutation(rows)[: int(round((1 - quantile) * rows))]
            direction = self.rng.standard_normal(w[0].size)
            direction /= np.linalg.norm(direction)
            norm = self.scale * max(float(np.linalg.norm(w - start)), 1e-6)
            steered = start.reshape(rows, -1).copy()
            signs = self.rng.choice([-1.0, 1.0], size=len(chosen))
            steered[chosen] += (norm / np.sqrt(len(chosen))) * signs[:, None] * direction
            out[i] = steered.reshape(w.shape).astype(upload[i].dtype)
        return out


ATTACKS = {name: {"fa-steer": FaSteer} for name in ("fedfac-static", "fedfac-dynamic")}
