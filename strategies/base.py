"""The one Strategy every method builds on: Flower's legacy Strategy API (SecAgg+
needs it) around one aggregation (strategies/aggregation.py: streamed, or held where a
rule needs every reply), composed of steps that each live in their own module:
sampling (strategies/sampling.py), reply validation and client identity
(strategies/replies.py), the bounds on one client (strategies/streaming.py), privacy
(strategies/privacy.py), checkpoints (strategies/checkpoint.py), the time budget
(strategies/budget.py) and the round records (strategies/recording.py).

A method overrides ``aggregate`` only where its card says why it needs every reply
(``Method.per_client``), ``payload_for`` for per-client aggregation, and
``server_state``/``restore_server_state`` for server state beyond the global tensors.
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
from torch import nn

from models.roles import DP_PARTICIPANTS, TensorSpec
from models.wire import Wire
from pflower.config.schema import RunConfig
from pflower.config.weighting import MeanPart
from pflower.results import RunRecorder
from strategies import budget, checkpoint
from strategies.aggregation import Aggregation
from strategies.bystanders import Bystanders
from strategies.payloads import Payloads
from strategies.privacy import secure_decoder
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
    check_failures,
    enough_replies,
    payload_bytes,
    take_arrays,
)
from strategies.robust import weighted_mean
from strategies.roster import load_roster
from strategies.sampling import Sampler
from strategies.streaming import folding

log = logging.getLogger("flwr.pflower")

__all__ = ["ClassListMismatch", "Evaluation", "PFLStrategy", "Reply", "RoundLog", "RunRefused"]
__all__ += ["payload_bytes", "take_arrays", "weighted_mean"]


class PFLStrategy(Aggregation):
    """Flower's Strategy API around the round's steps; its aggregation (a mean of the
    shared tensors, FedAvg's by default) is strategies/aggregation.py's."""

    def __init__(
        self,
        cfg: RunConfig,
        spec: list[TensorSpec],
        initial: NDArrays,
        model: nn.Module,
        recorder: RunRecorder | None = None,
        default_aggregation: str | None = None,
        wire: Wire | None = None,
        holds_replies: str = "",
        means: tuple[MeanPart, ...] = (),
        bounds_updates: bool = True,
    ) -> None:
        if type(self).aggregate is not PFLStrategy.aggregate and not holds_replies:
            raise TypeError(
                f"{type(self).__name__} overrides aggregate, but its method's card does not "
                "say why its aggregation needs every reply at once (Method.per_client)"
            )
        super().__init__(cfg, holds_replies, default_aggregation, means, bounds_updates)
        self.spec = spec
        self.wire = wire if wire is not None else Wire.of_spec(spec)
        spill = recorder.dir / "client-payloads" if recorder is not None else None
        self.payloads = Payloads(self.wire, initial, cfg.personal_state_budget_mb * 2**20, spill)
        self.sampler = Sampler(cfg.min_available_clients, cfg.seed)
        self.clients = ClientKeys(load_roster(cfg.roster) if cfg.roster else None)
        self.class_lists = ClassLists()
        self.rounds = Rounds(recorder, cfg)
        self.bystanders = Bystanders()  # clients that do not train (FedFac's new clients)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.cfg.method})"

    # ---- payloads: what each client is sent and must send back -------------------------------

    def global_payload(self) -> Parameters:
        return self.payloads.global_payload()

    def client_config(self, client_key: str | None, server_round: int) -> dict[str, Scalar]:
        """Per-client instructions sent with every payload, fit and evaluate alike."""
        return {}

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
        self.streamed = self.open_streamed_round(server_round, nodes, self.sampler.places(sent))
        sent = folding(self.streamed, sent)  # each reply folded as it arrives
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
                secure_decoder(server_round, self.cfg, self.spec, rl.extra),
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
            self.finish_streamed_round(streamed, server_round)
        elif not self.aggregate_held_round(server_round, accepted, rl):
            return self.global_payload(), {}  # every reply rejected: the global state kept
        budget.stop_if_out_of_time(self.rounds, server_round)  # max-minutes: the run's last?
        checkpoint.save_if_due(self.rounds, server_round, self.server_state)
        rl.marks["aggregate"] = time.perf_counter()
        return self.global_payload(), {}  # no History metrics: results.json has them

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
