"""Differential privacy for the shared tensors (the personal ones never leave).

The Gaussian mechanism on the shared *update* (upload minus what the server
sent), DP-FedAvg style (McMahan et al. 2018, Flower's fixed-clipping DP): each
update is clipped to L2 norm ``dp-clipping-norm`` (on the client with
``dp-mode=client``, on the server with ``dp-mode=server``), the server averages
the clipped updates with equal weights and adds N(0, sigma^2) to every float
value of the mean, sigma = noise multiplier x clipping norm / participants
(Flower's ``compute_stdv``). Integer tensors (BatchNorm's batch counters) are
neither clipped nor noised. Opacus's RDP accountant turns the noise multiplier,
the client sampling rate and the rounds into epsilon at ``dp-delta``.

Flower's own ``fixedclipping_mod`` and DP strategy wrappers are not used as they
are: the mod scales integer tensors in place (a BatchNorm counter breaks it), and
the wrappers add noise to the parameters Flower passes between rounds, while this
project's strategies keep the global state themselves (per-client payloads,
checkpoints). The arithmetic is Flower's (``flwr.supercore.differential_privacy``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.supercore.differential_privacy import clip_inputs_inplace, compute_stdv

NDArrays = list[np.ndarray]


def _floats(arrays: NDArrays) -> list[int]:
    return [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]


def clip_update(upload: NDArrays, received: NDArrays, clipping_norm: float) -> float:
    """Clip ``upload - received`` (float tensors) to ``clipping_norm`` in place:
    ``upload`` becomes received + clipped update. Returns the update's norm."""
    idx = _floats(upload)
    update = [upload[i].astype(np.float64) - received[i] for i in idx]
    norm = float(np.sqrt(sum(float(np.sum(u * u)) for u in update)))
    if norm == 0.0:
        return norm  # nothing to clip (Flower's clip divides by the norm)
    clip_inputs_inplace(update, clipping_norm)
    for i, u in zip(idx, update):
        upload[i] = (received[i] + u).astype(upload[i].dtype)
    return norm


def noise_std(noise_multiplier: float, clipping_norm: float, participants: int) -> float:
    """The standard deviation of the noise on the mean of ``participants`` updates."""
    return compute_stdv(noise_multiplier, clipping_norm, max(participants, 1))


def add_noise(arrays: NDArrays, std: float, rng: np.random.Generator) -> None:
    """N(0, std^2) on every float value, in place (integer tensors are left alone)."""
    if std <= 0:
        return
    for i in _floats(arrays):
        arrays[i] = (arrays[i] + rng.normal(0.0, std, arrays[i].shape)).astype(arrays[i].dtype)


def achieved_multiplier(noise_multiplier: float, arrived: int, asked: int) -> float:
    """Distributed DP: the noise multiplier of an aggregate that summed the shares of
    ``arrived`` of the ``asked`` clients (each sized for ``asked``): the sum's noise
    has std z C sqrt(arrived / asked) against a sensitivity of C, so
    z sqrt(arrived / asked), below the target whenever a client drops out."""
    return noise_multiplier * float(np.sqrt(min(arrived, asked) / max(asked, 1)))


def noise_share_std(noise_multiplier: float, clipping_norm: float, participants: int) -> float:
    """Distributed DP: the standard deviation of each client's own share, so that
    the shares of ``participants`` clients, summed and divided by ``participants``,
    have ``noise_std``'s: sigma_share = noise multiplier x clipping norm / sqrt(n)."""
    return noise_multiplier * clipping_norm / float(np.sqrt(max(participants, 1)))


class PrivacyAccountant:
    """Epsilon spent so far at ``delta``: Opacus's RDP accountant, one step per
    aggregated round at that round's sampling rate (clients asked over clients
    available). Its history (noise multiplier, rate, steps) is the whole state,
    kept in the server checkpoint so that a resumed run goes on counting."""

    def __init__(self, noise_multiplier: float, delta: float) -> None:
        from opacus.accountants import RDPAccountant

        self.noise_multiplier = noise_multiplier
        self.delta = delta
        self.accountant: Any = RDPAccountant()

    def step(self, sample_rate: float, noise_multiplier: float | None = None) -> None:
        """One aggregated round, at the noise multiplier that round achieved (default:
        the target)."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        self.accountant.step(noise_multiplier=z, sample_rate=sample_rate)

    def history(self) -> np.ndarray:
        """(noise multiplier, sample rate, steps) rows, for the checkpoint."""
        return np.array(self.accountant.history, dtype=np.float64).reshape(-1, 3)

    def restore(self, history: np.ndarray) -> None:
        self.accountant.history = [(float(z), float(q), int(n)) for z, q, n in history]

    def epsilon(self) -> float | None:
        """None while no round was aggregated or without noise (no guarantee)."""
        if self.noise_multiplier <= 0 or not self.accountant.history:
            return None
        return float(self.accountant.get_epsilon(delta=self.delta))
