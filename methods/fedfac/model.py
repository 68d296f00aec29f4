"""FedFac's element-level split: which state_dict entries belong to the hidden
elements (neurons / channels) of the layers in Lambda, and its wire
(``FedFacWire``): the split at the head of every payload, and only the shared
rows of each Lambda entry once a split exists."""

from __future__ import annotations

import copy

import numpy as np
from flwr.common import NDArrays
from torch import nn

from methods import ModelSide
from methods.fedfac import FedFacParams, parse_layers
from models.roles import Roles, TensorSpec, batchnorm_entries, get_arrays
from models.wire import Wire
from pflower.config.schema import ConfigError, RunConfig

_SPLITTABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)  # torch's public ones

HELD_OUT = "fa-held-out"  # instruction: the new clients' keys; metric: "I am one"
PHASE = "fa-phase"  # "share-model" (fit) / "ensemble" (evaluate): the consented Ensemble


def element_entries(model: nn.Module, layers: list[str]) -> dict[str, list[str]]:
    """For each layer in Lambda, the state_dict entries indexed by its elements on
    dim 0: the layer's weight (incoming row / filter) and bias, and the affine pair
    and running statistics of a BatchNorm that directly follows it."""
    modules = dict(model.named_modules())
    order = list(modules)
    out: dict[str, list[str]] = {}
    for layer in layers:
        module = modules.get(layer)
        if not isinstance(module, _SPLITTABLE):
            kinds = sorted(n for n, m in modules.items() if isinstance(m, _SPLITTABLE))
            raise ValueError(
                f"config key 'fedfac.fa-layers': '{layer}' is not a Linear/Conv module of this "
                f"model; splittable modules: {kinds}"
            )
        size = module.weight.shape[0]
        entries = [f"{layer}.weight"] + ([f"{layer}.bias"] if module.bias is not None else [])
        for name in order[order.index(layer) + 1 :]:
            nxt = modules[name]
            if isinstance(nxt, _SPLITTABLE):
                break
            if isinstance(nxt, _BN) and nxt.num_features == size:
                entries += [
                    f"{name}.{e}"
                    for e, t in nxt.state_dict().items()
                    if t.dim() >= 1 and t.shape[0] == size
                ]
                break
        out[layer] = entries
    return out


def check_fa_layers(model: nn.Module, cfg: RunConfig) -> None:
    """ConfigError naming 'fa-layers' if a layer is not a Linear/Conv of ``model``."""
    layers = parse_layers(FedFacParams.of(cfg).fa_layers)
    if not layers:
        raise ConfigError("config key 'fedfac.fa-layers': names no layer")
    try:
        element_entries(model, layers)
    except ValueError as err:
        raise ConfigError(f"{err} (model '{cfg.model}')") from None


def layer_sizes(model: nn.Module, layers: list[str]) -> dict[str, int]:
    """Number of hidden elements of each layer."""
    modules = dict(model.named_modules())
    return {layer: int(modules[layer].weight.shape[0]) for layer in layers}


def fedfac_personal(model: nn.Module, cfg: RunConfig) -> set[str]:
    """By layer, nothing is personal (the split is per element, decided by factor
    analysis on the server: ``Roles.rows``), except every BatchNorm's running statistics
    under ``fedfac.bn-stats='local'`` (the authors' code averages named_parameters only)."""
    local = FedFacParams.of(cfg).bn_stats == "local"
    return batchnorm_entries(model, running_stats_only=True) if local else set()


class FedFacWire(Wire):
    """FedFac's wire. Every payload starts with one tensor per Lambda layer: the
    packed bits of its personal rows (1 = personal; empty before the first split).
    Once a split exists, a Lambda entry travels as its shared rows only, both ways,
    except in a round whose uploads feed factor analysis (every round of dynamic
    FedFac, the first of static): those upload every row. With
    ``fedfac.fa-input=updates`` such an upload also carries the start values of the
    rows that were personal (appended by the client: ``FedFacClient.upload``), so the
    server measures each row's change from what this client really started from.

    A wire is of one split, its roles' row split (``Roles.rows``: each Lambda entry's
    personal rows; none before the first): the server's ``with_split`` and a client's
    ``for_payload`` (the split a payload carries) make the wire of another. The rows
    a payload leaves out are the client's own (the model's, as its personal state
    restored them)."""

    def __init__(self, model: nn.Module, roles: Roles, cfg: RunConfig) -> None:
        super().__init__(model, roles, cfg)
        p = FedFacParams.of(cfg)
        layers = parse_layers(p.fa_layers)
        shared = set(self.names)  # a Lambda BN's statistics may be wholly personal (bn-stats)
        self.entries = {
            layer: [e for e in es if e in shared]
            for layer, es in element_entries(model, layers).items()
        }
        self.sizes = layer_sizes(model, layers)
        self.layer_of = {e: layer for layer, es in self.entries.items() for e in es}
        self.position = {n: i for i, n in enumerate(self.names)}
        # tau 'inf': every element personal from the start, nothing for FA to decide
        self.dynamic = cfg.method == "fedfac-dynamic" and p.fa_split == "fa" and p.tau != "inf"
        self.updates = p.fa_input == "updates" and p.fa_split == "fa"
        self.roles = roles
        self.shared = self.split_in(roles)  # layer -> True where shared; None before the first

    # ---- the split -------------------------------------------------------------------------

    def with_split(self, shared: dict[str, np.ndarray] | None) -> FedFacWire:
        """The wire of the split ``shared`` (layer -> True where the element is shared;
        None: before the first split)."""
        rows = {} if shared is None else {e: ~shared[self.layer_of[e]] for e in self.layer_of}
        sizes = {e: self.sizes[self.layer_of[e]] for e in rows}
        wire = copy.copy(self)
        wire.roles = self.roles.with_rows(rows, sizes)
        wire.shared = self.split_in(wire.roles)
        return wire

    def split_in(self, roles: Roles) -> dict[str, np.ndarray] | None:
        """Each Lambda layer's shared elements in ``roles``' row split (None: it has none)."""
        if not roles.rows:
            return None
        return {layer: ~roles.rows[es[0]] for layer, es in self.entries.items()}

    def split_of(self, payload: NDArrays) -> dict[str, np.ndarray] | None:
        """The split at the head of ``payload`` (None: it carries none)."""
        masks = payload[: len(self.sizes)]
        if not any(m.size for m in masks):
            return None
        return {
            layer: ~np.unpackbits(m, count=size).astype(bool)
            for (layer, size), m in zip(self.sizes.items(), masks, strict=True)
        }

    def for_payload(self, payload: NDArrays) -> FedFacWire:
        """A client's wire for ``payload``: of the split it carries (this one's if none)."""
        split = self.split_of(payload)
        return self if split is None else self.with_split(split)

    def full_upload(self) -> bool:
        """Whether uploads carry every Lambda row (for factor analysis)."""
        return self.shared is None or self.dynamic

    def upload_start(self) -> bool:
        """Whether uploads also carry the personal rows' start values."""
        return self.full_upload() and self.updates and self.shared is not None

    def personal(self, layer: str) -> np.ndarray:
        assert self.shared is not None
        return ~self.shared[layer]

    def _rows(self, name: str, full: int) -> int:
        layer = self.layer_of[name]
        return full if self.shared is None else int(self.shared[layer].sum())

    def _masks(self) -> NDArrays:
        if self.shared is None:
            return [np.zeros(0, np.uint8) for _ in self.sizes]
        return [np.packbits(self.personal(layer)) for layer in self.sizes]

    def _compact(self, dense: NDArrays) -> NDArrays:
        if self.shared is None:
            return list(dense)
        out = []
        for name, a in zip(self.names, dense, strict=True):
            layer = self.layer_of.get(name)
            out.append(a if layer is None else a[self.shared[layer]])
        return out

    def _start_spec(self) -> list[TensorSpec]:
        out = []
        for layer in self.sizes:
            s = self.spec[self.position[f"{layer}.weight"]]
            rows = int(self.personal(layer).sum())
            out.append(TensorSpec(f"{layer}.weight (start)", (rows, *s.shape[1:]), s.dtype))
        return out

    def start_values(self, model: nn.Module) -> NDArrays:
        """The personal rows of each Lambda weight in ``model`` (a client's, as its round
        begins: what an upload with ``upload_start`` carries after the shared tensors)."""
        weights = [f"{layer}.weight" for layer in self.sizes]
        return [
            w[self.personal(layer)]
            for layer, w in zip(self.sizes, get_arrays(model, weights), strict=True)
        ]

    # ---- the wire --------------------------------------------------------------------------

    def down_spec(self) -> list[TensorSpec]:
        masks = [TensorSpec(f"{layer}#personal-rows", (-1,), "uint8") for layer in self.sizes]
        rows = [
            s
            if s.name not in self.layer_of
            else TensorSpec(s.name, (self._rows(s.name, s.shape[0]), *s.shape[1:]), s.dtype)
            for s in self.spec
        ]
        return masks + rows

    def up_spec(self) -> list[TensorSpec]:
        if self.upload_start():
            return self.spec + self._start_spec()
        if self.full_upload():
            return self.spec
        return self.down_spec()[len(self.sizes) :]

    def encode_down(self, dense: NDArrays) -> NDArrays:
        return self._masks() + self._compact(dense)

    def decode_down(self, arrays: NDArrays, model: nn.Module) -> NDArrays:
        """The payload's shared rows beside the model's own, by the split the payload
        carries (this wire's if it carries none)."""
        split = self.split_of(arrays)
        shared = self.shared if split is None else split
        arrays = arrays[len(self.sizes) :]
        if shared is None:
            return arrays
        own = get_arrays(model, self.names)
        out = []
        for name, a, mine in zip(self.names, arrays, own, strict=True):
            layer = self.layer_of.get(name)
            if layer is not None:
                mine[shared[layer]] = a
                a = mine
            out.append(a)
        return out

    def encode_up(self, model: nn.Module) -> NDArrays:
        """The shared tensors as they travel (the start values, if any, not included)."""
        dense = get_arrays(model, self.names)
        return dense if self.full_upload() else self._compact(dense)

    def decode_up(self, arrays: NDArrays) -> tuple[NDArrays, NDArrays]:
        """(the shared tensors as uploaded, the personal rows' start values if any)."""
        return arrays[: len(self.names)], arrays[len(self.names) :]


MODEL_SIDES = {
    name: ModelSide(fedfac_personal, check=check_fa_layers, wire=FedFacWire)
    for name in ("fedfac-static", "fedfac-dynamic")
}
