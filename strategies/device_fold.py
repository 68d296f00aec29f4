"""A streamed round's sum and bounds in torch on the clients' device.

Where the in-process engine's clients train on a GPU (node config ``device=cuda``),
the server folds each reply on that device too: the reply's tensors (the Message's
bytes, read in place) go to the device once, and its update's norm, its dot with the
direction centre, a moved update and the running sum are torch ops there, instead of
compiled loops on one host core (strategies/kernels.py), which would be the round's
longest path at a GPU's pace (docs/PERFORMANCE.md has the figures).

The same arithmetic as the host's: the sum is TwoSum in float64, element by element
(separate torch ops, no fused multiply-add: the host kernel's bits, tested on the
CPU); the norm and the dot are torch's float64 reductions (another summation order
than the host loop's: within float64's rounding, measured in tests/test_codec.py).
On a CPU the compiled loops stay: they are faster there (no temporaries).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from strategies.kernels import per_array

NDArrays = list[np.ndarray]


def on_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` (a read-only view on a message's bytes, often) as a tensor on
    ``device``: read, never written (a CPU tensor shares the array's memory)."""
    with warnings.catch_warnings():  # torch warns that the view is not writable
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(np.require(array, requirements="C"))  # 0-d stays 0-d
    return tensor.to(device, non_blocking=False)


class DeviceCopies:
    """Arrays a round reads for every reply (the payload each client was sent, the
    direction centre) copied to the device once, by identity (the round keeps them)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.held: dict[int, tuple[np.ndarray, torch.Tensor]] = {}

    def __call__(self, array: np.ndarray) -> torch.Tensor:
        found = self.held.get(id(array))
        if found is None or found[0] is not array:
            found = self.held[id(array)] = (array, on_device(array, self.device))
        return found[1]


class DeviceRunningMean:
    """``strategies.robust.RunningMean`` on ``device``: a weighted double-double sum
    per tensor (``hi + lo``), its mean cast back to each tensor's dtype on the host."""

    def __init__(self, device: torch.device, spare: Any = None) -> None:
        self.device = device
        self.hi: list[torch.Tensor] = []
        self.lo: list[torch.Tensor] = []
        self.dtypes: list[np.dtype] = []
        self.totals: list[float] = []  # each array's sum of weights
        self.count = 0

    def add(self, arrays: NDArrays, weight: float | list[float]) -> None:
        if not self.count:
            self.hi = [
                torch.zeros(a.shape, dtype=torch.float64, device=self.device) for a in arrays
            ]
            self.lo = [torch.zeros_like(h) for h in self.hi]
            self.dtypes = [a.dtype for a in arrays]
            self.totals = [0.0] * len(arrays)
        elif len(arrays) != len(self.hi):
            raise ValueError(f"{len(arrays)} tensors, the sum has {len(self.hi)}")
        weights = per_array(weight, len(arrays))
        for i, (a, hi, lo) in enumerate(zip(arrays, self.hi, self.lo)):
            if tuple(a.shape) != tuple(hi.shape):
                raise ValueError(f"a tensor of shape {a.shape} where the sum has {tuple(hi.shape)}")
            term = on_device(a, self.device).to(torch.float64) * weights[i]
            total = hi + term
            back = total - hi
            lo += (term - back) + (hi - (total - back))
            hi.copy_(total)
            self.totals[i] += weights[i]
        self.count += 1

    def mean(self) -> NDArrays:
        if not self.count:
            raise ValueError("an empty sum has no mean")
        out = []
        for hi, lo, dtype, total in zip(self.hi, self.lo, self.dtypes, self.totals):
            mean = ((hi + lo) / total).cpu().numpy()
            out.append(mean.astype(dtype))
        return out

    def release(self) -> None:
        self.hi, self.lo, self.dtypes, self.totals, self.count = [], [], [], [], 0
        return None


class DeviceMoments:
    """``strategies.streaming.Moments`` on ``device``: one reply's update over
    ``tensors``, its norm and its dot with a unit ``centre``, and, moved, its arrays."""

    def __init__(
        self,
        upload: NDArrays,
        reference: NDArrays,
        tensors: list[int],
        centre: np.ndarray | None = None,
        device: torch.device | None = None,
        copies: DeviceCopies | None = None,
    ) -> None:
        device = device or torch.device("cpu")
        kept = copies or DeviceCopies(device)
        self.upload, self.reference, self.tensors, self.device = upload, reference, tensors, device
        self.centre = centre  # what ``dot`` was taken against
        self.pairs = [
            (on_device(upload[t], device).reshape(-1), kept(reference[t]).reshape(-1))
            for t in tensors
        ]
        self.unit = None if centre is None else kept(centre)
        squares = torch.zeros((), dtype=torch.float64, device=device)
        dot = torch.zeros((), dtype=torch.float64, device=device)
        at = 0
        for u, r in self.pairs:
            d = u.to(torch.float64) - r.to(torch.float64)
            squares += d @ d
            if self.unit is not None:
                dot += d @ self.unit[at : at + d.numel()]
            at += d.numel()
        self.norm, self.dot = float(squares.sqrt()), float(dot)

    def _moved(self, scale: float, dot: float) -> list[torch.Tensor]:
        out, at = [], 0
        for u, r in self.pairs:
            v = (u.to(torch.float64) - r.to(torch.float64)) * scale
            if dot and self.unit is not None:
                v -= dot * self.unit[at : at + v.numel()]
            out.append(v)
            at += v.numel()
        return out

    def moved_norm(self, scale: float, dot: float) -> float:
        return float(np.sqrt(sum(float(v @ v) for v in self._moved(scale, dot))))

    def rebased(self, scale: float, dot: float, after: float) -> NDArrays:
        out = list(self.upload)
        for t, (_, r), v in zip(self.tensors, self.pairs, self._moved(scale, dot), strict=True):
            moved = (r.to(torch.float64) + after * v).cpu().numpy()
            out[t] = moved.astype(self.upload[t].dtype).reshape(self.upload[t].shape)
        return out


def fold_device(node_devices: list[str]) -> torch.device | None:
    """The device a streamed round folds on: the clients' CUDA device when every node
    trains on the same one (in-process simulation), else None (the host's loops)."""
    named = {d or ("cuda" if torch.cuda.is_available() else "cpu") for d in node_devices}
    if len(named) == 1:
        (device,) = named
        if device.startswith("cuda") and torch.cuda.is_available():
            return torch.device(device)
    return None
