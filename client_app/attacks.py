"""Simulated hostile clients, for measuring defences (simulation only: a node with a
``site`` never attacks, whatever the run config says).

``attack`` names what the first ``attack-clients`` partitions do to their fit reply:
``inflate-count`` reports ``attack-scale`` x 1e5 times its sample count,
``scale`` sends its update times ``attack-scale``, ``sign-flip`` sends its update
negated, ``label-flip`` trains on labels ``C - 1 - y`` (its test labels stay true).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar

from pfl_data import ClientData

INFLATE = 1e5  # inflate-count: count x attack-scale x this


def flip_labels(data: ClientData, num_classes: int) -> ClientData:
    """The same client with its training labels mapped y -> C - 1 - y."""
    flipped = (num_classes - 1 - data.y_train).to(torch.int64)
    return dataclasses.replace(data, y_train=flipped)


class Attacker(NumPyClient):
    """Delegates to an honest client and falsifies its fit reply."""

    def __init__(self, honest: NumPyClient, attack: str, scale: float) -> None:
        self.honest = honest
        self.attack = attack
        self.scale = scale

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return self.honest.get_parameters(config)

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.honest.get_properties(config)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        upload, n, metrics = self.honest.fit(parameters, config)
        if self.attack == "inflate-count":
            return upload, int(n * self.scale * INFLATE), metrics
        factor = {"scale": self.scale, "sign-flip": -1.0}.get(self.attack)
        if factor is not None:
            upload = [
                (p + factor * (u.astype(np.float64) - p)).astype(u.dtype)
                if u.dtype.kind == "f" and u.shape == p.shape
                else u
                for u, p in zip(upload, parameters)
            ] + upload[len(parameters) :]
        return upload, n, metrics

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Any]]:
        return self.honest.evaluate(parameters, config)
