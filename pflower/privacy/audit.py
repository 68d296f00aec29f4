"""The content audit: which personal tensors can be rebuilt from the wire.

An attacker at the server sees what it sent a client and what the client sent
back (arrays and metrics). ``recover`` tries to rebuild each of the client's
personal tensors from those alone, the ways an attacker would:

- a linear function of one sent array, or of a sent array and a received one
  (personal = a * sent + b * received + c, least squares over every pair of the
  right size: a copy, a rescaled copy, FedCP's blend h_p = 2 h_g' - h_g), exact or
  approximate (noise, reduced precision): the fit counts when its relative error
  (residual over the tensor's spread) is under ``APPROXIMATE`` (0.2: a correlation
  above 0.98) and ten times smaller than the best fit from what the server sent
  the client (a personal model that merely resembles the global one is no leak);
  a tensor of fewer than 9 values (two columns and a constant fit it by chance)
  counts only as a copy (equal as float16);
- rows or columns inside a sent tensor: at least two of the personal tensor's rows
  (or columns) appear among a sent array's rows (columns) of that length, exactly
  or rounded to float16 (FedFac's personal rows in a whole-layer upload, half a
  head, a slice);
- values inside the metrics: at least three float metrics that are values of the
  personal tensor (as float16 or better).

A tensor the server could build from what it sent alone is not counted (it is
not the client's secret), nor is a constant tensor (zeros, a fresh bias) or an
integer one (BatchNorm's batch counter, which the sample count gives away).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NDArrays = list[np.ndarray]
APPROXIMATE = 0.2  # relative residual under which a fit rebuilds the tensor
MARGIN = 10.0  # ... and how much better than the server's own arrays it must be
MIN_VALUES = 2  # rows or columns that count as a partial copy
MIN_FIT_SIZE = 9  # smaller tensors fit any two columns and a constant: exact copies only
MIN_METRICS = 3  # float metrics equal to values of one personal tensor


def _informative(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.size >= 2 and bool(np.ptp(a) > 0)


def _residual(target: np.ndarray, columns: list[np.ndarray]) -> float:
    """Relative residual of the least-squares fit of target by columns plus a constant."""
    x = np.stack([c.astype(np.float64) for c in columns] + [np.ones(target.size)], axis=1)
    y = target.astype(np.float64)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    spread = max(float(np.linalg.norm(y - y.mean())), 1e-12)
    return float(np.linalg.norm(x @ coef - y)) / spread


def _same_size(arrays: NDArrays, size: int) -> list[np.ndarray]:
    return [a.ravel() for a in arrays if a.dtype.kind == "f" and a.size == size]


def _solvable(target: np.ndarray, sent: NDArrays, received: NDArrays) -> bool:
    flat = target.ravel()
    known = _same_size(received, flat.size)
    if flat.size < MIN_FIT_SIZE:  # too few values to tell a fit from chance: copies only
        same = lambda a: np.array_equal(a.astype(np.float16), flat.astype(np.float16))  # noqa: E731
        return not any(map(same, known)) and any(map(same, _same_size(sent, flat.size)))
    had = min([_residual(flat, [r]) for r in known], default=np.inf)
    for s in _same_size(sent, flat.size):
        fits = [_residual(flat, [s])] + [_residual(flat, [s, r]) for r in known]
        best = min(fits)
        if best < APPROXIMATE and best * MARGIN < had:
            return True
    return False


def _keys(rows: np.ndarray) -> set[bytes]:
    """Rows as float16 bytes (so a reduced-precision copy still matches)."""
    with np.errstate(over="ignore"):
        return {r.tobytes() for r in np.ascontiguousarray(rows.astype(np.float16))}


def _lines(a: np.ndarray, width: int, columns: bool) -> np.ndarray | None:
    """``a``'s rows of ``width`` values (or its columns of that length, for 2-D)."""
    if columns:
        if a.ndim != 2 or a.shape[0] != width:
            return None
        return a.T
    if a.size % width:
        return None
    return a.reshape(-1, width)


def _partial_copy(target: np.ndarray, sent: NDArrays, received: NDArrays) -> str | None:
    if target.ndim < 2:
        return None
    matrix = target.reshape(target.shape[0], -1)
    for columns, lines in ((False, matrix), (True, matrix.T)):
        width = lines.shape[1]
        if width < 2:
            continue
        wanted = _keys(lines[np.ptp(lines, axis=1) > 0])
        if len(wanted) < MIN_VALUES:
            continue
        had = set()
        for r in received:
            if r.dtype.kind == "f" and (got := _lines(r, width, columns)) is not None:
                had |= _keys(got)
        for s in sent:
            if s.dtype.kind == "f" and (got := _lines(s, width, columns)) is not None:
                found = (wanted & _keys(got)) - had
                if len(found) >= MIN_VALUES:
                    part = "columns" if columns else "rows"
                    return f"{len(found)} of its {len(wanted)} {part} inside a sent tensor"
    return None


def _in_metrics(target: np.ndarray, metrics: Mapping[str, object]) -> str | None:
    values = [float(v) for v in metrics.values() if isinstance(v, float) and v != 0.0]
    if len(values) < MIN_METRICS:
        return None
    own = set(np.unique(target.astype(np.float16)).tolist())
    found = [v for v in values if float(np.float16(v)) in own]
    if len(found) >= MIN_METRICS:
        return f"{len(found)} of its values inside the metrics"
    return None


def recover(
    personal: dict[str, np.ndarray],
    sent: NDArrays,
    received: NDArrays,
    metrics: Mapping[str, object] | None = None,
) -> dict[str, str]:
    """The personal tensors rebuildable from ``sent`` (and ``metrics``) and
    ``received``, each with how."""
    out = {}
    for name, value in personal.items():
        if not _informative(value):
            continue
        if _solvable(value, sent, received):
            out[name] = "linear function of what was sent and received"
        elif how := _partial_copy(value, sent, received):
            out[name] = how
        elif how := _in_metrics(value, metrics or {}):
            out[name] = how
    return out
