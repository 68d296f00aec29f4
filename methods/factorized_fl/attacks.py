"""The attack on Factorized-FL's own machinery (client_app/attacks.py runs it):

``match-magnet`` (alpha) sends the matching vector every client started from (its own
initial v, the centre of everyone's v) so that it is every client's nearest
neighbour, and its shared update negated times ``attack-scale``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from flwr.common import NDArrays

if TYPE_CHECKING:
    from client_app.attacks import Starts
    from methods.factorized_fl.client import FactorizedFLClient


class MatchMagnet:
    """match-magnet, on ``client``'s uploads."""

    def __init__(self, client: FactorizedFLClient, scale: float, rng: np.random.Generator) -> None:
        self.factor = -scale  # the shared update, flipped and scaled
        v = client.model.state_dict()[client.wire.match]  # the matching v it began with
        self.initial_v = v.detach().cpu().numpy().reshape(-1).copy()

    def falsify(self, upload: NDArrays, starts: Starts) -> NDArrays:
        out = list(upload)
        out[-1] = self.initial_v.astype(out[-1].dtype)  # alpha appends its matching v
        return out


ATTACKS = {"factorized-fl-alpha": {"match-magnet": MatchMagnet}}
