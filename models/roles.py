"""Roles of a model's tensors and the wire spec.

A split rule names the *personal* state_dict entries of a model; everything else
is *shared*. Server and client apply the same rule to the same model, so they
derive the same ordered wire spec without talking. A split may be finer than whole
entries: a shared entry's rows (along its first dimension) may be personal, one
boolean mask per entry (``Split.rows``, ``Roles.rows``; FedFac's neurons).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

# Keys on the wire, read by both sides (clients and strategies import them from here).
CLIENT_KEY = "client-key"  # fit/evaluate metrics: the stable client identity
EVALUATE_FIRST = "evaluate-first"  # fit instruction: score before training (eval-in-fit)
CHECKPOINT_ROUND = "checkpoint-round"  # instruction: the round of the server's last checkpoint
CHECKPOINT_WRITING = "checkpoint-writing"  # instruction: the round of the one being written
CLASSES_KEY = "class-names-sha"  # fit metrics: a digest of the client's own class list
DATA_KEY = "data-sha"  # fit metrics: a digest of the client's data (results.json)
DEVICE_KEY = "device"  # fit metrics: the device type the client trained on (cpu, cuda)
DP_PARTICIPANTS = "dp-participants"  # fit instruction: clients asked (distributed DP)
EVAL_PREFIX = "eval-"  # fit metrics carrying that score (eval-accuracy, eval-loss, ...)

SplitRule = Callable[..., "set[str] | Split"]
"""(model) or (model, run config) -> the names of its personal state_dict entries, or
a ``Split`` where some shared entries have personal rows."""


@dataclass(frozen=True)
class Split:
    """What a split rule returns where the split is finer than whole entries: the
    wholly personal entries, and per shared entry the rows that are personal."""

    personal: frozenset[str] = frozenset()
    # shared entry -> a boolean mask over its first dimension, True where the row is personal
    rows: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False)


def takes_config(rule: SplitRule) -> bool:
    """Whether ``rule`` reads the run config (its second argument)."""
    return len(inspect.signature(rule).parameters) >= 2


@dataclass(frozen=True)
class TensorSpec:
    """One tensor on the wire. A dimension of -1 may have any length."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def matches(self, array: np.ndarray, values: bool = True) -> str | None:
        """None if ``array`` fits this spec, else what is wrong (``values``: its
        values finite too; the caller checks them otherwise)."""
        if str(array.dtype) != self.dtype:
            return f"'{self.name}' has dtype {array.dtype}, expected {self.dtype}"
        shape_ok = len(array.shape) == len(self.shape) and all(
            want in (-1, got) for want, got in zip(self.shape, array.shape)
        )
        if not shape_ok:
            return f"'{self.name}' has shape {tuple(array.shape)}, expected {self.shape}"
        if values and array.dtype.kind == "f" and not np.isfinite(array).all():
            return f"'{self.name}' has non-finite values"
        return None


@dataclass(frozen=True)
class Roles:
    """Shared and personal state_dict entries, in state_dict order."""

    shared: tuple[str, ...]
    personal: tuple[str, ...]
    # shared entry -> True where its row is personal (a row-level split; read-only masks)
    rows: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, model: nn.Module, rule: SplitRule, cfg: Any = None) -> Roles:
        """The roles ``rule`` gives ``model`` (``cfg``: the run config, for a rule that
        reads it)."""
        state = model.state_dict()
        split = rule(model, cfg) if takes_config(rule) else rule(model)
        split = split if isinstance(split, Split) else Split(frozenset(split))
        unknown = split.personal - set(state)
        if unknown:
            raise ValueError(f"split rule names entries not in the model: {sorted(unknown)}")
        roles = cls(
            tuple(n for n in state if n not in split.personal),
            tuple(n for n in state if n in split.personal),
        )
        return roles.with_rows(split.rows, {n: int(state[n].shape[0]) for n in split.rows})

    def with_rows(self, rows: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> Roles:
        """These roles with ``rows`` (shared entry -> personal rows) as the row-level
        split; ``sizes``: each entry's number of rows. ValueError naming a misfit."""
        masks = {}
        for name, mask in rows.items():
            mask = np.asarray(mask)
            if name not in self.shared:
                raise ValueError(f"a row split names '{name}', which is not a shared entry")
            if mask.dtype != bool or mask.shape != (sizes[name],):
                raise ValueError(f"the row split of '{name}' is not {sizes[name]} booleans")
            mask = mask.copy()
            mask.flags.writeable = False
            masks[name] = mask
        return replace(self, rows=MappingProxyType(masks))

    def shared_rows(self, name: str) -> np.ndarray | None:
        """The rows of shared entry ``name`` that travel (None: every row)."""
        mask = self.rows.get(name)
        return None if mask is None else ~mask


def numpy_dtype(dtype: torch.dtype) -> str:
    """The numpy name of a torch dtype, without moving a tensor (a GPU tensor's
    ``.cpu()`` for its dtype alone would copy it to the host)."""
    return str(torch.empty((), dtype=dtype).numpy().dtype)


def wire_spec(model: nn.Module, names: Iterable[str]) -> list[TensorSpec]:
    """The ordered specs of ``names`` in ``model``'s state_dict."""
    state = model.state_dict()
    return [TensorSpec(n, tuple(state[n].shape), numpy_dtype(state[n].dtype)) for n in names]


def get_arrays(model: nn.Module, names: Iterable[str]) -> list[np.ndarray]:
    """Copies of the named state_dict entries as numpy arrays."""
    state = model.state_dict()
    return [state[n].detach().cpu().numpy().copy() for n in names]


def view_arrays(model: nn.Module, names: Iterable[str]) -> list[np.ndarray]:
    """The named state_dict entries as numpy arrays: views on a CPU model's own
    memory (they change as the model does), copies from another device."""
    state = model.state_dict()
    return [state[n].detach().cpu().numpy() for n in names]


def set_arrays(model: nn.Module, names: Iterable[str], arrays: Iterable[np.ndarray]) -> None:
    """Write arrays into the named state_dict entries (in place, no re-allocation);
    a read-only array (a view on a received message) is read, never written."""
    state = model.state_dict()
    with torch.no_grad():
        for name, array in zip(names, arrays, strict=True):
            entry = state[name]
            if entry.device.type == "cpu":  # numpy's copy: no tensor around a read-only array
                np.copyto(entry.numpy(), array, casting="unsafe")
            else:
                entry.copy_(torch.from_numpy(np.require(array, requirements="W")))


def reset_entries(
    model: nn.Module, template: nn.Module, keep: frozenset[str] = frozenset()
) -> None:
    """The template's values in every parameter and buffer of ``model`` (of the same
    structure) that ``keep`` does not name."""
    with torch.no_grad():
        for named in ("named_parameters", "named_buffers"):
            pairs = zip(getattr(model, named)(), getattr(template, named)(), strict=True)
            for (name, mine), (_, theirs) in pairs:
                if name not in keep:
                    mine.copy_(theirs)


# ---- split rules shared by several methods -------------------------------------------------


def nothing_personal(model: nn.Module) -> set[str]:
    """FedAvg: every entry is shared."""
    return set()


def everything_personal(model: nn.Module) -> set[str]:
    """Local: nothing leaves the client."""
    return set(model.state_dict().keys())


def head_personal(model: nn.Module) -> set[str]:
    """FedPer / FedRep: the classifier head stays on the client."""
    return {n for n in model.state_dict() if n.startswith("head.")}


_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)  # torch's public ones


def batchnorm_entries(model: nn.Module, running_stats_only: bool = False) -> set[str]:
    """Names of BatchNorm entries (affine params and running stats)."""
    out: set[str] = set()
    for mod_name, module in model.named_modules():
        if not isinstance(module, _BN):
            continue
        prefix = f"{mod_name}." if mod_name else ""
        for entry in module.state_dict():
            if running_stats_only and entry in ("weight", "bias"):
                continue
            out.add(prefix + entry)
    return out


def bn_personal(model: nn.Module) -> set[str]:
    """FedBN: BatchNorm layers (affine and running stats) stay on the client."""
    return batchnorm_entries(model)
