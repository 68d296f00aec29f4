"""Streamed aggregation: each fit reply is checked, bounded and folded into the
round's running sum as it arrives, and its arrays are dropped, so a round holds one
sum whatever its number of replies (Flower's legacy round loop holds every reply
until the round ends, then hands ``aggregate_fit`` the list).

The hook is ours, not a patch of Flower: ``configure_fit`` hands Flower each sampled
client wrapped in a ``FoldingProxy`` whose ``fit`` folds the reply on the thread that
received it and returns it emptied of its arrays.

A streamed round judges each reply against what was fixed when the round began, so
its outcome does not depend on the order replies arrive in:
- ``weight-cap``: at most c x the lower median of the counts accepted in the last
  ``norm-history-rounds`` rounds (a held round uses its own counts);
- ``update-norm-bound``: at most r x the lower median of the update norms accepted in
  those rounds (a held round adds its own);
- the direction check: the cosine with the coordinate-wise median of a bounded
  reservoir of the previous round's updates (the ``RESERVOIR`` kept updates whose
  hash of round and client key is smallest: the same set in any arrival order), where
  a held round uses the median of all of its own updates.

The sum is kept in double-double (TwoSum, error-free in each addition), so the mean
is the same to the last bit in any order but for ties far below float64's rounding;
the held path sums the same way, so a streamed and a held round agree.

A round is held (the replies kept until it ends) when a rule needs every reply at
once: the first round (no history for the bounds yet), SecAgg+, central DP, a
method whose aggregation is its own (Factorized-FL, FedFac), median or trimmed mean,
or ``streamed-aggregation = false``.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.common import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    ReconnectIns,
    parameters_to_ndarrays,
)
from flwr.common.typing import Code
from flwr.server.client_proxy import ClientProxy

from strategies.privacy import secure_decoder
from strategies.replies import ClientKeys, Reply, accept_fit_replies
from strategies.robust import Bounds, NormHistory, RunningMean, lower_median, update_norm

NDArrays = list[np.ndarray]
log = logging.getLogger("flwr.pflower")

RESERVOIR = 8  # updates kept for the next round's direction reference (float32 each)


def _rank(server_round: int, client_key: str) -> int:
    """A reply's place in the reservoir's order: fixed by round and key alone."""
    digest = hashlib.blake2b(f"{server_round}:{client_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _update(upload: NDArrays, reference: NDArrays) -> np.ndarray:
    """``upload - reference`` over the float tensors of the reference's shape (float32)."""
    parts = [
        np.subtract(u, r, dtype=np.float32).ravel()
        for u, r in zip(upload, reference)
        if u.dtype.kind == "f" and u.shape == r.shape
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


class Reservoir:
    """The ``size`` updates of a round whose ranks are smallest (a max-heap on rank)."""

    def __init__(self, server_round: int, size: int = RESERVOIR) -> None:
        self.round, self.size = server_round, size
        self.heap: list[tuple[int, str, np.ndarray]] = []

    def wants(self, client_key: str) -> bool:
        return len(self.heap) < self.size or -self.heap[0][0] > _rank(self.round, client_key)

    def offer(self, client_key: str, update: np.ndarray) -> None:
        item = (-_rank(self.round, client_key), client_key, update)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        elif item[0] > self.heap[0][0]:
            heapq.heapreplace(self.heap, item)

    def median(self) -> np.ndarray | None:
        if not self.heap:
            return None
        rows = sorted(self.heap, key=lambda item: item[1])  # one order for the median
        block = np.sort(np.stack([u for _, _, u in rows]).astype(np.float64), axis=0)
        n = block.shape[0]
        return (block[(n - 1) // 2] + block[n // 2]) / 2


class History:
    """What a streamed round's bounds are fixed from: earlier rounds' accepted counts
    and update norms, and the direction of the previous round's updates."""

    def __init__(self, rounds: int, norms: NormHistory) -> None:
        self.counts: deque[list[int]] = deque(maxlen=max(rounds, 1))
        self.keep = rounds > 0
        self.norms = norms
        self.centre: np.ndarray | None = None  # unit median update of the last round
        self.centre_from = 0  # replies the last round kept

    def ready(self) -> bool:
        return self.keep and bool(self.counts) and bool(self.norms.values())

    def end_round(self, counts: list[int], reservoir: Reservoir | None, kept: int) -> None:
        if self.keep and counts:
            self.counts.append(counts)
        centre = reservoir.median() if reservoir is not None else None
        scale = float(np.linalg.norm(centre)) if centre is not None else 0.0
        self.centre = centre / scale if scale > 0 else None
        self.centre_from = kept

    def reservoir_of_held(
        self,
        server_round: int,
        replies: list[Reply],
        reference_of: Callable[[str], NDArrays],
    ) -> Reservoir:
        """A held round's reservoir, from its kept replies."""
        reservoir = Reservoir(server_round)
        for r in replies:
            if reservoir.wants(r.client_key):
                reservoir.offer(r.client_key, _update(r.arrays, reference_of(r.client_key)))
        return reservoir


class StreamedRound:
    """One streamed round: its bounds, fixed at its start, and its running sum."""

    def __init__(
        self,
        server_round: int,
        bounds: Bounds,
        history: History,
        weighted: bool,
        decode: Callable[[NDArrays], NDArrays],
        check: Callable[[str, NDArrays, int], str | None],
        keys: ClientKeys,
        reference_of: Callable[[str], NDArrays],
    ) -> None:
        self.round, self.bounds, self.weighted = server_round, bounds, weighted
        self.decode, self.check, self.keys, self.reference_of = decode, check, keys, reference_of
        counts = [n for c in history.counts for n in c]
        norms = history.norms.values()
        self.count_limit = (
            max(1, int(bounds.weight_cap * lower_median(counts)))
            if bounds.weight_cap > 0 and counts
            else None
        )
        self.norm_limit = bounds.norm_bound * lower_median(norms) if bounds.norm_bound > 0 else None
        self.typical = lower_median(norms) if norms else 0.0
        on = bounds.direction_from and history.centre_from >= bounds.direction_from
        self.centre = history.centre if on else None
        self.sum = RunningMean()
        self.kept: list[Reply] = []  # each accepted reply, its arrays dropped
        self.rejected: list[str] = []
        self.norms: list[float] = []
        self.counts: list[int] = []
        self.extra: dict[str, Any] = {"aggregation_streamed": True}
        self.bytes_up = 0
        self.reservoir = Reservoir(server_round)
        self.lock = threading.Lock()
        self.closed = False

    def fold(self, proxy: ClientProxy, res: FitRes) -> None:
        """Check, bound and add one reply; its arrays are dropped either way."""
        with self.lock:
            if self.closed:  # Flower's loop waits for every client: not expected
                log.warning("round %d: a reply after the round closed, dropped", self.round)
                res.parameters = Parameters(tensors=[], tensor_type=res.parameters.tensor_type)
                return
            accepted, rejected, received = accept_fit_replies(
                self.round, [(proxy, res)], self.decode, self.check, self.keys
            )
            self.bytes_up += received
            self.rejected += rejected
            for reply in accepted:
                reason = self._bound(reply)
                if reason is not None:
                    log.warning("round %d: rejected reply from %s", self.round, reason)
                    self.rejected.append(reason)
                    continue
                self.sum.add(reply.arrays, float(reply.num_examples) if self.weighted else 1.0)
                reply.arrays, reply.num_examples = [], self.counts[-1]  # as reported
                self.kept.append(reply)

    def _bound(self, reply: Reply) -> str | None:
        """The reply with its weight capped and its update bounded, or why it is rejected."""
        self.counts.append(reply.num_examples)
        if self.count_limit is not None and reply.num_examples > self.count_limit:
            reply.num_examples = self.count_limit
            self.extra["weights_capped"] = self.extra.get("weights_capped", 0) + 1
        reference = self.reference_of(reply.client_key)
        norm = update_norm(reply.arrays, reference)
        if self.norm_limit is not None:
            self.extra["update_norm_limit"] = self.norm_limit
            self.extra.setdefault("updates_clipped", 0)
            if norm > self.norm_limit and norm > 0:
                if self.bounds.action == "reject":
                    return (
                        f"{reply.client_key}: update norm above update-norm-bound x the "
                        f"lower median of earlier rounds ({self.norm_limit:.3g})"
                    )
                reply.arrays = _scaled(reply.arrays, reference, self.norm_limit / norm)
                norm = self.norm_limit
                self.extra["updates_clipped"] += 1
        update = _update(reply.arrays, reference)
        if self.centre is not None and update.size == self.centre.size:
            self.extra.setdefault("against_the_round", 0)
            length = float(np.linalg.norm(update))
            cosine = float(update @ self.centre.astype(np.float32)) / length if length else 1.0
            if cosine < self.bounds.min_cosine:
                self.extra["against_the_round"] += 1
                if self.bounds.direction_action == "reject":
                    return (
                        f"{reply.client_key}: update points against the round (cosine "
                        f"{cosine:.2f} with the previous round's median update, below "
                        f"direction-min-cosine {self.bounds.min_cosine:g})"
                    )
                d = update.astype(np.float64)
                across = d - float(d @ self.centre) * self.centre
                length = float(np.linalg.norm(across))
                if length > self.typical > 0:
                    across *= self.typical / length
                reply.arrays = _with_update(reply.arrays, reference, across)
                update = across.astype(np.float32)
                norm = float(np.linalg.norm(across))
        self.norms.append(norm)
        if self.reservoir.wants(reply.client_key):
            self.reservoir.offer(reply.client_key, update)
        return None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.kept.sort(key=lambda r: r.client_key)
            self.rejected.sort()


def _scaled(upload: NDArrays, reference: NDArrays, scale: float) -> NDArrays:
    """``upload`` with its update (float tensors of the reference's shape) scaled."""
    return [
        (r + scale * (u.astype(np.float64) - r)).astype(u.dtype)
        if u.dtype.kind == "f" and u.shape == r.shape
        else u
        for u, r in zip(upload, reference)
    ] + upload[len(reference) :]


def _with_update(upload: NDArrays, reference: NDArrays, vector: np.ndarray) -> NDArrays:
    """``upload`` whose float tensors of the reference's shape are ``reference + vector``."""
    out, start = list(upload), 0
    for t, (u, r) in enumerate(zip(upload, reference)):
        if u.dtype.kind == "f" and u.shape == r.shape:
            out[t] = (r + vector[start : start + u.size].reshape(u.shape)).astype(u.dtype)
            start += u.size
    return out


def references(
    payload_for: Callable[[str], Parameters], align: Callable[[NDArrays], NDArrays]
) -> Callable[[str], NDArrays]:
    """Each client's decoded payload (what its update is measured against), each
    distinct payload decoded once."""
    decoded: dict[int, tuple[Parameters, NDArrays]] = {}
    lock = threading.Lock()

    def of(client_key: str) -> NDArrays:
        payload = payload_for(client_key)
        with lock:
            if id(payload) not in decoded:  # the payload is kept: its id stays its own
                decoded[id(payload)] = (payload, align(parameters_to_ndarrays(payload)))
            return decoded[id(payload)][1]

    return of


class FoldingProxy(ClientProxy):
    """A sampled client whose fit reply is folded into the round as it arrives."""

    def __init__(self, inner: ClientProxy, fold: Callable[[ClientProxy, FitRes], None]) -> None:
        super().__init__(inner.cid)
        self.inner, self.fold = inner, fold
        self.node_id = inner.node_id
        self.properties = inner.properties

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        res = self.inner.fit(ins, timeout, group_id)
        if res.status.code == Code.OK:
            try:
                self.fold(self.inner, res)
            except Exception:  # a bug of ours must not take the round's other replies
                log.exception("node %d: its reply could not be folded", self.node_id)
                raise
        return res

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        return self.inner.evaluate(ins, timeout, group_id)

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        return self.inner.get_properties(ins, timeout, group_id)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        return self.inner.get_parameters(ins, timeout, group_id)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        return self.inner.reconnect(ins, timeout, group_id)


# ---- the strategy's side (strategies/base.py calls these) ---------------------------------


def streams(strategy: Any) -> bool:
    """Whether a run's rounds can be folded reply by reply: a mean of the replies,
    each judged by rules fixed before the round."""
    cfg = strategy.cfg
    return bool(
        cfg.streamed_aggregation
        and not cfg.secure_aggregation
        and not strategy.dp.on
        and not strategy.own_aggregation
        and type(strategy).aggregate is _base_aggregate(strategy)
        and strategy.aggregation in ("mean", "weighted")
    )


def _base_aggregate(strategy: Any) -> Any:
    """``PFLStrategy.aggregate`` (a method that overrides it aggregates its own way)."""
    return next(c for c in type(strategy).__mro__ if c.__name__ == "PFLStrategy").aggregate


def open_round(strategy: Any, server_round: int) -> StreamedRound | None:
    """A streamed round, or None (held) where a bound still needs the round's own replies."""
    cfg = strategy.cfg
    bounded = cfg.weight_cap > 0 or cfg.update_norm_bound > 0 or cfg.direction_check_from > 0
    if not streams(strategy) or (bounded and not strategy.history.ready()):
        return None
    return StreamedRound(
        server_round,
        Bounds.of(cfg, True),
        strategy.history,
        strategy.aggregation == "weighted",
        secure_decoder(server_round, cfg, strategy.spec, {}),
        strategy.check_reply,
        strategy.clients,
        _references_of(strategy, server_round),
    )


def folding(streamed: StreamedRound | None) -> Callable[[ClientProxy], ClientProxy]:
    """What wraps each sampled client: a ``FoldingProxy`` in a streamed round."""
    if streamed is None:
        return lambda proxy: proxy
    return lambda proxy: FoldingProxy(proxy, streamed.fold)


def finish_round(strategy: Any, streamed: StreamedRound) -> None:
    """The round's mean becomes the global state; its counts and norms the history."""
    strategy.set_global(streamed.sum.mean())
    strategy.norm_history.add(streamed.norms)
    strategy.history.end_round(streamed.counts, streamed.reservoir, len(streamed.kept))


def note_held_round(strategy: Any, server_round: int, kept: list[Reply], counts: list[int]) -> None:
    """What the next (streamed) round's bounds are fixed from, after a held round."""
    if streams(strategy):
        of = _references_of(strategy, server_round)
        reservoir = strategy.history.reservoir_of_held(server_round, kept, of)
        strategy.history.end_round(counts, reservoir, len(kept))


def _references_of(strategy: Any, server_round: int) -> Callable[[str], NDArrays]:
    return references(
        lambda key: strategy.payload_for(key, server_round), strategy.wire.upload_reference
    )
