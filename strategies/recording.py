"""Recording: what the server measured in each round, and the round's record in
results.json built from its clients' evaluations."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common import Scalar

from models.roles import (
    CHECKPOINT_ROUND,
    CHECKPOINT_WRITING,
    DATA_KEY,
    DEVICE_KEY,
    EVAL_PREFIX,
    EVALUATE_FIRST,
)
from pflower.config.schema import RunConfig
from pflower.results import RunRecorder
from pflower.store import clients_that_train, state_on_disk
from strategies.budget import TimeBudget
from strategies.outcome import Participation
from strategies.replies import Evaluation, Reply, failure_reason

if TYPE_CHECKING:
    from strategies.checkpoint import CheckpointWrite

log = logging.getLogger("flwr.pflower")
# evaluate metrics whose mean over clients each round record keeps (as name_mean)
RECORDED_METRICS = ("accuracy-", "logit-norm-", "confidence-")


def per_client_auc(evals: list[Evaluation]) -> dict[str, Any]:
    """``per_client_auc`` (two-class tasks: each client's ROC AUC where its test split
    holds both classes), or nothing."""
    auc = {str(e.client_key): float(e.metrics["auc"]) for e in evals if "auc" in e.metrics}
    return {"per_client_auc": dict(sorted(auc.items()))} if auc else {}


@dataclass
class RoundLog:
    """What the strategy measured in one round, before evaluation completes it."""

    started: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)  # the same moment, wall clock
    ended: float | None = None  # eval-in-fit: when the next round began
    # eval-in-fit: when the closing evaluation began (the last round ends there, as
    # every other ends where the next round begins; the evaluation is timed apart)
    closing: float | None = None
    bytes_down: int = 0
    bytes_up: int = 0
    bytes_down_eval: int = 0
    replies: int = 0
    rejected: list[str] = field(default_factory=list)
    failures: int = 0
    failed: list[str] = field(default_factory=list)  # each failure's line, its node named
    train_losses: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)  # server phase ends (perf_counter)

    def server_seconds(self) -> dict[str, float]:
        """The server's side of the round: configuring the messages, waiting for
        the clients' replies (transport, queues and the clients' work), aggregating."""
        points = [("started", self.started), *self.marks.items()]
        return {b: round(tb - ta, 4) for (_, ta), (b, tb) in zip(points, points[1:])}

    train_loss_by_client: dict[str, float] = field(default_factory=dict)
    train_samples_by_client: dict[str, int] = field(default_factory=dict)

    def add_fit_replies(self, replies: list[Reply]) -> None:
        """Each reply's training loss and sample count (its fit weight)."""
        for r in replies:
            loss = r.metrics.get("train-loss")
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                self.train_losses.append(float(loss))
                self.train_loss_by_client[r.client_key] = float(loss)
            self.train_samples_by_client[r.client_key] = int(r.num_examples)


class ClientFacts:
    """What the run learns of its federation: its size, and what each client says of
    itself in its fit replies (a digest of its data, the device it trains on). The
    data fingerprint in results.json is one digest of every client's digest, so two
    runs on the same data, partitioned alike, have the same fingerprint."""

    def __init__(self) -> None:
        self.federation_size = 0
        self.digests: dict[str, str] = {}
        self.devices: dict[str, str] = {}

    def add(self, replies: list[Reply]) -> None:
        for r in replies:
            digest, device = r.metrics.get(DATA_KEY), r.metrics.get(DEVICE_KEY)
            if isinstance(digest, str):
                self.digests[r.client_key] = digest[:64]
            if isinstance(device, str):
                self.devices[r.client_key] = device[:16]

    def summary(self) -> dict[str, Any]:
        text = "\n".join(f"{k} {d}" for k, d in sorted(self.digests.items()))
        devices: dict[str, int] = {}
        for d in self.devices.values():
            devices[d] = devices.get(d, 0) + 1
        return {
            "federation_size": self.federation_size,
            "data_fingerprint": hashlib.sha256(text.encode()).hexdigest()[:16]
            if self.digests
            else None,
            "clients_with_data_digest": len(self.digests),
            "devices": devices,
        }


def evaluations_in_fit(replies: list[Reply]) -> list[Evaluation]:
    """The previous round's evaluations that fit replies carry (eval-in-fit)."""
    out = []
    for r in replies:
        metrics = {
            k[len(EVAL_PREFIX) :]: v for k, v in r.metrics.items() if k.startswith(EVAL_PREFIX)
        }
        if "accuracy" not in metrics:
            continue
        n = metrics.pop("num-examples", 0)
        loss = metrics.pop("loss", float("nan"))
        e = Evaluation(r.client_key, loss, int(n) if isinstance(n, (int, float)) else 0, metrics)
        if e.problem() is None:
            out.append(e)
    return out


class Rounds(dict[int, RoundLog]):
    """Every round's log by round number, and the round records they make."""

    def __init__(self, recorder: RunRecorder | None, cfg: RunConfig | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        # evaluate-every, and this run's rounds (its last is always scored)
        self.every = cfg.evaluate_every if cfg is not None else 1
        self.num_rounds = cfg.num_server_rounds if cfg is not None else 0
        self.cfg = cfg
        self.offset = 0  # rounds done before this run (resume-from)
        self.checkpointed = 0  # the newest server checkpoint known written
        self.writing: CheckpointWrite | None = None  # the next, being written
        self.unscored = False  # the checkpoint's round has no record yet (eval-in-fit)
        self.facts = ClientFacts()
        self.participation = Participation()  # who was asked, who replied (outcome.py)
        self.budget = TimeBudget(cfg.max_minutes if cfg is not None else 0.0)  # max-minutes

    def resume(self, done: int, carried: list[dict[str, Any]], path: Path) -> None:
        """Go on after the checkpoint of round ``done``, with the records before it.
        A run stopped after that checkpoint but before its round was scored (with
        eval-in-fit, by the next round's fits) has it scored by the first fits now."""
        self.offset = self.checkpointed = done
        self.unscored = done > 0 and done not in {int(r.get("round", 0)) for r in carried}
        if self.unscored:
            self.of(0).extra["scored_after_resume"] = True
        if self.recorder is not None:
            self.recorder.resume(done, carried, path)

    def scored(self, server_round: int) -> bool:
        """Whether round ``server_round``'s model is scored: every ``evaluate-every``-th
        round (counted across resumes) and this run's last."""
        return (self.offset + server_round) % self.every == 0 or server_round >= self.num_rounds

    def evaluates(self, server_round: int, eval_in_fit: bool) -> bool:
        """Whether round ``server_round`` sends evaluate messages: a scored round of the
        run (max-minutes may end it early), and with eval-in-fit only the run's last (the
        next round's fits score the others)."""
        if server_round > self.num_rounds:
            return False
        return self.scored(server_round) and (not eval_in_fit or server_round >= self.num_rounds)

    def begin(self, server_round: int) -> RoundLog | None:
        """A fit round begins: the previous one ended now; its log (None past the run's
        last round, where max-minutes ended it)."""
        if server_round > self.num_rounds:
            return None
        if server_round - 1 in self:
            self[server_round - 1].ended = time.perf_counter()
        self[server_round] = log_ = RoundLog()
        return log_

    def scores_previous(self, server_round: int) -> bool:
        """Whether this round's fits score the previous round's model (eval-in-fit)."""
        if server_round == 1:
            return self.unscored
        return self.scored(server_round - 1)

    def instructions(self, server_round: int, fit: bool, eval_in_fit: bool) -> dict[str, Scalar]:
        """What every fit or evaluate message of a round carries: its round counted
        across resumes, the newest checkpoint written and the one being written (a
        simulated client keeps its state as of each), and whether to score the model
        received before training."""
        config: dict[str, Scalar] = {
            "server-round": self.offset + server_round,
            CHECKPOINT_ROUND: self.checkpointed,
        }
        if self.writing is not None:
            config[CHECKPOINT_WRITING] = self.writing.round
        if fit and eval_in_fit and self.scores_previous(server_round):
            config[EVALUATE_FIRST] = True
        return config

    def settle_checkpoint(self) -> None:
        """Wait for the checkpoint being written; from now on the clients are told of it."""
        if self.writing is not None:
            writing, self.writing = self.writing, None
            self.checkpointed = writing.wait()

    def of(self, server_round: int) -> RoundLog:
        return self.setdefault(server_round, RoundLog())

    def add_fit_replies(
        self, server_round: int, replies: list[Reply], results: list[Any], failures: list[Any]
    ) -> None:
        """A round's accepted fit replies (their losses, counts and facts), the
        (proxy, reply) pairs it received, and its failures."""
        nodes = [proxy.node_id for proxy, _ in results]
        rl = self.of(server_round)
        rl.add_fit_replies(replies)
        rl.replies, rl.failures = len(replies), len(failures)
        rl.failed = sorted(map(failure_reason, failures))
        self.facts.add(replies)
        self.participation.add(server_round, [r.client_key for r in replies], nodes, failures)

    def record(
        self, server_round: int, evals: list[Evaluation]
    ) -> tuple[float | None, dict[str, Scalar]]:
        """One round's record in results.json, from its clients' evaluations and
        what the round noted (the robust bounds' counts, the method's own entries)."""
        if not evals:  # recorded all the same, unscored: what it trained is not lost
            log.error("round %d: no usable evaluation replies", server_round)
            self.record_unscored(server_round)
            return None, {}
        per_client = {str(e.client_key): float(e.metrics["accuracy"]) for e in evals}
        counts = {str(e.client_key): int(e.num_examples) for e in evals}
        client_losses = {str(e.client_key): float(e.loss) for e in evals}
        losses = [float(e.loss) for e in evals if math.isfinite(float(e.loss))]
        means: dict[str, list[float]] = {}
        for e in evals:
            for name, value in e.metrics.items():
                if name.startswith(RECORDED_METRICS) and isinstance(value, (int, float)):
                    means.setdefault(name, []).append(float(value))
        keys = sorted(per_client)
        mean = float(np.mean([per_client[k] for k in keys]))
        pooled = sum(per_client[k] * counts[k] for k in keys) / sum(counts.values())
        self._add_record(
            server_round,
            {
                "accuracy_mean": mean,
                "accuracy_pooled": float(pooled),
                "loss_mean": float(np.mean(losses)) if losses else None,
                "per_client_accuracy": {k: per_client[k] for k in keys},
                **per_client_auc(evals),
                "per_client_loss": {k: client_losses[k] for k in keys},
                "test_samples": counts,
                "metric_means": {
                    name.replace("-", "_") + "_mean": float(np.mean(values))
                    for name, values in sorted(means.items())
                },
            },
        )
        return None, {"accuracy": mean, "accuracy-pooled": float(pooled)}

    def record_unscored(self, server_round: int) -> None:
        """The record of a round whose model ``evaluate-every`` leaves unscored: its
        time, bytes and the bounds' counts, no accuracy."""
        self._add_record(server_round, {})

    def _add_record(self, server_round: int, scores: dict[str, Any]) -> None:
        """Round ``server_round``'s record: what the round measured, and ``scores``
        (its evaluation's fields; none for an unscored round)."""
        rl = self.of(server_round)
        counts = scores.get("test_samples", {})
        keys = sorted(counts or rl.train_samples_by_client)  # unscored: who trained
        auc = scores.get("per_client_auc")
        record: dict[str, Any] = {
            "round": self.offset + server_round,
            "accuracy_mean": scores.get("accuracy_mean"),
            "accuracy_pooled": scores.get("accuracy_pooled"),
            "loss_mean": scores.get("loss_mean"),
            "train_loss_mean": float(np.mean(rl.train_losses)) if rl.train_losses else None,
            "per_client_accuracy": scores.get("per_client_accuracy", {}),
            **({"per_client_auc": auc} if auc is not None else {}),
            "per_client_loss": scores.get("per_client_loss", {}),
            "per_client_train_loss": dict(sorted(rl.train_loss_by_client.items())),
            "per_client_samples": {
                k: {"train": rl.train_samples_by_client.get(k), "test": counts.get(k)} for k in keys
            },
            "bytes_down": rl.bytes_down,
            "bytes_up": rl.bytes_up,
            "bytes_down_eval": rl.bytes_down_eval,
            "seconds": (rl.ended or rl.closing or time.perf_counter()) - rl.started,
            "started_at": rl.started_at,
            "server_seconds": rl.server_seconds(),
            "replies": rl.replies,
            "rejected": rl.rejected,
            "failures": rl.failures,
            "failed": rl.failed,
            **scores.get("metric_means", {}),
        }
        if rl.closing is not None:
            record["closing_evaluation_seconds"] = time.perf_counter() - rl.closing
        record.update(rl.extra)
        if self.recorder is not None:
            self.recorder.extra.update(self.facts.summary())
            if self.cfg is not None and not self.recorder.data_at_sites:
                self.recorder.extra["personal_state"] = self.personal_state()
            self.recorder.add_round(record)

    def personal_state(self) -> dict[str, Any]:
        """Where a simulated run's clients keep their personal state: the budget, the
        most clients the run can train (only they hold state), and what is on disk."""
        assert self.cfg is not None and self.recorder is not None
        size = self.facts.federation_size
        clients, nbytes = state_on_disk(self.recorder.dir)
        return {
            "mode": self.cfg.personal_state,
            "budget_mb": self.cfg.personal_state_budget_mb,
            "clients_that_can_train": clients_that_train(
                size, self.cfg.num_server_rounds, self.cfg.fraction_fit
            ),
            "clients_on_disk": clients,
            "mb_on_disk": round(nbytes / 2**20, 3),
        }
