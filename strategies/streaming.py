"""Streamed aggregation: each fit reply is checked, bounded and folded into the
round's running sum as it arrives, and its arrays are dropped, so a round holds one
sum and a handful of replies whatever its size (Flower's legacy round loop holds
every reply until the round ends, then hands ``aggregate_fit`` the list).

The hook is ours, not a patch of Flower: ``configure_fit`` hands Flower each sampled
client wrapped in a ``FoldingProxy`` whose ``fit`` folds the reply on the thread that
received it and returns it emptied of its arrays.

The bounds (their keys: strategies/robust.py) take their references from a bounded reservoir of
the round's own replies: the ``RESERVOIR`` sampled nodes whose hash of round and node
id (in simulation: the client's number, the same in every engine) is smallest, sent
their instructions first. Replies that arrive before every
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
``streamed-aggregation = false``. A held round's replies are judged by the same rules
here (``bound_held``: every reply is the reservoir, the centre the round's median
update), so the bounds are written once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.common import FitIns, FitRes, Parameters
from flwr.common.typing import Code
from flwr.server.client_proxy import ClientProxy

from pflower.config.schema import RunConfig
from strategies import kernels
from strategies.device_fold import DeviceCopies, DeviceMoments, DeviceRunningMean
from strategies.outcome import NodeProxy
from strategies.replies import ClientKeys, Reply, accept_fit_replies, value_range
from strategies.reply_log import bytes_digest
from strategies.robust import (
    Bounds,
    NormHistory,
    RunningMean,
    column_median,
    compared,
    count_limit,
    lower_median,
    update_of,
)

NDArrays = list[np.ndarray]
log = logging.getLogger("flwr.pflower")

RESERVOIR = 8  # replies a streamed round takes its references from


def _rank(server_round: int, node_id: int) -> int:
    """A node's place in a round's reservoir order: fixed by round and node id alone."""
    digest = hashlib.blake2b(f"{server_round}:{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def reservoir_nodes(
    server_round: int,
    node_ids: list[int],
    size: int = RESERVOIR,
    places: dict[int, int] | None = None,
) -> set[int]:
    """The ``size`` sampled nodes whose replies fix a streamed round's references,
    ranked by their ``places`` (simulation: partition ids, the same in every engine),
    else by node id."""
    places = places or {}
    return set(sorted(node_ids, key=lambda n: _rank(server_round, places.get(n, n)))[:size])


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
        reference_of: Callable[[str], NDArrays],
        bounds: Bounds,
        history: list[float],
        direction: np.ndarray | None = None,
        norms: list[float] | None = None,
    ) -> Limits:
        """The round's references taken over ``replies`` (each measured against
        ``reference_of(its client key)``; their update ``norms`` may be known); the
        direction check's centre is ``direction`` (the last streamed round's unit
        update, far less noisy) where there is one, else the replies' median update."""
        out = cls()
        if bounds.weight_cap > 0:
            out.count = count_limit([r.num_examples for r in replies], bounds.weight_cap)
        if norms is None:
            norms = [float(np.linalg.norm(_update(r, reference_of))) for r in replies]
        if bounds.norm_bound > 0:
            out.norm = bounds.norm_bound * lower_median(norms + history)
        if bounds.direction_from and len(replies) >= bounds.direction_from:
            limit = out.norm
            # the updates as the norm bound leaves them (one it does not clip: as it is)
            factors = [limit / n if limit is not None and n > limit else 1.0 for n in norms]
            if direction is not None:
                out.centre = direction
                # the norm bound leaves a longer update at the limit's length
                kept = [min(n, limit) if limit is not None else n for n in norms]
            else:
                centre = median_update(replies, reference_of, factors)
                scale = float(np.linalg.norm(centre))
                out.centre = centre / scale if scale > 0 else None
                kept = [
                    n if f == 1.0 else float(np.linalg.norm(_update(r, reference_of) * f))
                    for r, n, f in zip(replies, norms, factors)
                ]
            out.typical = lower_median(kept)
        return out


def _update(reply: Reply, reference_of: Callable[[str], NDArrays]) -> np.ndarray:
    return update_of(reply.arrays, reference_of(reply.client_key))


# coordinates x replies of one slice of the median update (float64: x 8 bytes): a round's
# updates are never stacked whole (1,000 float64 updates of cnn4: 7 GB)
MEDIAN_SLICE = 1 << 19


def median_update(
    replies: list[Reply], reference_of: Callable[[str], NDArrays], factors: list[float]
) -> np.ndarray:
    """The coordinate-wise median of the updates, each times its factor (float64), a
    slice of coordinates at a time: a coordinate's median reads that coordinate alone,
    so the slices give the whole stack's bits."""
    references = [reference_of(r.client_key) for r in replies]
    tensors = compared([r.arrays for r in replies], references)
    step = max(1, MEDIAN_SLICE // len(replies))
    parts = []
    for t in tensors:
        flat = [(r.arrays[t].ravel(), ref[t].ravel()) for r, ref in zip(replies, references)]
        out = np.empty(flat[0][0].size)
        for a in range(0, out.size, step):
            block = np.stack(
                [
                    _scaled(np.subtract(u[a : a + step], ref[a : a + step], dtype=np.float64), f)
                    for (u, ref), f in zip(flat, factors)
                ]
            )
            out[a : a + step] = column_median(block)
        parts.append(out)
    return np.concatenate(parts) if parts else np.zeros(0)


def _scaled(vector: np.ndarray, factor: float) -> np.ndarray:
    return vector * factor if factor != 1.0 else vector


class Moments:
    """One reply's update ``d = upload - reference`` over ``tensors``, never written
    out: its squared norm, its dot with a unit ``centre`` and the values of the upload
    that fail the value check (non-finite, or above ``limit`` in magnitude) in one
    compiled pass a tensor (strategies/kernels.py ``reply_moments``), and, for an update
    the bounds move, its new length and its new arrays in one pass each. In float64, as
    ``update_vector``'s vector was; the sums reordered (vectorized: a norm or a dot within
    float64's rounding of numpy's; tests/test_streaming.py measures it)."""

    def __init__(
        self,
        upload: NDArrays,
        reference: NDArrays,
        tensors: list[int],
        centre: np.ndarray | None = None,
        limit: float = math.inf,
    ) -> None:
        self.upload, self.reference, self.tensors = upload, reference, tensors
        self.centre = centre  # what ``dot`` was taken against (None: nothing)
        self.unit = centre if centre is not None else np.zeros(0)
        self.flat = [(_flat(upload[t]), _flat(reference[t])) for t in tensors]
        outside, squares, dot, at = 0, 0.0, 0.0, 0
        moments, none = kernels.reply_moments(), np.zeros(0)
        for u, r in self.flat:
            unit = self.unit[at : at + u.size] if self.unit.size else none
            o, s, d = moments(u, r, unit, limit)
            outside, squares, dot, at = outside + o, squares + s, dot + d, at + u.size
        self.outside = outside  # values that fail the value check (0: none)
        self.norm, self.dot = float(np.sqrt(squares)), dot

    def moved_norm(self, scale: float, dot: float) -> float:
        """The length of ``scale * d - dot * centre``."""
        squares, at = 0.0, 0
        for u, r in self.flat:
            squares += kernels.moved_squares()(u, r, self.unit, at, scale, dot)
            at += u.size
        return float(np.sqrt(squares))

    def rebased(self, scale: float, dot: float, after: float) -> NDArrays:
        """The upload whose compared tensors are ``reference + after * (scale * d - dot *
        centre)``, in their own dtypes (a new list; the others as they came)."""
        out, at = list(self.upload), 0
        unit = self.unit if dot else np.zeros(0)
        for t, (u, r) in zip(self.tensors, self.flat):
            dtype = self.upload[t].dtype
            compiled = dtype in kernels.COMPILED_DTYPES
            into = np.empty(self.upload[t].shape, dtype if compiled else np.float64)
            kernels.rebase_moved()(u, r, unit, at, scale, dot, after, into.reshape(-1))
            out[t] = into if compiled else into.astype(dtype)
            at += u.size
        return out


def _flat(array: np.ndarray) -> np.ndarray:
    """``array`` as one contiguous row of its dtype (compiled kernels take that), a
    compiled dtype's as it is, another's in float64."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat if flat.dtype in kernels.COMPILED_DTYPES else flat.astype(np.float64)


@dataclass
class Verdict:
    """What the bounds made of one reply (worked out outside the round's lock)."""

    reason: str | None  # why it is rejected, or None
    norm: float = 0.0  # its update's norm as kept
    capped: bool = False
    clipped: bool = False
    against: bool = False


class StreamedRound:
    """One streamed round: its reservoir, its references once fixed, its running sum.

    The lock guards the round's lists, counters, key bindings and sum; a reply's checks
    and bounds (one compiled pass over it: its values, its norm and its dot with the
    centre) are worked out outside it, so a worker folding one reply, or fixing the
    references, holds back no other worker's training; the sum is the reply's second
    and last pass."""

    def __init__(
        self,
        server_round: int,
        members: set[int],
        bounds: Bounds,
        history: list[float],
        weigh: Callable[[int], float | list[float]],
        decode: Callable[[NDArrays], NDArrays],
        check: Callable[..., str | None],
        keys: ClientKeys,
        reference_of: Callable[[str], NDArrays],
        direction: np.ndarray | None = None,
        spare: tuple[NDArrays, NDArrays] | None = None,
        device: torch.device | None = None,
        limit: float | None = None,
    ) -> None:
        self.round, self.bounds, self.history = server_round, bounds, history
        self.weigh = weigh  # a reply's sample count -> its weight (one per array, or one)
        self.direction = direction  # the last streamed round's unit update, if any
        self.decode, self.check, self.keys, self.reference_of = decode, check, keys, reference_of
        # max-abs-value: the values are checked in the moments' pass (None: by ``check``)
        self.limit = limit if device is None else None
        self.members, self.waiting = set(members), set(members)
        # no bound: nothing to wait for
        self.limits: Limits | None = None if members else Limits()
        self.fixing = False  # a worker is fixing the references
        self.pending: list[Reply] = []  # accepted, waiting for the references
        self.sample: list[Reply] = []  # the reservoir's accepted replies
        # id of a reply not judged yet -> its update's moments
        self.measured: dict[int, Moments | DeviceMoments] = {}
        self.sum = RunningMean(spare) if device is None else DeviceRunningMean(device)  # GPU
        self.device, self.copies = device, None if device is None else DeviceCopies(device)
        self.kept: list[Reply] = []  # each accepted reply, its arrays dropped
        self.rejected: list[str] = []
        self.norms: list[float] = []
        self.extra: dict[str, Any] = {"aggregation_streamed": True}
        self.bytes_up = 0
        self.most_waiting = 0  # the most replies held at once
        self.lock = threading.Lock()
        self.closed = False
        self.held = False  # judge only: replies kept whole, nothing summed (``bound_held``)
        # reply-log (strategies/reply_log.py): called with each reply as it is added, its
        # weight, node and the digest of its bytes as they arrived (kept here until then)
        self.log: Callable[..., None] | None = None
        self.origins: dict[int, tuple[int, str]] = {}

    def fold(self, proxy: ClientProxy, res: FitRes) -> None:
        """Check one reply; judge and add it, or hold it until the references are fixed."""
        with self.lock:
            if self.closed:  # Flower's loop waits for every client: not expected
                log.warning("round %d: a reply after the round closed, dropped", self.round)
                res.parameters = Parameters(tensors=[], tensor_type=res.parameters.tensor_type)
                return
            # the centre a judged reply's dot is taken with (before the references are
            # fixed: the last round's direction, which they take where there is one)
            centre = self.limits.centre if self.limits is not None else self.direction
        # read-only views on the reply's bytes: nothing here writes a reply's arrays
        # (a moved update gets new ones, with_update), and the sum only reads them. The
        # reply is measured on this worker, outside the lock: its values with its moments
        # in one pass where the host folds (``Moments``), else after the check
        arrived = bytes_digest(res.parameters.tensors) if self.log is not None else ""
        taken: dict[int, Moments | DeviceMoments] = {}
        check = self.check if self.limit is None else self._measuring_check(centre, taken)
        accepted, rejected, received = accept_fit_replies(
            self.round, [(proxy, res)], self.decode, check, LockedKeys(self.keys, self.lock),
            views=True,
        )  # fmt: skip
        measured = {id(r): taken.get(id(r.arrays)) or self._measure(r, centre) for r in accepted}
        with self.lock:
            self.origins.update({id(r): (proxy.node_id, arrived) for r in accepted})
            self.bytes_up += received
            self.rejected += rejected
            self.measured.update(measured)
            ready = accepted if self.limits is not None else []  # fixed: judged now
            if not ready:
                self.pending += accepted
                self.most_waiting = max(self.most_waiting, len(self.pending))
                if proxy.node_id in self.members:
                    self.sample += accepted
            sample = self._returned(proxy.node_id)
        self._judge(ready)
        if sample is not None:
            self._fix(sample)

    def _measuring_check(
        self, centre: np.ndarray | None, taken: dict[int, Moments | DeviceMoments]
    ) -> Callable[[str, NDArrays, int], str | None]:
        """The round's check, its values read in the reply's moments' pass (kept in
        ``taken`` by the arrays' id); a reply whose values fail, or that fails another
        check, gets the whole check's verdict, the same first reason as ever."""

        def check(key: str, arrays: NDArrays, num_examples: int) -> str | None:
            if self.check(key, arrays, num_examples, values=False) is None:
                reference = self.reference_of(key)
                tensors = compared([arrays], [reference])
                measured = moments(self, arrays, reference, tensors, centre, self.limit)
                if not measured.outside and not _outside(arrays, tensors, self.limit):
                    taken[id(arrays)] = measured
                    return None
            return self.check(key, arrays, num_examples)

        return check

    def returned(self, node_id: int) -> None:
        """A node's fit ended without a reply to fold (a failure, a timeout)."""
        with self.lock:
            sample = self._returned(node_id)
        if sample is not None:
            self._fix(sample)

    def _returned(self, node_id: int) -> list[Reply] | None:
        """(Under the lock.) The reservoir's replies once its last node has returned,
        for this worker to fix the references from; else None."""
        self.waiting.discard(node_id)
        if self.limits is None and not self.fixing and not self.waiting and self.sample:
            self.fixing = True
            return list(self.sample)
        return None

    def _fix(self, replies: list[Reply]) -> None:
        """Fix the references from ``replies`` and judge every reply waiting for them."""
        norms = [(self.measured.get(id(r)) or self._measure(r)).norm for r in replies]
        limits = Limits.of(
            replies, self.reference_of, self.bounds, self.history, self.direction, norms=norms
        )
        with self.lock:
            self.limits = limits
            if limits.norm is not None:
                self.extra.update(update_norm_limit=limits.norm, updates_clipped=0)
            if limits.centre is not None:
                self.extra["against_the_round"] = 0
            pending, self.pending, self.sample = self.pending, [], []
        self._judge(sorted(pending, key=lambda r: r.client_key))

    def _measure(self, reply: Reply, centre: np.ndarray | None = None) -> Moments | DeviceMoments:
        """The moments of the reply's update against what it was sent."""
        reference = self.reference_of(reply.client_key)
        return moments(self, reply.arrays, reference, compared([reply.arrays], [reference]), centre)

    def _judge(self, replies: list[Reply]) -> None:
        """Bound each reply, then (under the lock) add it to the sum or reject it."""
        for reply in replies:
            reported = reply.num_examples  # what the round's record keeps
            verdict = bound_reply(self, reply, self.measured.pop(id(reply), None))
            with self.lock:
                for counter, hit in (
                    ("weights_capped", verdict.capped),
                    ("updates_clipped", verdict.clipped),
                    ("against_the_round", verdict.against),
                ):
                    if hit:
                        self.extra[counter] = self.extra.get(counter, 0) + 1
                if verdict.reason is not None:
                    log.warning("round %d: rejected reply from %s", self.round, verdict.reason)
                    self.rejected.append(verdict.reason)
                    continue
                self.kept.append(reply)
                self.norms.append(verdict.norm)
                if self.held:  # kept whole, at its capped weight, for the round's rule
                    continue
                weight = self.weigh(reply.num_examples)
                self.sum.add(reply.arrays, weight)
                if self.log is not None:
                    node, arrived = self.origins.pop(id(reply), (None, ""))
                    self.log(node, reply.client_key, arrived, weight, reply.arrays)
                reply.arrays, reply.num_examples = [], reported

    def close(self) -> None:
        """No more replies: judge any still waiting (held rules, if the reservoir gave none)."""
        with self.lock:
            self.closed = True
            held = self.pending if self.limits is None and self.pending else None
        if held is not None:
            self._fix(held)
        with self.lock:
            self.measured.clear()
            self.kept.sort(key=lambda r: r.client_key)
            self.rejected.sort()
            self.extra["replies_held_at_once"] = self.most_waiting


def open_round(
    server_round: int,
    node_ids: list[int],
    places: dict[int, int] | None,
    cfg: RunConfig,
    dtypes: set[np.dtype],
    *,
    bounds: Bounds,
    weigh: Callable[[int], float | list[float]],
    decode: Callable[[NDArrays], NDArrays],
    check: Callable[..., str | None],
    keys: ClientKeys,
    reference_of: Callable[[str], NDArrays],
    history: NormHistory,
    spare: tuple[NDArrays, NDArrays] | None = None,
    device: torch.device | None = None,
) -> StreamedRound:
    """A round over the sampled ``node_ids`` (``places``: each one's rank key, see
    ``reservoir_nodes``) under ``cfg``'s bounds, its kernels compiled for the
    global arrays' ``dtypes``."""
    bounded = bounds.weight_cap > 0 or bounds.norm_bound > 0 or bounds.direction_from > 0
    kernels.warm(tuple(sorted(dtypes, key=str)), bounds.direction_from > 0)
    return StreamedRound(
        server_round,
        reservoir_nodes(server_round, node_ids, cfg.stream_reservoir, places) if bounded else set(),
        bounds,
        history.values(),
        weigh,
        decode,
        check,
        keys,
        reference_of,
        history.direction,
        spare,
        device,
        cfg.max_abs_value,
    )


def bound_held(
    server_round: int,
    replies: list[Reply],
    bounds: Bounds,
    history: NormHistory,
    reference_of: Callable[[str], NDArrays],
    extra: dict[str, Any],
) -> tuple[list[Reply], list[str]]:
    """A held round's replies judged by a streamed round's rules (the bounds are
    written once, here): every reply is the reservoir, and the direction check's
    centre is the round's median update (a held round keeps no last direction).
    Returns (the replies kept, whole and at their capped weights; the rejection
    reasons); the round's counters go into ``extra``, the kept norms into ``history``."""
    judge = StreamedRound(
        server_round,
        {0},  # a reservoir: the references are fixed from the replies below
        bounds,
        history.values(),
        weigh=lambda count: 1.0,
        decode=lambda arrays: arrays,
        check=lambda *args, **kwargs: None,
        keys=ClientKeys(None),
        reference_of=reference_of,
    )
    judge.held = True
    judge.pending = list(replies)
    judge._fix(list(replies))
    extra.update({k: v for k, v in judge.extra.items() if k != "aggregation_streamed"})
    history.add(judge.norms)
    return judge.kept, judge.rejected


def bound_reply(
    streamed: StreamedRound, reply: Reply, taken: Moments | DeviceMoments | None = None
) -> Verdict:
    """The reply, in ``streamed``'s round, with its weight capped and its update bounded (``taken``: its
    update's moments, if taken already: measured again only for a dot with another
    centre), or why it is rejected."""
    limits = streamed.limits
    assert limits is not None
    capped = limits.count is not None and reply.num_examples > limits.count
    if capped:
        reply.num_examples = limits.count
    if taken is None:
        taken = streamed._measure(reply, limits.centre)
    centre = fitting(limits.centre, reply.arrays, taken.tensors)
    if centre is not None and taken.centre is not centre:  # the centre is the median
        taken = moments(streamed, reply.arrays, taken.reference, taken.tensors, centre)
    norm = taken.norm
    scale, clipped, against = 1.0, False, False
    if limits.norm is not None and norm > limits.norm:
        if streamed.bounds.action == "reject":
            reason = (
                f"{reply.client_key}: update norm above update-norm-bound x the "
                f"lower median ({limits.norm:.3g})"
            )
            return Verdict(reason, capped=capped)
        scale, clipped = limits.norm / norm, True
        norm = limits.norm
    dot, after = 0.0, 1.0
    if centre is not None and norm > 0:
        cosine = scale * taken.dot / norm
        if cosine < streamed.bounds.min_cosine:
            against = True
            if streamed.bounds.direction_action == "reject":
                reason = (
                    f"{reply.client_key}: update points against the round (cosine "
                    f"{cosine:.2f} with the median update, below direction-min-cosine "
                    f"{streamed.bounds.min_cosine:g})"
                )
                return Verdict(reason, capped=capped, clipped=clipped, against=True)
            dot = scale * taken.dot  # what it pushes along the centre goes
            length = taken.moved_norm(scale, dot)  # what it adds across stays
            if length > limits.typical:
                after = limits.typical / length
            norm = after * length
    if clipped or against:
        reply.arrays = taken.rebased(scale, dot if against else 0.0, after)
    return Verdict(None, norm, capped, clipped, against)


def moments(
    streamed: StreamedRound,
    upload: NDArrays,
    reference: NDArrays,
    tensors: list[int],
    centre: np.ndarray | None = None,
    limit: float | None = None,
) -> Moments | DeviceMoments:
    """One reply's ``Moments`` (its dot with ``centre`` where the centre fits its
    layout), on the round's device where it has one."""
    centre = fitting(centre, upload, tensors)
    if streamed.device is None:
        return Moments(upload, reference, tensors, centre, math.inf if limit is None else limit)
    return DeviceMoments(upload, reference, tensors, centre, streamed.device, streamed.copies)


def fitting(centre: np.ndarray | None, upload: NDArrays, tensors: list[int]) -> np.ndarray | None:
    """``centre`` if it is as long as the update over ``tensors``, else None (another
    layout of update than the centre's: no direction check)."""
    if centre is not None and centre.size != sum(upload[t].size for t in tensors):
        return None
    return centre


def _outside(arrays: NDArrays, tensors: list[int], limit: float) -> bool:
    """Whether a float tensor of ``arrays`` outside ``tensors`` has a value that is not
    finite or above ``limit`` in magnitude (``tensors`` were checked with their moments)."""
    measured = set(tensors)
    for t, a in enumerate(arrays):
        if t not in measured and a.dtype.kind == "f" and a.size:
            finite, largest = value_range(a)
            if not finite or largest > limit:
                return True
    return False


class LockedKeys:
    """A round's ``ClientKeys`` bound under its lock (the replies are checked outside it)."""

    def __init__(self, keys: ClientKeys, lock: threading.Lock) -> None:
        self.keys, self.lock = keys, lock

    def bind(self, node_id: int, key: str) -> str | None:
        with self.lock:
            return self.keys.bind(node_id, key)


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


def folding(
    streamed: StreamedRound | None, sent: list[tuple[ClientProxy, Any, Any]]
) -> list[tuple[ClientProxy, Any, Any]]:
    """A round's instructions, each client wrapped so its failures name its node; a
    streamed round's reservoir nodes first, each client a ``FoldingProxy``."""
    if streamed is None:
        return [(NodeProxy(proxy), *rest) for proxy, *rest in sent]
    first = sorted(sent, key=lambda item: item[0].node_id not in streamed.members)
    return [(FoldingProxy(proxy, streamed), *rest) for proxy, *rest in first]
