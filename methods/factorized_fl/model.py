"""Factorized-FL's model: every conv/linear weight is W = reshape(u v^T + mu).

Linear (O, I): u in R^(I x r), v in R^(r x O), mu in R^(I x O), W = (u v + mu)^T.
Conv (O, I, kh, kw): u in R^(kh*kw x r) spans the kernel positions, v in
R^(r x O*I) the (out, in) channel pairs, mu in R^(kh*kw x O*I), and
W[o, i] = (u v + mu)[:, o*I + i] reshaped to (kh, kw). (The reference code views
the (kh*kw, O*I) matrix directly as (O, I, kh, kw), which scrambles kernel
positions with channels; this keeps the paper's meaning of u.)

Built on ``torch.nn.utils.parametrize`` (``module.weight`` stays a tensor of the
original shape); the state_dict entries are
``<layer>.parametrizations.weight.original0/1/2`` = u / v / mu. mu starts at
zero; entries with |mu| < threshold are dropped at evaluation and on the wire.

The wire (``FactorizedWire``) is written once here for client and server: beta sends each mu
as (layout, values) in the cheapest of three layouts (``encode_sparse``); alpha
appends the v of the last layer before the head to its upload, for similarity
matching only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from methods import ModelSide
from methods.factorized_fl import FactorizedFLParams
from models.roles import Roles, TensorSpec, batchnorm_entries, get_arrays
from models.wire import Wire
from pflower.config.schema import RunConfig

U, V, MU = (f".parametrizations.weight.original{i}" for i in range(3))
LAYOUT, VAL = "#layout", "#val"
DENSE, INDEX, MASK = 0, 1, 2  # the first byte of a layout


class FactorizedWeight(nn.Module):
    """The parametrization (u, v, mu) -> W for one layer."""

    def __init__(
        self,
        shape: tuple[int, ...],
        rank: int,
        threshold: float,
        init: str = "scaled",
        dense_mu: bool = False,
    ) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.rank = rank
        self.threshold = threshold
        self.init = init  # factorized-fl.init
        self.dense_mu = dense_mu  # init 'authors': this layer's mu Xavier-dense (the head)

    def factor_dims(self) -> tuple[int, int]:
        """(rows of u, columns of v): (I, O) for linear, (kh*kw, O*I) for conv."""
        if len(self.shape) == 2:
            out_dim, in_dim = self.shape
            return in_dim, out_dim
        out_dim, in_dim, *kernel = self.shape
        return int(np.prod(kernel)), out_dim * in_dim

    def forward(self, u: torch.Tensor, v: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        if not self.training:
            mu = mu.masked_fill(mu.abs() < self.threshold, 0.0)
        full = u @ v + mu
        if len(self.shape) == 2:
            return full.t()
        return full.t().reshape(self.shape)

    def right_inverse(self, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Fresh factors (called once, at registration, with the layer's default
        init). The paper is silent on the init; the reference draws u (rows x r)
        and v (r x cols) Xavier-uniform, which makes u v^T 2-7x smaller than the
        layer's default init; without BatchNorm (cnn4) that net does not train.
        So by default (``init`` 'scaled') the Xavier factors are scaled (both by the
        same factor) until u v^T has the standard deviation of the default-initialised
        weight, and mu starts at zero. ``init`` 'authors' keeps the factors as drawn
        and, for the head (``dense_mu``), draws mu Xavier-uniform too, as the
        reference's FactorizedDense does (layers.py:17-30): its head is then
        effectively full rank from the start."""
        rows, cols = self.factor_dims()
        u = torch.empty(rows, self.rank, dtype=weight.dtype, device=weight.device)
        v = torch.empty(self.rank, cols, dtype=weight.dtype, device=weight.device)
        nn.init.xavier_uniform_(u)
        nn.init.xavier_uniform_(v)
        mu = torch.zeros(rows, cols, dtype=weight.dtype, device=weight.device)
        if self.init == "authors":
            if self.dense_mu:
                nn.init.xavier_uniform_(mu)
            return u, v, mu
        with torch.no_grad():
            scale = (weight.std() / (u @ v).std().clamp_min(1e-12)).sqrt()
        return u * scale, v * scale, mu


_FACTORIZABLE = (nn.Linear, nn.Conv2d)


def factorize(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """The method transform: factorize every Linear/Conv2d weight in place.
    BatchNorm is left alone; biases stay as they are."""
    p = FactorizedFLParams.of(cfg)
    head = getattr(model, "head", None)
    targets = [m for m in model.modules() if isinstance(m, _FACTORIZABLE)]
    for module in targets:
        weight = module.weight
        parametrize.register_parametrization(
            module,
            "weight",
            FactorizedWeight(
                tuple(weight.shape), p.rank, p.mu_threshold, p.init, dense_mu=module is head
            ),
            unsafe=True,  # right_inverse returns three tensors of other shapes
        )
    return model


def factorized_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Factorized layers by name, in registration order."""
    return {
        name: m
        for name, m in model.named_modules()
        if parametrize.is_parametrized(m, "weight")
        and isinstance(m.parametrizations.weight[0], FactorizedWeight)
    }


def mu_l1(model: nn.Module) -> torch.Tensor:
    """sum |mu| over every factorized layer, differentiable (the reference sums
    detached state_dict copies, so its penalty has no gradient)."""
    terms = [
        m.parametrizations.weight.original2.abs().sum() for m in factorized_layers(model).values()
    ]
    return torch.stack(terms).sum()


def encode_sparse(mu: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(layout, float32 values) of the entries |mu| >= threshold, in the cheapest of
    three layouts for this tensor's density (n entries, k kept; bytes):
    DENSE (4n; every value), INDEX (8k; int32 flat indices) or MASK (n/8 + 4k; a
    packed bitmask). ``layout`` is uint8: the layout's byte, then the indices'
    little-endian bytes or the bitmask. The indices-only form costs more than dense
    above 50% density, the bitmask from about 3%."""
    flat = mu.reshape(-1).astype(np.float32)
    keep = np.abs(flat) >= threshold
    n, k = flat.size, int(keep.sum())
    cost = {DENSE: 4 * n, INDEX: 8 * k, MASK: -(-n // 8) + 4 * k}
    layout = min(cost, key=lambda f: (cost[f], f))
    if layout == DENSE:
        return np.array([DENSE], np.uint8), np.where(keep, flat, 0.0).astype(np.float32)
    if layout == INDEX:
        idx = np.flatnonzero(keep).astype("<i4")
        return np.concatenate([[INDEX], idx.view(np.uint8)]).astype(np.uint8), flat[keep]
    return np.concatenate([[MASK], np.packbits(keep)]).astype(np.uint8), flat[keep]


def decode_sparse(layout: np.ndarray, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The dense float32 array of ``shape``; ValueError names what is inconsistent."""
    n = int(np.prod(shape))
    if layout.dtype != np.uint8 or layout.ndim != 1 or layout.size == 0:
        raise ValueError("the layout is not a non-empty uint8 vector")
    kind, body = int(layout[0]), layout[1:]
    dense = np.zeros(n, dtype=np.float32)
    if kind == DENSE:
        if body.size or values.size != n:
            raise ValueError(f"a dense layout needs {n} values, got {values.size}")
        return values.astype(np.float32).reshape(shape)
    if kind == INDEX:
        if body.size % 4:
            raise ValueError("index bytes are not whole int32 values")
        idx = body.view("<i4")
        if idx.size != values.size:
            raise ValueError(f"{idx.size} indices for {values.size} values")
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"indices outside [0, {n})")
        if np.unique(idx).size != idx.size:
            raise ValueError("repeated indices")
        dense[idx] = values
    elif kind == MASK:
        if body.size != -(-n // 8):
            raise ValueError(f"a bitmask of {body.size} bytes for {n} entries")
        keep = np.unpackbits(body, count=n).astype(bool)
        if int(keep.sum()) != values.size:
            raise ValueError(f"the bitmask marks {int(keep.sum())} entries, {values.size} sent")
        dense[keep] = values
    else:
        raise ValueError(f"unknown layout {kind}")
    return dense.reshape(shape)


def matching_layer(model: nn.Module) -> str:
    """The last factorized layer before the head (shortcut projections skipped);
    its v is the client's matching vector."""
    body = [n for n in factorized_layers(model) if n.startswith("features.")]
    main_path = [n for n in body if "downsample" not in n]
    if not main_path:
        raise ValueError("Factorized-FL needs a factorized layer in model.features")
    return main_path[-1]


# ---- split rules ---------------------------------------------------------------------------


def alpha_personal(model: nn.Module) -> set[str]:
    """alpha: v and mu of every layer, the head, BN running stats stay local;
    u, the layer biases and BN affine travel (the reference's 'u' mode
    aggregates everything but v and mu; the paper is silent on biases)."""
    factors = {n + s for n in factorized_layers(model) for s in (V, MU)}
    head = {n for n in model.state_dict() if n.startswith("head.")}
    return factors | head | batchnorm_entries(model, running_stats_only=True)


def beta_personal(model: nn.Module) -> set[str]:
    """beta: only the head and BN running stats stay local."""
    head = {n for n in model.state_dict() if n.startswith("head.")}
    return head | batchnorm_entries(model, running_stats_only=True)


# ---- the wire --------------------------------------------------------------------------------


class FactorizedWire(Wire):
    """How the shared tensors travel, both ways, plus alpha's matching vector."""

    def __init__(self, model: nn.Module, roles: Roles, cfg: RunConfig) -> None:
        super().__init__(model, roles, cfg)
        state = model.state_dict()
        self.shared = self.names
        self.match = matching_layer(model) + V  # state_dict name of the matching v
        self.shapes = {n: tuple(state[n].shape) for n in (*self.shared, self.match)}
        self.sparse = frozenset(n for n in self.shared if n.endswith(MU))  # (layout, values)
        self.match_extra = self.match not in self.shared  # alpha: v is personal, appended
        p = FactorizedFLParams.of(cfg)
        # mu-wire 'dense' (the authors' code): every entry travels and is averaged
        self.threshold = 0.0 if p.mu_wire == "dense" else p.mu_threshold

    def down_spec(self) -> list[TensorSpec]:
        """What the server sends (the encoded shared tensors)."""
        out = []
        for n in self.shared:
            if n in self.sparse:
                out += [
                    TensorSpec(n + LAYOUT, (-1,), "uint8"),
                    TensorSpec(n + VAL, (-1,), "float32"),
                ]
            else:
                out.append(TensorSpec(n, self.shapes[n], "float32"))
        return out

    def up_spec(self) -> list[TensorSpec]:
        """What a client sends: the encoded shared tensors (+ alpha's matching v)."""
        extra = [TensorSpec(self.match, (int(np.prod(self.shapes[self.match])),), "float32")]
        return self.down_spec() + (extra if self.match_extra else [])

    def encode(self, dense: list[np.ndarray]) -> list[np.ndarray]:
        """Dense shared arrays (in ``shared`` order) -> wire arrays."""
        out: list[np.ndarray] = []
        for n, a in zip(self.shared, dense, strict=True):
            out += list(encode_sparse(a, self.threshold)) if n in self.sparse else [a]
        return out

    def decode(self, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Wire arrays -> (dense shared arrays, matching vector or None)."""
        dense, i = [], 0
        for n in self.shared:
            if n in self.sparse:
                dense.append(decode_sparse(arrays[i], arrays[i + 1], self.shapes[n]))
                i += 2
            else:
                dense.append(arrays[i])
                i += 1
        if self.match_extra:
            match = arrays[i] if i < len(arrays) else None
        else:
            match = dense[self.shared.index(self.match)].reshape(-1)
        return dense, match

    encode_down = encode
    decode_up = decode

    def decode_down(self, arrays: list[np.ndarray], model: nn.Module) -> list[np.ndarray]:
        return self.decode(arrays)[0]

    def encode_up(self, model: nn.Module) -> list[np.ndarray]:
        out = self.encode(get_arrays(model, self.shared))
        if self.match_extra:
            (v,) = get_arrays(model, [self.match])
            out.append(np.ascontiguousarray(v.reshape(-1)))
        return out

    def check_up(self, arrays: list[np.ndarray]) -> str | None:
        """None if every (layout, values) pair decodes, else the problem."""
        specs = self.down_spec()
        for j, s in enumerate(specs):
            if s.name.endswith(LAYOUT):
                try:
                    decode_sparse(arrays[j], arrays[j + 1], self.shapes[s.name[: -len(LAYOUT)]])
                except ValueError as err:
                    return f"'{s.name}': {err}"
        return None


MODEL_SIDES = {
    "factorized-fl-alpha": ModelSide(alpha_personal, transform=factorize, wire=FactorizedWire),
    "factorized-fl-beta": ModelSide(beta_personal, transform=factorize, wire=FactorizedWire),
}
