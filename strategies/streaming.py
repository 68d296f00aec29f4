"""Streamed aggregation: each fit reply is checked, bounded and folded into the
round's running sum as it arrives, and its arrays are dropped, so a round holds one
sum and a handful of replies whatever its size (Flower's legacy round loop holds
every reply until the round ends, then hands ``aggregate_fit`` the list).

The hook is ours, not a patch of Flower: ``configure_fit`` hands Flower each sampled
client wrapped in a ``FoldingProxy`` whose ``fit`` folds the reply on the thread that
received it and returns it emptied of its arrays.

The bounds (strategies/robust.py) take their references from a bounded reservoir of
the round's own replies: the ``RESERVOIR`` sampled nodes whose hash of round and node
id is smallest, sent their instructions first. Replies that arrive before every
reservoir node has returned wait (a few, as those nodes go first); then the
references are fixed from the reservoir's accepted replies and every reply is judged
by them alone, so the round's outcome does not depend on the order replies arrive in:
- ``weight-cap``: at most c x the lower median of the reservoir's counts;
- ``update-norm-bound``: at most r x the lower median of the reservoir's update norms
  and those accepted in the last ``norm-history-rounds`` rounds;
- the direction check (from ``direction-check-from`` reservoir replies): the cosine
  with the coordinate-wise median of the reservoir's (clipped) updates; a projected
  update is clipped to their lower median norm.
With up to ``RESERVOIR`` clients a round the reservoir is the whole round: exactly the
held round's references. If no reservoir reply is accepted, the round's replies wait
for its end and are judged as a held round judges them.

The sum is kept in double-double (TwoSum, error-free in each addition), so the mean
is the same to the last bit in any order but for ties far below float64's rounding;
the held path sums the same way, so a streamed and a held round agree.

A round is held when a rule needs every reply at once: SecAgg+, central DP, a method
whose aggregation is its own (Factorized-FL, FedFac), median or trimmed mean, or
``streamed-aggregation = false``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import FitIns, FitRes, Parameters
from flwr.common.typing import Code
from flwr.server.client_proxy import ClientProxy

from strategies.outcome import NodeProxy
from strategies.privacy import secure_decoder
from strategies.replies import ClientKeys, Reply, accept_fit_replies
from strategies.robust import (
    Bounds,
    RunningMean,
    column_median,
    compared,
    count_limit,
    decoded_references,
    lower_median,
    update_vector,
    with_update,
)

NDArrays = list[np.ndarray]
log = logging.getLogger("flwr.pflower")

RESERVOIR = 8  # replies a streamed round takes its references from


def _rank(server_round: int, node_id: int) -> int:
    """A node's place in a round's reservoir order: fixed by round and node id alone."""
    digest = hashlib.blake2b(f"{server_round}:{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def reservoir_nodes(server_round: int, node_ids: list[int], size: int = RESERVOIR) -> set[int]:
    """The ``size`` sampled nodes whose replies fix a streamed round's references."""
    return set(sorted(node_ids, key=lambda n: _rank(server_round, n))[:size])


def update_of(upload: NDArrays, reference: NDArrays) -> np.ndarray:
    """``upload - reference`` over the float tensors of the reference's shape (float64)."""
    return update_vector(upload, reference, compared([upload], [reference]))


@dataclass
class Limits:
    """A streamed round's references, fixed before any reply is judged."""

    count: int | None = None  # the most a reply weighs (None: no cap)
    norm: float | None = None  # the longest update kept as it came (None: no bound)
    centre: np.ndarray | None = None  # unit median update (None: no direction check)
    typical: float = 0.0  # what a projected update is clipped to

    @classmethod
    def of(
        cls,
        replies: list[Reply],
        references: list[NDArrays],
        bounds: Bounds,
        history: list[float],
        direction: np.ndarray | None = None,
    ) -> Limits:
        """The held round's rules (strategies/robust.py) taken over ``replies``; the
        direction check's centre is ``direction`` (the last streamed round's unit
        update, far less noisy) where there is one, else the replies' median update."""
        out = cls()
        if bounds.weight_cap > 0:
            out.count = count_limit([r.num_examples for r in replies], bounds.weight_cap)
        updates = [update_of(r.arrays, ref) for r, ref in zip(replies, references)]
        norms = [float(np.linalg.norm(u)) for u in updates]
        if bounds.norm_bound > 0:
            out.norm = bounds.norm_bound * lower_median(norms + history)
        if bounds.direction_from and len(replies) >= bounds.direction_from:
            if out.norm is not None:  # the median of the updates as the norm bound leaves them
                updates = [
                    u * min(1.0, out.norm / n) if n > 0 else u for u, n in zip(updates, norms)
                ]
            if direction is not None:
                out.centre = direction
            else:
                centre = column_median(np.stack(updates))
                scale = float(np.linalg.norm(centre))
                out.centre = centre / scale if scale > 0 else None
            out.typical = lower_median([float(np.linalg.norm(u)) for u in updates])
        return out


class StreamedRound:
    """One streamed round: its reservoir, its references once fixed, its running sum."""

    def __init__(
        self,
        server_round: int,
        members: set[int],
        bounds: Bounds,
        history: list[float],
        weighted: bool,
        decode: Callable[[NDArrays], NDArrays],
        check: Callable[[str, NDArrays, int], str | None],
        keys: ClientKeys,
        reference_of: Callable[[str], NDArrays],
        direction: np.ndarray | None = None,
    ) -> None:
        self.round, self.bounds, self.history = server_round, bounds, history
        self.weighted = weighted
        self.direction = direction  # the last streamed round's unit update, if any
        self.decode, self.check, self.keys, self.reference_of = decode, check, keys, reference_of
        self.members, self.waiting = set(members), set(members)
        # no bound: nothing to wait for
        self.limits: Limits | None = None if members else Limits()
        self.pending: list[Reply] = []  # accepted, waiting for the references
        self.sample: list[Reply] = []  # the reservoir's accepted replies
        self.sum = RunningMean()
        self.kept: list[Reply] = []  # each accepted reply, its arrays dropped
        self.rejected: list[str] = []
        self.norms: list[float] = []
        self.extra: dict[str, Any] = {"aggregation_streamed": True}
        self.bytes_up = 0
        self.most_waiting = 0  # the most replies held at once
        self.lock = threading.Lock()
        self.closed = False

    def fold(self, proxy: ClientProxy, res: FitRes) -> None:
        """Check one reply; judge and add it, or hold it until the references are fixed."""
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
                if self.limits is not None:
                    self._add(reply)
                    continue
                self.pending.append(reply)
                self.most_waiting = max(self.most_waiting, len(self.pending))
                if proxy.node_id in self.members:
                    self.sample.append(reply)
            self._returned(proxy.node_id)

    def returned(self, node_id: int) -> None:
        """A node's fit ended without a reply to fold (a failure, a timeout)."""
        with self.lock:
            self._returned(node_id)

    def _returned(self, node_id: int) -> None:
        self.waiting.discard(node_id)
        if self.limits is None and not self.waiting and self.sample:
            self._fix(self.sample)

    def _fix(self, replies: list[Reply]) -> None:
        """Fix the references from ``replies`` and judge every reply waiting for them."""
        references = [self.reference_of(r.client_key) for r in replies]
        self.limits = Limits.of(replies, references, self.bounds, self.history, self.direction)
        if self.limits.norm is not None:
            self.extra.update(update_norm_limit=self.limits.norm, updates_clipped=0)
        if self.limits.centre is not None:
            self.extra["against_the_round"] = 0
        pending, self.pending, self.sample = self.pending, [], []
        for reply in sorted(pending, key=lambda r: r.client_key):
            self._add(reply)

    def _add(self, reply: Reply) -> None:
        reported = reply.num_examples  # what the round's record keeps
        reason = self._bound(reply)
        if reason is not None:
            log.warning("round %d: rejected reply from %s", self.round, reason)
            self.rejected.append(reason)
            return
        weight = float(reply.num_examples) if self.weighted else 1.0
        self.sum.add(reply.arrays, weight)
        reply.arrays, reply.num_examples = [], reported
        self.kept.append(reply)

    def _bound(self, reply: Reply) -> str | None:
        """The reply with its weight capped and its update bounded, or why it is rejected."""
        limits = self.limits
        assert limits is not None
        if limits.count is not None and reply.num_examples > limits.count:
            self.extra["weights_capped"] = self.extra.get("weights_capped", 0) + 1
            reply.num_examples = limits.count
        reference = self.reference_of(reply.client_key)
        tensors = compared([reply.arrays], [reference])
        update = update_vector(reply.arrays, reference, tensors)
        norm, moved = float(np.linalg.norm(update)), False
        if limits.norm is not None and norm > limits.norm:
            if self.bounds.action == "reject":
                return (
                    f"{reply.client_key}: update norm above update-norm-bound x the "
                    f"lower median ({limits.norm:.3g})"
                )
            update *= limits.norm / norm
            norm, moved = limits.norm, True
            self.extra["updates_clipped"] += 1
        centre = limits.centre
        if centre is not None and update.size == centre.size and norm > 0:
            cosine = float(update @ centre) / norm
            if cosine < self.bounds.min_cosine:
                self.extra["against_the_round"] += 1
                if self.bounds.direction_action == "reject":
                    return (
                        f"{reply.client_key}: update points against the round (cosine "
                        f"{cosine:.2f} with the median update, below direction-min-cosine "
                        f"{self.bounds.min_cosine:g})"
                    )
                update -= float(update @ centre) * centre  # what it adds across the round
                length = float(np.linalg.norm(update))
                if length > limits.typical:
                    update *= limits.typical / length
                norm, moved = float(np.linalg.norm(update)), True
        if moved:
            reply.arrays = with_update(reply.arrays, reference, tensors, update)
        self.norms.append(norm)
        return None

    def close(self) -> None:
        """No more replies: judge any still waiting (held rules, if the reservoir gave none)."""
        with self.lock:
            self.closed = True
            if self.limits is None and self.pending:
                self._fix(self.pending)
            self.kept.sort(key=lambda r: r.client_key)
            self.rejected.sort()
            self.extra["replies_held_at_once"] = self.most_waiting


class FoldingProxy(NodeProxy):
    """A sampled client whose fit reply is folded into the round as it arrives."""

    def __init__(self, inner: ClientProxy, streamed: StreamedRound) -> None:
        super().__init__(inner)
        self.streamed = streamed

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        try:
            res = super().fit(ins, timeout, group_id)
        except BaseException:
            self.streamed.returned(self.node_id)  # the reservoir waits for it no more
            raise
        if res.status.code != Code.OK:
            self.streamed.returned(self.node_id)
            return res
        try:
            self.streamed.fold(self.inner, res)
        except Exception:  # a bug of ours: logged, the reply counts as a failure
            log.exception("node %d: its reply could not be folded", self.node_id)
            self.streamed.returned(self.node_id)
            raise
        return res


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
        and strategy.aggregation in ("mean", "weighted")
    )


def open_round(strategy: Any, server_round: int, node_ids: list[int]) -> StreamedRound | None:
    """A streamed round over the sampled ``node_ids``, or None (held)."""
    cfg = strategy.cfg
    if not streams(strategy):
        return None
    bounded = cfg.weight_cap > 0 or cfg.update_norm_bound > 0 or cfg.direction_check_from > 0
    return StreamedRound(
        server_round,
        reservoir_nodes(server_round, node_ids, cfg.stream_reservoir) if bounded else set(),
        Bounds.of(cfg, True),
        strategy.norm_history.values(),
        strategy.aggregation == "weighted",
        secure_decoder(server_round, cfg, strategy.spec, {}),
        strategy.check_reply,
        strategy.clients,
        decoded_references(
            lambda key: strategy.payload_for(key, server_round), strategy.wire.upload_reference
        ),
        strategy.norm_history.direction,
    )


def folding(
    streamed: StreamedRound | None, sent: list[tuple[ClientProxy, Any, Any]]
) -> list[tuple[ClientProxy, Any, Any]]:
    """A round's instructions, each client wrapped so its failures name its node; a
    streamed round's reservoir nodes first, each client a ``FoldingProxy``."""
    if streamed is None:
        return [(NodeProxy(proxy), *rest) for proxy, *rest in sent]
    first = sorted(sent, key=lambda item: item[0].node_id not in streamed.members)
    return [(FoldingProxy(proxy, streamed), *rest) for proxy, *rest in first]


def finish_round(strategy: Any, streamed: StreamedRound) -> None:
    """The round's mean becomes the global state; its update norms join the history,
    its direction the next round's direction reference."""
    before = strategy.global_arrays
    strategy.set_global(streamed.sum.mean())
    change = update_of(strategy.global_arrays, before)
    length = float(np.linalg.norm(change))
    strategy.norm_history.direction = change / length if length > 0 else None
    strategy.norm_history.add(streamed.norms)
