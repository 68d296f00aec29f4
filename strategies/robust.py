"""Bounds on what one client can do to the aggregate, before any method aggregates.

- ``weight-cap`` c: a reply's weight (its reported sample count) is at most c times
  the round's median reported count, so a client that claims 1e15 examples weighs
  at most c times a typical client (0: off).
- ``update-norm-bound`` r: a reply's update (upload minus what the server sent it,
  over the float tensors of the same shape) may be at most r times the round's
  median update norm; a longer one is clipped to it, or rejected with
  ``update-norm-action=reject`` (0: off).
- ``aggregation=median`` / ``trimmed-mean``: coordinate-wise robust rules (Flower's
  ``aggregate_median`` and ``aggregate_trimmed_avg``) in place of the mean.

Medians are taken over the round's replies, so a minority of clients cannot move
them far. After clipping, every update is at most r times the median norm, so any
weighted mean of them moves the global model by at most that much.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import Parameters, parameters_to_ndarrays
from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

NDArrays = list[np.ndarray]
log = logging.getLogger("flwr.pflower")


def capped_counts(counts: list[int], cap: float) -> list[int]:
    """Each count at most ``cap`` x the median count (``cap`` 0: unchanged)."""
    if cap <= 0 or not counts:
        return list(counts)
    limit = max(1, int(cap * float(np.median(counts))))
    return [min(n, limit) for n in counts]


def update_norm(upload: NDArrays, reference: NDArrays) -> float:
    """L2 norm of ``upload - reference`` over the float tensors whose shapes match."""
    total = 0.0
    for u, r in zip(upload, reference):
        if u.dtype.kind == "f" and u.shape == r.shape:
            total += float(np.sum((u.astype(np.float64) - r) ** 2))
    return float(np.sqrt(total))


def clip_to(upload: NDArrays, reference: NDArrays, norm: float, bound: float) -> NDArrays:
    """``upload`` with its update scaled down to norm ``bound`` (a new list)."""
    scale = bound / norm
    out = []
    for u, r in zip(upload, reference):
        if u.dtype.kind == "f" and u.shape == r.shape:
            u = (r + scale * (u.astype(np.float64) - r)).astype(u.dtype)
        out.append(u)
    return out + upload[len(out) :]


@dataclass
class NormCheck:
    """The round's update norms and what the bound did with each reply."""

    limit: float | None = None  # r x median norm; None when off
    clipped: int = 0
    rejected: list[int] | None = None  # indices of rejected replies


def bound_updates(
    uploads: list[NDArrays], references: list[NDArrays], ratio: float, action: str
) -> tuple[list[NDArrays], NormCheck]:
    """Clip (or reject) every update longer than ``ratio`` x the median update norm."""
    check = NormCheck(rejected=[])
    if ratio <= 0 or not uploads:
        return uploads, check
    norms = [update_norm(u, r) for u, r in zip(uploads, references)]
    check.limit = ratio * float(np.median(norms))
    out = []
    for i, (u, r, n) in enumerate(zip(uploads, references, norms)):
        if n > check.limit and n > 0:
            if action == "reject":
                check.rejected.append(i)  # type: ignore[union-attr]
            else:
                u = clip_to(u, r, n, check.limit)
                check.clipped += 1
        out.append(u)
    return out, check


def robust_mean(uploads: list[NDArrays], rule: str, trim: float) -> NDArrays:
    """The coordinate-wise median or trimmed mean, cast back to each tensor's dtype."""
    results = [(u, 1) for u in uploads]
    if rule == "median":
        merged = aggregate_median(results)
    elif rule == "trimmed-mean":
        merged = aggregate_trimmed_avg(results, trim)
    else:
        raise ValueError(f"unknown robust rule {rule!r}")
    out = []
    for m, first in zip(merged, uploads[0]):
        m = np.asarray(m)
        out.append((np.rint(m) if first.dtype.kind in "iu" else m).astype(first.dtype))
    return out


def bound_replies(
    replies: list[Any],
    reference_of: Callable[[str], Parameters],
    weight_cap: float,
    norm_bound: float,
    action: str,
    extra: dict[str, Any],
) -> tuple[list[Any], list[str]]:
    """The replies (``Reply``: arrays, num_examples, client_key) with their weights
    capped and their updates bounded against the payload each was sent
    (``reference_of(client key)``, each distinct payload decoded once, not per
    reply); returns (the replies kept, the rejection reasons). The round's counts
    go into ``extra``."""
    for r, n in zip(replies, capped_counts([r.num_examples for r in replies], weight_cap)):
        if n < r.num_examples:
            extra["weights_capped"] = extra.get("weights_capped", 0) + 1
            r.num_examples = n
    decoded: dict[int, NDArrays] = {}
    references = []
    for r in replies:
        payload = reference_of(r.client_key)
        if id(payload) not in decoded:
            decoded[id(payload)] = parameters_to_ndarrays(payload)
        references.append(decoded[id(payload)])
    uploads, check = bound_updates([r.arrays for r in replies], references, norm_bound, action)
    for r, u in zip(replies, uploads):
        r.arrays = u
    if check.limit is not None:
        extra.update(update_norm_limit=check.limit, updates_clipped=check.clipped)
    rejected = set(check.rejected or [])
    reasons = [
        f"{replies[i].client_key}: update norm above update-norm-bound x the median "
        f"({check.limit:.3g})"
        for i in sorted(rejected)
    ]
    return [r for i, r in enumerate(replies) if i not in rejected], reasons


def bound_round(
    server_round: int,
    replies: list[Any],
    reference_of: Callable[[str], Parameters],
    cfg: Any,
    extra: dict[str, Any],
    rejected: list[str],
) -> list[Any]:
    """``bound_replies`` with the run config's bounds (``weight-cap``,
    ``update-norm-bound``, ``update-norm-action``); each rejection is logged and
    added to ``rejected``."""
    kept, reasons = bound_replies(
        replies,
        reference_of,
        cfg.weight_cap,
        cfg.update_norm_bound,
        cfg.update_norm_action,
        extra,
    )
    for reason in reasons:
        log.warning("round %d: rejected reply from %s", server_round, reason)
    rejected += reasons
    if not kept:
        log.error("round %d: every reply was rejected: the global state is kept", server_round)
    return kept


def weighted_mean(arrays: list[NDArrays], weights: list[float]) -> NDArrays:
    """Per-tensor weighted mean, in float64, cast back to each tensor's dtype."""
    total = float(sum(weights))
    out = []
    for tensors in zip(*arrays, strict=True):
        acc = sum(w * t.astype(np.float64) for w, t in zip(weights, tensors)) / total
        out.append(acc.astype(tensors[0].dtype))
    return out


def mean_by_rule(replies: list[Any], rule: str, trim: float) -> NDArrays:
    """The replies' arrays combined by ``rule``: weighted (by sample count), mean
    (equal weights), median or trimmed-mean."""
    arrays = [r.arrays for r in replies]
    if rule in ("median", "trimmed-mean"):
        return robust_mean(arrays, rule, trim)
    return weighted_mean(arrays, [1.0 if rule == "mean" else r.num_examples for r in replies])
