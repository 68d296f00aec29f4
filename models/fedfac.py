"""FedFac's element-level split: which state_dict entries belong to the hidden
elements (neurons / channels) of the layers in Lambda, and how the per-layer
personal mask travels in a Flower config (packed bits)."""

from __future__ import annotations

import numpy as np
from torch import nn

from run_config.schema import ConfigError, RunConfig

_SPLITTABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BN = (nn.modules.batchnorm._BatchNorm,)

MASK_KEY = "fa-personal:"  # + layer name -> packed bits, 1 = personal element
HELD_OUT = "fa-held-out"  # instruction: the new clients' keys; metric: "I am one"
FULL_UPLOAD = "fa-full-upload"  # instruction: upload every Lambda element (for FA)
UPLOAD_START = "fa-upload-start"  # instruction: also the personal rows' start values
PERSONAL_ROWS = "[personal]"  # suffix naming the personal rows of a Lambda entry
PHASE = "fa-phase"  # "share-model" (fit) / "ensemble" (evaluate): the consented Ensemble


def parse_layers(spec: str) -> list[str]:
    """``fa-layers``: comma-separated module names (empty items ignored)."""
    return [s.strip() for s in spec.split(",") if s.strip()]


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
                f"config key 'fa-layers': '{layer}' is not a Linear/Conv module of this "
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
    layers = parse_layers(cfg.fa_layers)
    if not layers:
        raise ConfigError("config key 'fa-layers': names no layer")
    try:
        element_entries(model, layers)
    except ValueError as err:
        raise ConfigError(f"{err} (model '{cfg.model}')") from None


def layer_sizes(model: nn.Module, layers: list[str]) -> dict[str, int]:
    """Number of hidden elements of each layer."""
    modules = dict(model.named_modules())
    return {layer: int(modules[layer].weight.shape[0]) for layer in layers}


def pack_mask(mask: np.ndarray) -> bytes:
    """A boolean mask as packed bits (what travels in a config)."""
    return np.packbits(np.asarray(mask, dtype=bool)).tobytes()


def unpack_mask(data: bytes, size: int) -> np.ndarray:
    """Inverse of ``pack_mask`` for a layer of ``size`` elements."""
    return np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=size).astype(bool)
