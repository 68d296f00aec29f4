"""The one Strategy every method builds on: Flower's legacy Strategy API (SecAgg+
needs it) around one aggregation, composed of steps that each live in their own
module: sampling (strategies/sampling.py), reply validation and client identity
(strategies/replies.py), the bounds on one client (strategies/robust.py), privacy
(strategies/privacy.py), checkpoints (strategies/checkpoint.py) and the round
records (strategies/recording.py).

A method overrides ``aggregate`` (and, for per-client aggregation, ``payload_for``;
for server state beyond the global tensors, ``server_state``/``restore_server_state``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from torch import nn

from models.roles import DP_PARTICIPANTS, TensorSpec
from models.wire import Wire
from pflower.config.schema import RunConfig
from pflower.results import RunRecorder
from strategies import checkpoint, privacy, streaming
from strategies.bystanders import Bystanders
from strategies.payloads import Payloads
from strategies.recording import RoundLog, Rounds, evaluations_in_fit
from strategies.replies import (
    ClassListMismatch,
    ClassLists,
    ClientKeys,
    Evaluation,
    Reply,
    RunRefused,
    accept_evaluations,
    accept_fit_replies,
    check_arrays,
    check_failures,
    enough_replies,
    payload_bytes,
    take_arrays,
)
from strategies.reply_log import ReplyLog
from strategies.robust import Bounds, NormHistory, bound_round, mean_by_rule, weighted_mean
from strategies.roster import load_roster
from strategies.sampling import Sampler
from strategies.streaming import StreamedRound

log = logging.getLogger("flwr.pflower")

__all__ = ["ClassListMismatch", "Evaluation", "PFLStrategy", "Reply", "RoundLog", "RunRefused"]
__all__ += ["payload_bytes", "take_arrays", "weighted_mean"]


class PFLStrategy(Strategy):
    """Sample-weighted mean of the shared tensors (FedAvg's aggregation)."""

    default_aggregation = "weighted"

    def __init__(
        self,
        cfg: RunConfig,
        spec: list[TensorSpec],
        initial: NDArrays,
        model: nn.Module,
        recorder: RunRecorder | None = None,
        default_aggregation: str | None = None,
        wire: Wire | None = None,
    ) -> None:
        super().__init__()
        if default_aggregation is not None:
            self.default_aggregation = default_aggregation  # the method's rule (methods/)
        self.cfg, self.spec, self.recorder = cfg, spec, recorder
        self.wire = wire if wire is not None else Wire.of_spec(spec)
        spill = recorder.dir / "client-payloads" if recorder is not None else None
        self.payloads = Payloads(self.wire, initial, cfg.personal_state_budget_mb * 2**20, spill)
        self.sampler = Sampler(cfg.min_available_clients, cfg.seed)
        self.clients = ClientKeys(load_roster(cfg.roster) if cfg.roster else None)
        self.class_lists = ClassLists()
        self.dp = privacy.DPRelease(cfg)
        self.rounds, self.norm_history = Rounds(recorder, cfg), NormHistory(cfg.norm_history_rounds)
        self.streamed: StreamedRound | None = None  # this round's if streamed (streaming.py)
        self.spare_sum: tuple[NDArrays, NDArrays] | None = None  # the last one's sum buffers
        self.bystanders = Bystanders()  # clients that do not train (FedFac's new clients)
        self.reply_log: ReplyLog | None = None  # reply-log: set by the ServerApp

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.cfg.method})"

    @property
    def aggregation(self) -> str:
        if self.dp.on:
            return "mean"  # the noise is calibrated to an equal-weight mean of clipped updates
        chosen = self.cfg.aggregation
        return self.default_aggregation if chosen == "default" else chosen

    @property
    def own_aggregation(self) -> bool:  # a method's own ``aggregate``: not a mean of the replies
        return type(self).aggregate is not PFLStrategy.aggregate

    # ---- payloads: what each client is sent and must send back -------------------------------

    @property
    def global_arrays(self) -> NDArrays:
        return self.payloads.global_arrays

    def set_global(self, arrays: NDArrays) -> None:
        self.payloads.set_global(arrays)

    def global_payload(self) -> Parameters:
        return self.payloads.global_payload()

    def payload_for(self, client_key: str | None, server_round: int) -> Parameters:
        """What one client receives: its own payload if the method keeps one, else global."""
        return self.payloads.payload_for(client_key)

    def client_config(self, client_key: str | None, server_round: int) -> dict[str, Scalar]:
        """Per-client instructions sent with every payload, fit and evaluate alike."""
        return {}

    def check_reply(
        self, client_key: str, arrays: NDArrays, num_examples: int, values: bool = True
    ) -> str | None:
        """None if a reply is acceptable (the wire's upload), else the reason to reject it
        (``values=False``: all but its values' range, which the caller checks)."""
        spec = self.wire.up_spec()
        problem = check_arrays(spec, arrays, num_examples, self.cfg.max_abs_value, values)
        return problem or self.wire.check_up(arrays)

    # ---- the server checkpoint ---------------------------------------------------------------

    def server_state(self) -> dict[str, np.ndarray]:
        """Everything the server has learned, as named arrays (privacy spent, bounds' history)."""
        return {**self.payloads.state(self.spec), **self.dp.state(), **self.norm_history.state()}

    def restore_server_state(self, arrays: dict[str, np.ndarray]) -> None:
        """The inverse of ``server_state``; ValueError naming the first misfit."""
        self.payloads.restore(self.spec, arrays)
        self.dp.restore(arrays)
        self.norm_history.restore(arrays, self.global_arrays)

    def resume(self, resume_from: str) -> None:
        """Start from a checkpoint; ConfigError naming ``resume-from`` if it does not fit."""
        done, path = checkpoint.resume(resume_from, self.cfg.method, self.restore_server_state)
        self.rounds.resume(done, checkpoint.rounds_before(path, done), path)

    # ---- Flower's Strategy API ---------------------------------------------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.global_payload()

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        rl = self.rounds.begin(server_round)
        if rl is None:  # max-minutes ended the run after an earlier round
            return []
        self.bystanders.prepare(client_manager)
        sent = instructions(self, server_round, client_manager, self.cfg.fraction_fit, fit=True)
        if server_round == 1 and not self.cfg.class_names.strip():  # ids from each site's data
            self.class_lists.ask([p for p, _, _ in sent], self.cfg.round_timeout or None, 1)
        rl.marks["configure"] = time.perf_counter()
        self.rounds.participation.asked[server_round] = nodes = [p.node_id for p, _, _ in sent]
        self.streamed = streaming.open_round(self, server_round, nodes, self.sampler.places(sent))
        sent = streaming.folding(self.streamed, sent)  # each reply folded as it arrives
        return [(proxy, FitIns(payload, config)) for proxy, payload, config in sent]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        cfg, rl = self.cfg, self.rounds.of(server_round)
        rl.marks["waiting for clients"] = time.perf_counter()
        streamed, self.streamed = self.streamed, None
        if streamed is not None:  # every reply was folded as it arrived
            streamed.close()
            accepted, rl.rejected, rl.bytes_up = streamed.kept, streamed.rejected, streamed.bytes_up
            rl.extra.update(streamed.extra)
        else:
            trained = self.bystanders.trained_fits(server_round, results)  # results: all
            accepted, rl.rejected, rl.bytes_up = accept_fit_replies(
                server_round,
                trained,
                privacy.secure_decoder(server_round, self.cfg, self.spec, rl.extra),
                self.check_reply,
                self.clients,
            )
        self.rounds.add_fit_replies(server_round, accepted, results, failures)
        self.class_lists.check(server_round, accepted)
        check_failures(server_round, accepted, failures)
        record_scores(self, server_round, accepted)
        if not enough_replies(server_round, len(accepted), cfg.min_replies):
            return self.global_payload(), {}
        if streamed is not None:
            streaming.finish_round(self, streamed, server_round)
            checkpoint.save_if_due(self, server_round)
            rl.marks["aggregate"] = time.perf_counter()
            return self.global_payload(), {}
        accepted.sort(key=lambda r: r.client_key)  # order-independent aggregation
        if not cfg.secure_aggregation and not self.dp.on:
            sent = lambda key: self.payload_for(key, server_round)  # noqa: E731
            mean = not self.own_aggregation and self.aggregation in ("mean", "weighted")
            bounds, history = Bounds.of(cfg, mean), self.norm_history
            align = self.wire.upload_reference
            accepted = bound_round(server_round, accepted, sent, bounds, history, rl, align)
            if not accepted:
                return self.global_payload(), {}
        self.dp.aggregate(accepted, self, lambda: self.aggregate(server_round, accepted), rl.extra)
        checkpoint.save_if_due(self, server_round)
        rl.marks["aggregate"] = time.perf_counter()
        return self.global_payload(), {}  # no History metrics: results.json has them

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Turn the accepted replies into the next global shared tensors."""
        if self.spec:
            self.set_global(mean_by_rule(replies, self.aggregation, self.cfg.trim_fraction))

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.rounds.evaluates(server_round, self.cfg.eval_in_fit):
            return []  # eval-in-fit: the next round's fits score it; or evaluate-every
        if self.cfg.eval_in_fit and server_round in self.rounds:  # the closing evaluation
            self.rounds[server_round].closing = time.perf_counter()
        sent = instructions(self, server_round, client_manager, self.cfg.fraction_evaluate, False)
        return [(proxy, EvaluateIns(payload, config)) for proxy, payload, config in sent]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        results = self.bystanders.trained_evaluations(server_round, results)
        return self.record_round(
            server_round, accept_evaluations(server_round, results, self.clients)
        )

    def note(self, server_round: int, **entries: Any) -> None:
        """The one way a method adds entries to a round's record (results.json)."""
        self.rounds.of(server_round).extra.update(entries)

    def record_round(
        self, server_round: int, evals: list[Evaluation]
    ) -> tuple[float | None, dict[str, Scalar]]:
        return self.rounds.record(server_round, evals)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return None  # personalised models are evaluated on the clients only


def record_scores(strategy: PFLStrategy, server_round: int, accepted: list[Reply]) -> None:
    """The record these fits complete: with eval-in-fit, the previous round's (from
    the scores they carry, or unscored by ``evaluate-every``); without, this round's
    if ``evaluate-every`` leaves it unscored (it sends no evaluate messages)."""
    rounds = strategy.rounds
    if not strategy.cfg.eval_in_fit:
        if not rounds.scored(server_round):
            rounds.record_unscored(server_round)
    elif rounds.scores_previous(server_round):
        strategy.record_round(server_round - 1, evaluations_in_fit(accepted))
    elif server_round >= 2:
        rounds.record_unscored(server_round - 1)


def instructions(
    strategy: PFLStrategy,
    server_round: int,
    client_manager: ClientManager,
    fraction: float,
    fit: bool,
) -> list[tuple[ClientProxy, Parameters, dict[str, Scalar]]]:
    """A round's sample, each with its payload and instructions (fit or evaluate)."""
    strategy.clients.manager = client_manager
    sample = strategy.sampler.sample(
        client_manager, fraction, server_round, "fit" if fit else "evaluate"
    )
    rl = strategy.rounds.of(server_round)
    if fit:
        strategy.dp.sample = (len(sample), client_manager.num_available())
        strategy.rounds.facts.federation_size = client_manager.num_available()
    out = []
    for proxy in sample:
        key = strategy.clients.key_of(proxy)
        if fit and strategy.bystanders.sits_out(key):
            continue
        payload = strategy.payload_for(key, server_round)
        config = strategy.rounds.instructions(server_round, fit, strategy.cfg.eval_in_fit)
        if fit and strategy.cfg.dp_mode == "distributed":  # each noise share depends on it
            config[DP_PARTICIPANTS] = len(sample)
        config.update(strategy.client_config(key, server_round))
        if fit:
            rl.bytes_down += payload_bytes(payload)
        else:
            rl.bytes_down_eval += payload_bytes(payload)
        out.append((proxy, payload, config))
    return out
