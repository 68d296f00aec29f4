"""The content audit: which personal tensors can be rebuilt from the wire.

An attacker at the server sees what it sent a client and what the client sent
back. ``recover`` tries to rebuild each of the client's personal tensors from
those arrays alone, three ways:

- a copy: a sent array holding the same values (any shape);
- a linear combination: personal = a * sent + b * received + c, fitted by least
  squares over every (sent, received) pair of the right size (FedCP's blend is
  h_p = 2 h_g' - h_g);
- rows inside a larger tensor: every row of the personal tensor appears as a row
  of one sent array (FedFac's personal rows in a whole-layer upload).

A tensor the server could build from what it sent alone is not counted (it is
not the client's secret), nor is a constant tensor (zeros, a fresh bias) or an
integer one (BatchNorm's batch counter, which the sample count gives away).
"""

from __future__ import annotations

import numpy as np

NDArrays = list[np.ndarray]
TOLERANCE = 1e-5  # relative residual under which a fit counts as exact


def _informative(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.size >= 2 and bool(np.ptp(a) > 0)


def _fits(target: np.ndarray, columns: list[np.ndarray]) -> bool:
    """Whether target is (nearly) a linear combination of columns plus a constant."""
    x = np.stack([c.astype(np.float64) for c in columns] + [np.ones(target.size)], axis=1)
    y = target.astype(np.float64)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = np.linalg.norm(x @ coef - y)
    return bool(residual <= TOLERANCE * max(np.linalg.norm(y - y.mean()), 1e-12))


def _solvable(target: np.ndarray, sent: NDArrays, received: NDArrays) -> bool:
    flat = target.ravel()
    same_size = [a.ravel() for a in sent if a.dtype.kind == "f" and a.size == flat.size]
    known = [a.ravel() for a in received if a.dtype.kind == "f" and a.size == flat.size]
    if any(_fits(flat, [r]) for r in known):
        return False  # the server had it already
    for s in same_size:
        if _fits(flat, [s]) or any(_fits(flat, [s, r]) for r in known):
            return True
    return False


def _row_set(arrays: NDArrays, width: int) -> set[bytes]:
    out: set[bytes] = set()
    for a in arrays:
        if a.dtype.kind == "f" and a.size and a.size % width == 0:
            rows = np.ascontiguousarray(a.astype(np.float32).reshape(-1, width))
            out.update(r.tobytes() for r in rows)
    return out


def _rows_inside(target: np.ndarray, sent: NDArrays, received: NDArrays) -> bool:
    width = target.size // target.shape[0] if target.ndim > 1 else 1
    rows = np.ascontiguousarray(target.astype(np.float32).reshape(-1, width))
    wanted = {r.tobytes() for r in rows if width == 1 or np.ptp(r) > 0}
    if len(wanted) < 2:
        return False
    if wanted <= _row_set(received, width):
        return False
    return any(wanted <= _row_set([s], width) for s in sent)


def recover(personal: dict[str, np.ndarray], sent: NDArrays, received: NDArrays) -> dict[str, str]:
    """The personal tensors rebuildable from ``sent`` and ``received``, each with how."""
    out = {}
    for name, value in personal.items():
        if not _informative(value):
            continue
        if _solvable(value, sent, received):
            out[name] = "linear combination of what was sent and received"
        elif _rows_inside(value, sent, received):
            out[name] = "rows inside a sent tensor"
    return out
