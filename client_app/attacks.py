"""Simulated hostile clients, for measuring defences (simulation only: a node with a
``site`` never attacks, whatever the run config says).

``attack`` names what the first ``attack-clients`` partitions do to their fit reply:

- ``inflate-count`` reports ``attack-scale`` x 1e5 times its sample count;
- ``scale`` sends its update times ``attack-scale``; ``sign-flip`` sends it negated;
- ``label-flip`` trains on labels ``C - 1 - y`` (its test labels stay true);
- ``head-flip`` sends only its shared classifier head's update (``head.*``, FedCP's
  ``global_head.*``) negated times ``attack-scale``, the rest honest: a small,
  targeted change that a whole-update norm bound barely sees;
- ``fa-steer`` (FedFac) replaces its factor-analysis rows: a random (1 - fa-quantile)
  share of each Lambda layer's neurons get one common incoming-weight direction
  (times ``attack-scale`` its honest update's norm), to make the server's factor
  analysis mark those neurons shared, and the others personal, for everyone;
- ``match-magnet`` (Factorized-FL alpha) sends the matching vector every client
  started from (its own initial v, the centre of everyone's v) so that it is every
  client's nearest neighbour, and its shared update negated.

Updates are taken against what the client started from: the payload's tensors of
the same name (the wire's specs), so compacted or headed payloads line up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar

from pflower.data import ClientData

INFLATE = 1e5  # inflate-count: count x attack-scale x this
HEADS = ("head.", "global_head.")  # the shared classifier heads head-flip targets


def flip_labels(data: ClientData, num_classes: int) -> ClientData:
    """The same client with its training labels mapped y -> C - 1 - y."""
    flipped = (num_classes - 1 - data.y_train).to(torch.int64)
    return dataclasses.replace(data, y_train=flipped)


class Attacker(NumPyClient):
    """Delegates to an honest client and falsifies its fit reply."""

    def __init__(self, honest: NumPyClient, attack: str, scale: float, seed: int = 0) -> None:
        self.honest = honest
        self.attack = attack
        self.scale = scale
        self.rng = np.random.default_rng(seed + 991)
        self.initial_v: np.ndarray | None = None  # match-magnet: the matching v it began with
        if attack == "match-magnet":
            wire = honest.wire  # type: ignore[attr-defined]
            v = honest.model.state_dict()[wire.match]  # type: ignore[attr-defined]
            self.initial_v = v.detach().cpu().numpy().reshape(-1).copy()

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        return self.honest.get_parameters(config)

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        return self.honest.get_properties(config)

    def starts(self, parameters: NDArrays) -> list[tuple[str, np.ndarray]]:
        """(name, start value) per upload entry: the payload tensor of the same name
        (an empty array where there is none)."""
        wire = self.honest.wire  # type: ignore[attr-defined]
        names = [s.name for s in wire.up_spec()]
        return list(zip(names, wire.upload_reference(parameters), strict=True))

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        upload, n, metrics = self.honest.fit(parameters, config)
        if self.attack == "inflate-count":
            return upload, int(n * self.scale * INFLATE), metrics
        starts = self.starts(parameters)
        if self.attack == "fa-steer":
            return self.fa_steer(upload, starts), n, metrics
        factor = {"scale": self.scale, "sign-flip": -1.0}
        factor |= {"head-flip": -self.scale, "match-magnet": -self.scale}
        f = factor.get(self.attack)
        out = []
        for u, (name, p) in zip(upload, starts):
            hit = self.attack != "head-flip" or name.startswith(HEADS)
            if f is None or not hit or u.dtype.kind != "f" or u.shape != p.shape:
                out.append(u)
            else:
                out.append((p + f * (u.astype(np.float64) - p)).astype(u.dtype))
        if self.attack == "match-magnet" and self.initial_v is not None:
            out[-1] = self.initial_v.astype(out[-1].dtype)  # alpha appends its matching v
        return out, n, metrics

    def fa_steer(self, upload: NDArrays, starts: list[tuple[str, Any]]) -> NDArrays:
        wire = self.honest.wire  # type: ignore[attr-defined]
        if not wire.full_upload():
            return upload  # the split is fixed (static FedFac after round 1)
        out = list(upload)
        quantile = self.honest.cfg.params.fa_quantile  # type: ignore[attr-defined]
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

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Any]]:
        return self.honest.evaluate(parameters, config)
