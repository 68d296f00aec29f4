"""The server's compiled loops over a reply's floats (numba, compiled on first use).

numpy needs a temporary array for each step of these (a CNN4 update is 7 MB of
float64, and a fresh temporary that size costs more in page faults than the
arithmetic). Each loop that writes arrays does numpy's operations in numpy's order,
without fast-math (no fused multiply-add, no reordering), so the bits are numpy's
(tests/test_streaming.py compares each with the numpy expression it replaces). The
one exception is ``reply_moments``, whose sums only are reordered (see there).
Each kernel compiles once per dtype signature (numba's own start before the first) and
is cached on disk where numba finds a writable place; ``warm``
loads or compiles a server's kernels on a thread of its own before its rounds need them.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

# what the kernels are compiled for; other dtypes take the numpy expression
COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

log = logging.getLogger("flwr.pflower")


def _njit(**options: Any) -> Callable[..., Callable[..., None]]:
    import numba  # here, not at import: only a server that bounds or sums needs it

    def compiled(fn: Callable[..., None]) -> Callable[..., None]:
        # nogil: the workers that train meanwhile are not held back. cache: a later
        # process loads the machine code instead of compiling it again
        try:
            return numba.njit(nogil=True, cache=True, **options)(fn)
        except RuntimeError:  # no writable cache directory (a read-only install)
            return numba.njit(nogil=True, **options)(fn)

    return compiled


@functools.cache
def two_sum() -> Callable[..., None]:
    """``add(x, weight, hi, lo)``: ``hi + lo += x * weight`` element by element, by
    TwoSum: ``lo`` gathers the bits each addition to ``hi`` loses. numpy needs nine
    passes a chunk for it (the comparison: python -m benchmarks.studies.running_sum)."""

    @_njit()
    def add(x: np.ndarray, weight: float, hi: np.ndarray, lo: np.ndarray) -> None:
        for i in range(x.size):
            # exact: a float32 times a count below 2**29 fits float64's 53 bits
            term = np.float64(x[i]) * weight
            total = hi[i] + term
            back = total - hi[i]
            lo[i] += (term - back) + (hi[i] - (total - back))
            hi[i] = total

    return add


@functools.cache
def mean_of() -> Callable[..., None]:
    """``mean(hi, lo, total, out)``: ``out = (hi + lo) / total``, cast to ``out``'s dtype
    as it is written (numpy makes the float64 sum, then the quotient, then the cast:
    three temporaries, at the round's end, where no worker trains)."""

    @_njit()
    def mean(hi: np.ndarray, lo: np.ndarray, total: float, out: np.ndarray) -> None:
        for i in range(out.size):
            out[i] = (hi[i] + lo[i]) / total

    return mean


@functools.cache
def remove_along() -> Callable[..., None]:
    """``remove(x, unit, dot)``: ``x -= dot * unit`` in place (numpy makes ``dot * unit``
    first, a temporary the size of ``x``)."""

    @_njit()
    def remove(x: np.ndarray, unit: np.ndarray, dot: float) -> None:
        for i in range(x.size):
            x[i] -= dot * unit[i]

    return remove


@functools.cache
def rebase() -> Callable[..., None]:
    """``rebase(reference, update, out)``: ``out = reference + update`` in float64, cast
    to ``out``'s dtype as it is written (numpy makes the float64 sum first, then its
    cast: two temporaries)."""

    @_njit()
    def rebased(reference: np.ndarray, update: np.ndarray, out: np.ndarray) -> None:
        for i in range(out.size):
            out[i] = np.float64(reference[i]) + update[i]

    return rebased


@functools.cache
def value_range() -> Callable[..., tuple[bool, float]]:
    """``check(x) -> (finite, largest |x|)`` in one pass, stopping at the first non-finite
    value (numpy: ``isfinite(x).all()`` and ``abs(x).max()``, each a temporary the size
    of ``x``)."""

    @_njit()
    def check(x: np.ndarray) -> tuple[bool, float]:
        largest = 0.0
        for i in range(x.size):
            v = np.float64(x[i])
            if not np.isfinite(v):
                return False, np.inf
            if abs(v) > largest:
                largest = abs(v)
        return True, largest

    return check


# the one fast-math flag ``reply_moments`` takes: its sums may be reassociated (so they
# vectorize), nothing else (no "nnan"/"ninf": it counts the non-finite values)
REORDERED_SUMS = {"reassoc"}


@functools.cache
def reply_moments() -> Callable[..., tuple[int, float, float]]:
    """``moments(upload, reference, unit, limit) -> (outside, |d|^2, d . unit)`` of one
    tensor of a reply, ``d = upload - reference`` in float64, in one pass and without
    making ``d``: ``outside`` counts the values of ``upload`` that are not finite or
    whose magnitude is above ``limit`` (the reply's value check: ``value_range``'s
    verdict), ``unit`` is the centre's slice for this tensor (empty: no dot, 0).

    The two sums are reassociated (the one fast-math flag ``reassoc``), so LLVM
    vectorizes them (against the check, the norm and the dot in element order: python
    -m benchmarks.studies.fold_pass). The
    order is fixed by the machine code (the CPU's vector width): the same bits on a
    machine, a norm and a dot within float64's rounding of numpy's elsewhere
    (tests/test_streaming.py measures it against an exact sum)."""

    @_njit(fastmath=REORDERED_SUMS)
    def moments(
        upload: np.ndarray, reference: np.ndarray, unit: np.ndarray, limit: float
    ) -> tuple[int, float, float]:
        outside, squares, dot = 0, 0.0, 0.0
        if unit.size > 0:
            for i in range(upload.size):
                v = np.float64(upload[i])
                outside += not (abs(v) <= limit)  # NaN compares false: counted
                d = v - np.float64(reference[i])
                squares += d * d
                dot += d * unit[i]
        else:
            for i in range(upload.size):
                v = np.float64(upload[i])
                outside += not (abs(v) <= limit)
                d = v - np.float64(reference[i])
                squares += d * d
        return outside, squares, dot

    return moments


@functools.cache
def moved_squares() -> Callable[..., float]:
    """``squares(upload, reference, unit, at, scale, dot) -> |scale * d - dot * unit|^2``
    over one tensor (``d = upload - reference``): the length of a clipped and projected
    update, element by element (no cancellation of two large sums)."""

    @_njit()
    def squares(
        upload: np.ndarray, reference: np.ndarray, unit: np.ndarray, at: int, scale: float,
        dot: float,
    ) -> float:  # fmt: skip
        total = 0.0
        for i in range(upload.size):
            v = (np.float64(upload[i]) - np.float64(reference[i])) * scale - dot * unit[at + i]
            total += v * v
        return total

    return squares


@functools.cache
def rebase_moved() -> Callable[..., None]:
    """``rebase(upload, reference, unit, at, scale, dot, after, out)``: ``out = reference +
    after * (scale * d - dot * unit)``, ``d = upload - reference``, in float64, cast as it
    is written: a clipped (``scale``), projected (``dot``; 0: not) and shortened
    (``after``) update put back on its reference, with no float64 temporary."""

    @_njit()
    def rebase(
        upload: np.ndarray, reference: np.ndarray, unit: np.ndarray, at: int, scale: float,
        dot: float, after: float, out: np.ndarray,
    ) -> None:  # fmt: skip
        with_unit = unit.size > 0
        for i in range(out.size):
            v = (np.float64(upload[i]) - np.float64(reference[i])) * scale
            if with_unit:
                v -= dot * unit[at + i]
            out[i] = np.float64(reference[i]) + after * v

    return rebase


@functools.cache
def warm(dtypes: tuple[np.dtype, ...], projection: bool) -> threading.Thread:
    """Load or compile, on a thread of its own, the kernels a server whose tensors
    are of ``dtypes`` calls (with ``projection``: the direction check's two), so a
    round's first call does not wait for them. Once
    a process; a kernel it fails to build is built, or fails, at its first call."""

    def build() -> None:
        try:
            for dtype in dtypes:
                x = np.zeros(2, dtype)
                two_sum()(x, 1.0, np.zeros(2), np.zeros(2))
                mean_of()(np.zeros(2), np.zeros(2), 1.0, x)
                value_range()(x)
                for unit in (np.zeros(2), np.zeros(0)):
                    reply_moments()(x, x, unit, 1.0)
                moved_squares()(x, x, np.zeros(2), 0, 1.0, 0.0)
                for unit in (np.zeros(2), np.zeros(0)):
                    rebase_moved()(x, x, unit, 0, 1.0, 0.0, 1.0, np.zeros(2, dtype))
                if projection:
                    rebase()(x, np.zeros(2), np.zeros(2, dtype))
            if projection:
                remove_along()(np.zeros(2), np.zeros(2), 1.0)
        except Exception as err:  # noqa: BLE001 - only a head start: the call itself raises
            log.debug("kernels not warmed: %s", err)

    thread = threading.Thread(target=build, name="kernels-warm", daemon=True)
    thread.start()
    return thread


def per_array(weight: float | list[float], arrays: int) -> list[float]:
    """A reply's weight for each of its ``arrays`` (one number: the same for each)."""
    if isinstance(weight, list):
        if len(weight) != arrays:
            raise ValueError(f"{len(weight)} weights for {arrays} tensors")
        return [float(w) for w in weight]
    return [float(weight)] * arrays
