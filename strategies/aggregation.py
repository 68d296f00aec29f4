"""How a round's replies become the next global state: what a method's author reads.

A round is streamed (strategies/streaming.py: each reply checked, bounded and added to
a running mean as it arrives, then dropped) unless ``held_reason`` says why it must
hold every reply until the round ends: SecAgg+, central DP, a robust rule,
``streamed-aggregation=false``, or the method's card (``Method.per_client``: its
strategy's ``aggregate`` needs every reply). A held round's replies are bounded by the
same rules (``bound_held``) and handed to ``aggregate`` as a list, inside DP's round
where it is on. Either way the bounds, the running mean and the reservoir are
streaming.py's; a method overrides ``aggregate`` only, and only with its card's reason.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import torch
from flwr.common import NDArrays, Parameters
from flwr.server.strategy import Strategy

from models.wire import Wire
from pflower.config.schema import RunConfig
from pflower.config.weighting import MeanPart, aggregation_rule
from pflower.results import RunRecorder
from strategies import kernels, privacy
from strategies.parts import PartedMean
from strategies.payloads import Payloads
from strategies.privacy import secure_decoder
from strategies.recording import RoundLog, Rounds
from strategies.replies import ClientKeys, Reply, check_arrays
from strategies.reply_log import ReplyLog
from strategies.robust import Bounds, NormHistory, decoded_references, mean_by_rule
from strategies.streaming import StreamedRound, bound_held, open_round

log = logging.getLogger("flwr.pflower")


class Aggregation(Strategy):
    """The round's aggregation: the rule, streamed or held, and its state across rounds."""

    default_aggregation = "weighted"  # the card's rule: weighted (by samples) | mean
    # the strategy's, set by PFLStrategy: what the steps below read
    spec: list[Any]
    wire: Wire
    payloads: Payloads
    clients: ClientKeys
    rounds: Rounds

    def __init__(
        self,
        cfg: RunConfig,
        holds_replies: str = "",
        default_aggregation: str | None = None,
        means: tuple[MeanPart, ...] = (),
        bounds_updates: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        # the card's reason its aggregation needs every reply (empty: a mean, streamed)
        self.holds_replies = holds_replies
        self.means = means  # the card's mean in parts (empty: one mean of every array)
        # False: the shared arrays are statistics, not a model (robust.Bounds.of)
        self.bounds_updates = bounds_updates
        if default_aggregation is not None:
            self.default_aggregation = default_aggregation  # the method's rule (methods/)
        self.dp = privacy.DPRelease(cfg)
        self.norm_history = NormHistory(cfg.norm_history_rounds)
        self.streamed: StreamedRound | None = None  # this round's, if streamed
        self.spare_sum: tuple[NDArrays, NDArrays] | None = None  # the last one's sum buffers
        self.reply_log: ReplyLog | None = None  # reply-log: set by the ServerApp
        # where a streamed round sums its replies (None: the host; the in-process engine
        # sets a GPU its clients all train on, strategies/device_fold.py)
        self.fold_device: torch.device | None = None

    @property
    def recorder(self) -> RunRecorder | None:
        """The run's results (None: not recorded), the one its rounds write to."""
        return self.rounds.recorder

    @property
    def aggregation(self) -> str:
        """The rule the round's replies are combined by (the clients weigh by the same)."""
        return aggregation_rule(self.cfg, self.default_aggregation)

    @property
    def parted(self) -> PartedMean:
        """Each uploaded array's part of the mean: its weights and its server step."""
        return PartedMean.of(self.wire.up_spec(), self.means)

    def weigh(self, num_examples: int) -> float | list[float]:
        """A kept reply's weight in the round's mean (one per array for a parted mean)."""
        weighted = self.aggregation == "weighted"
        if not self.means:
            return float(num_examples) if weighted else 1.0
        return self.parted.weight(num_examples, weighted)

    def next_global(self, before: NDArrays, mean: NDArrays, kept: int) -> NDArrays:
        """The round's ``mean`` of ``kept`` replies moved to by each part's server step."""
        if not self.means:
            return mean
        size = self.rounds.facts.federation_size or kept
        return self.parted.moved(before, mean, self.cfg, kept / max(size, 1))

    @property
    def held_reason(self) -> str:
        """Why this run's rounds hold every reply until the round ends ("" : each reply is
        folded as it arrives, strategies/streaming.py)."""
        cfg = self.cfg
        if self.holds_replies:
            return f"the method's aggregation needs every reply ({self.holds_replies})"
        if cfg.secure_aggregation:
            return "secure-aggregation: the server sees one sum"
        if self.dp.on:
            return f"dp-mode={cfg.dp_mode}: the round's mean is released with noise"
        if self.aggregation not in ("mean", "weighted"):
            return f"aggregation={self.aggregation} needs every reply"
        if not cfg.streamed_aggregation:
            return "streamed-aggregation=false"
        return ""

    # ---- the strategy's payload hooks the steps use (PFLStrategy defines them) -----------

    @property
    def global_arrays(self) -> NDArrays:
        return self.payloads.global_arrays

    def set_global(self, arrays: NDArrays) -> None:
        self.payloads.set_global(arrays)

    def payload_for(self, client_key: str | None, server_round: int) -> Parameters:
        """What one client receives: its own payload if the method keeps one, else global."""
        return self.payloads.payload_for(client_key)

    def check_reply(
        self, client_key: str, arrays: NDArrays, num_examples: int, values: bool = True
    ) -> str | None:
        """None if a reply is acceptable (the wire's upload), else the reason to reject it
        (``values=False``: all but its values' range, which the caller checks)."""
        spec = self.wire.up_spec()
        problem = check_arrays(spec, arrays, num_examples, self.cfg.max_abs_value, values)
        return problem or self.wire.check_up(arrays)

    # ---- the steps ---------------------------------------------------------------------------

    def open_streamed_round(
        self, server_round: int, node_ids: list[int], places: dict[int, int] | None = None
    ) -> StreamedRound | None:
        """A streamed round over the sampled ``node_ids`` (``places``: each one's rank
        key, see ``streaming.reservoir_nodes``), or None where the round is held."""
        if self.held_reason:
            return None
        cfg = self.cfg
        dtypes = {a.dtype for a in self.global_arrays} & set(kernels.COMPILED_DTYPES)
        spare, self.spare_sum = self.spare_sum, None  # one round's sum at a time
        streamed = open_round(
            server_round,
            node_ids,
            places,
            cfg,
            dtypes,
            bounds=Bounds.of(cfg, True, self.bounds_updates),
            weigh=self.weigh,
            decode=secure_decoder(server_round, cfg, self.spec, {}),
            check=self.check_reply,
            keys=self.clients,
            reference_of=decoded_references(
                lambda key: self.payload_for(key, server_round), self.wire.upload_reference
            ),
            history=self.norm_history,
            spare=spare,
            device=self.fold_device,
        )
        if self.reply_log is not None:  # reply-log: each reply as it is added
            done = self.rounds.offset + server_round
            streamed.log = functools.partial(self.reply_log.reply, server_round, done)
        return streamed

    def finish_streamed_round(self, streamed: StreamedRound, server_round: int) -> None:
        """The round's mean becomes the global state (and the reply log's aggregate); its
        update norms join the history, its direction the next round's direction reference."""
        before, mean = self.global_arrays, streamed.sum.mean()
        self.set_global(self.next_global(before, mean, len(streamed.kept)))
        if self.reply_log is not None:  # the replies' mean, which the log's replay remakes
            done = self.rounds.offset + server_round
            self.reply_log.aggregate(server_round, done, mean, len(streamed.kept))
        self.spare_sum = streamed.sum.release()
        self.norm_history.changed(before, self.global_arrays)
        self.norm_history.add(streamed.norms)

    def aggregate_held_round(self, server_round: int, replies: list[Reply], rl: RoundLog) -> bool:
        """A held round: its replies (in client-key order: order-independent) bounded
        unless SecAgg+ or DP takes them, then ``aggregate_held``; False if every reply
        was rejected (the global state is kept)."""
        replies.sort(key=lambda r: r.client_key)
        cfg = self.cfg
        if not cfg.secure_aggregation and not self.dp.on:
            sent = lambda key: self.payload_for(key, server_round)  # noqa: E731
            mean = not self.holds_replies and self.aggregation in ("mean", "weighted")
            reference_of = decoded_references(sent, self.wire.upload_reference)
            kept, rejected = bound_held(
                server_round, replies, Bounds.of(cfg, mean, self.bounds_updates), self.norm_history, reference_of,
                rl.extra,
            )  # fmt: skip
            rl.rejected += rejected
            if not kept:
                log.error(
                    "round %d: every reply was rejected: the global state is kept", server_round
                )
                return False
            replies = kept
        self.aggregate_held(server_round, replies, rl.extra)
        return True

    def aggregate_held(
        self, server_round: int, replies: list[Reply], extra: dict[str, Any]
    ) -> None:
        """``aggregate`` over a held round's replies; under central DP, inside its round:
        the updates clipped first, the noisy release after."""
        if not self.dp.on:
            self.aggregate(server_round, replies)
            return
        self.dp.clip(replies, self.global_arrays, extra)
        before = [a.astype(np.float64) for a in self.global_arrays]
        self.aggregate(server_round, replies)
        epsilon = self.dp.release(before, self.global_arrays, len(replies), self.set_global, extra)
        if self.recorder is not None:
            self.recorder.extra.update(dp_epsilon=epsilon, dp_delta=self.cfg.dp_delta)

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Turn the accepted replies into the next global shared tensors."""
        if self.spec:
            mean = mean_by_rule(replies, self.aggregation, self.cfg.trim_fraction, self.weigh)
            self.set_global(self.next_global(self.global_arrays, mean, len(replies)))
