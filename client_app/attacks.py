"""Simulated hostile clients, for measuring defences (simulation only: a node with a
``site`` never attacks, whatever the run config says).

``attack`` names what the first ``attack-clients`` partitions do to their fit reply:

- ``inflate-count`` reports ``attack-scale`` x 1e5 times its sample count;
- ``scale`` sends its update times ``attack-scale``; ``sign-flip`` sends it negated;
- ``label-flip`` trains on labels ``C - 1 - y`` (its test labels stay true);
- ``head-flip`` sends only its shared classifier head's update (``head.*``, FedCP's
  ``global_head.*``) negated times ``attack-scale``, the rest honest: a small,
  targeted change that a whole-update norm bound barely sees;
- an attack on one method's own machinery: its package's table (``attacks.py``,
  ``ATTACKS``), which the method's wire carries (``Wire.attacks``), listed on its card.

Updates are taken against what the client started from: the payload's tensors of
the same name (the wire's specs), so compacted or headed payloads line up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar

from client_app.base import PFLClient
from pflower.data import ClientData

INFLATE = 1e5  # inflate-count: count x attack-scale x this
HEADS = ("head.", "global_head.")  # the shared classifier heads head-flip targets

Starts = list[tuple[str, np.ndarray]]  # (name, start value) per upload entry


class MethodAttack(Protocol):
    """An attack on a method's own machinery, built on the honest client it wraps
    (``MethodAttackMaker``): ``factor`` scales every float update first (None: none),
    then ``falsify`` rewrites the reply."""

    factor: float | None

    def falsify(self, upload: NDArrays, starts: Starts) -> NDArrays: ...


# (honest client, attack-scale, the attacker's random generator) -> the attack
MethodAttackMaker = Callable[[Any, float, np.random.Generator], MethodAttack]


def flip_labels(data: ClientData, num_classes: int) -> ClientData:
    """The same client with its training labels mapped y -> C - 1 - y."""
    flipped = (num_classes - 1 - data.y_train).to(torch.int64)
    return dataclasses.replace(data, y_train=flipped)


def scaled_updates(
    upload: NDArrays, starts: Starts, factor: float | None, heads_only: bool = False
) -> NDArrays:
    """Each float entry's update from its start times ``factor`` (None: the upload as
    it is); ``heads_only``: the shared heads' entries only."""
    out = []
    for u, (name, p) in zip(upload, starts):
        hit = not heads_only or name.startswith(HEADS)
        if factor is None or not hit or u.dtype.kind != "f" or u.shape != p.shape:
            out.append(u)
        else:
            out.append((p + factor * (u.astype(np.float64) - p)).astype(u.dtype))
    return out


class Attacker(NumPyClient):
    """Delegates to an honest client and falsifies its fit reply."""

    def __init__(self, honest: PFLClient, attack: str, scale: float, seed: int = 0) -> None:
        self.honest = honest
        self.attack = attack
        self.scale = scale
        self.rng = np.random.default_rng(seed + 991)
        maker = honest.wire.attacks.get(attack)  # the method's own (methods/<name>/attacks.py)
        self.own: MethodAttack | None = None if maker is None else maker(honest, scale, self.rng)

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return self.honest.get_parameters(config)

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.honest.get_properties(config)

    def starts(self, parameters: NDArrays) -> Starts:
        """(name, start value) per upload entry: the payload tensor of the same name
        (an empty array where there is none)."""
        wire = self.honest.wire
        names = [s.name for s in wire.up_spec()]
        return list(zip(names, wire.upload_reference(parameters), strict=True))

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        upload, n, metrics = self.honest.fit(parameters, config)
        if self.attack == "inflate-count":
            return upload, int(n * self.scale * INFLATE), metrics
        starts = self.starts(parameters)
        if self.own is not None:
            return (
                self.own.falsify(scaled_updates(upload, starts, self.own.factor), starts),
                n,
                metrics,
            )
        factor = {"scale": self.scale, "sign-flip": -1.0, "head-flip": -self.scale}
        heads_only = self.attack == "head-flip"
        return scaled_updates(upload, starts, factor.get(self.attack), heads_only), n, metrics

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Any]]:
        return self.honest.evaluate(parameters, config)
