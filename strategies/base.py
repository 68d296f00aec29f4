"""The one Strategy every method builds on.

It samples clients, sends each its payload, checks every reply against the wire
spec (count, shape, dtype, finite), rejects bad replies with a logged reason,
aggregates the rest with the method's rule, counts bytes from the serialized
payloads, records per-round metrics and checkpoints what it learned. Methods
override ``aggregate`` (and, for per-client aggregation, ``payload_for``; for
server state beyond the global tensors, ``server_state``/``restore_server_state``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
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
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from torch import nn

from models.roles import (
    CLASSES_KEY,
    CLIENT_KEY,
    DP_PARTICIPANTS,
    EVAL_PREFIX,
    EVALUATE_FIRST,
    TensorSpec,
)
from pfl_privacy import PrivacyAccountant, add_noise, clip_update, noise_std
from pfl_privacy.policy import REFUSED
from run_config.schema import ConfigError, RunConfig
from run_results import RunRecorder
from strategies.checkpoint import (
    checkpoint_path,
    load_server_state,
    rounds_before,
    save_server_state,
)
from strategies.robust import bound_updates, capped_counts, robust_mean

log = logging.getLogger("flwr.pflower")
# evaluate metrics whose mean over clients each round record keeps (as name_mean)
RECORDED_METRICS = ("accuracy-", "logit-norm-", "confidence-")

DP_HISTORY = "dp/accountant-history"  # in the checkpoint: the privacy already spent
WAIT_S = 600  # how long a round waits for min-available-clients
SETTLE_S = 30  # how long the first round waits for registrations to settle


class RunRefused(RuntimeError):
    """Every client asked refused the run by its site's policy: it stops here."""


class ClassListMismatch(RuntimeError):
    """Sites label their data through different class lists: training would mix labels."""


@dataclass
class Reply:
    """One accepted fit reply."""

    client_key: str
    arrays: NDArrays
    num_examples: int
    metrics: dict[str, Scalar]


@dataclass
class Evaluation:
    """One client's evaluation of a round's personalised model."""

    client_key: Any
    loss: float
    num_examples: int
    metrics: dict[str, Scalar]

    def problem(self) -> str | None:
        acc = self.metrics.get("accuracy")
        if not isinstance(self.client_key, str) or not self.client_key:
            return "no client key"
        if not isinstance(acc, (int, float)) or not 0.0 <= float(acc) <= 1.0:
            return f"accuracy {acc!r}"
        if self.num_examples <= 0:
            return f"num_examples {self.num_examples}"
        return None


@dataclass
class RoundLog:
    """What the strategy measured in one round, before evaluation completes it."""

    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None  # eval-in-fit: when the next round began
    bytes_down: int = 0
    bytes_up: int = 0
    bytes_down_eval: int = 0
    replies: int = 0
    rejected: list[str] = field(default_factory=list)
    failures: int = 0
    train_losses: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)  # server phase ends (perf_counter)

    def server_seconds(self) -> dict[str, float]:
        """The server's side of the round: configuring the messages, waiting for
        the clients' replies (transport, queues and the clients' work), aggregating."""
        points = [("started", self.started), *self.marks.items()]
        return {b: round(tb - ta, 4) for (_, ta), (b, tb) in zip(points, points[1:])}


def payload_bytes(parameters: Parameters) -> int:
    """Bytes of a serialized payload (what travels)."""
    return sum(len(t) for t in parameters.tensors)


def failure_reason(failure: object) -> str:
    """One line of a failure (Flower wraps client errors in long tracebacks)."""
    if isinstance(failure, tuple):
        proxy, res = failure
        return f"node {proxy.node_id}: status {res.status.code.name} {res.status.message}"
    text = str(failure)
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1]
    return text.split("\\n")[0].split("\n")[0].strip("'>) ")[:300]


def weighted_mean(arrays: list[NDArrays], weights: list[float]) -> NDArrays:
    """Per-tensor weighted mean, in float64, cast back to each tensor's dtype."""
    total = float(sum(weights))
    out = []
    for tensors in zip(*arrays, strict=True):
        acc = sum(w * t.astype(np.float64) for w, t in zip(weights, tensors)) / total
        out.append(acc.astype(tensors[0].dtype))
    return out


def take_arrays(arrays: dict[str, np.ndarray], prefix: str, spec: list[TensorSpec]) -> NDArrays:
    """``arrays[prefix + name]`` for each spec entry, checked against it."""
    out = []
    for s in spec:
        a = arrays.get(prefix + s.name)
        if a is None:
            raise ValueError(f"no tensor '{prefix}{s.name}'")
        problem = s.matches(a)
        if problem:
            raise ValueError(problem)
        out.append(a)
    return out


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
    ) -> None:
        super().__init__()
        if default_aggregation is not None:
            self.default_aggregation = default_aggregation  # the method's rule (methods/)
        self.cfg = cfg
        self.spec = spec
        self.global_arrays: NDArrays = [a.copy() for a in initial]
        self.recorder = recorder
        self.node_keys: dict[int, str] = {}  # transient node id -> stable client key
        self.key_owner: dict[str, int] = {}  # client key -> the node bound to it
        self.class_lists: dict[str, str] = {}  # client key -> digest of its class list
        self._manager: ClientManager | None = None  # for who is still connected
        self.rounds: dict[int, RoundLog] = {}
        self._encoded: Parameters | None = None
        self._settled = False  # see wait_for_federation
        self._accountant: PrivacyAccountant | None = None
        self._fit_sample = (0, 0)  # (clients asked, clients available) in the last fit round
        self._dp_rng = np.random.default_rng()  # OS entropy: DP noise must not be predictable
        self.round_offset = 0  # rounds done before this run (resume-from)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.cfg.method})"

    # ---- payloads --------------------------------------------------------------------------

    @property
    def aggregation(self) -> str:
        if self.cfg.dp_mode != "off":
            return "mean"  # the noise is calibrated to an equal-weight mean of clipped updates
        return (
            self.default_aggregation if self.cfg.aggregation == "default" else self.cfg.aggregation
        )

    @property
    def accountant(self) -> PrivacyAccountant:
        if self._accountant is None:
            self._accountant = PrivacyAccountant(self.cfg.dp_noise_multiplier, self.cfg.dp_delta)
        return self._accountant

    def release_dp(self, server_round: int, before: NDArrays, accepted: int) -> None:
        """DP-FedAvg's release of one round (pfl_privacy). The clipped updates are
        summed over the ``accepted`` clients and divided by the number asked (a
        fixed denominator, McMahan et al. 2018): adding or removing one client's
        update moves the result by at most clipping-norm / asked, the sensitivity
        the noise is calibrated to. The server adds the noise (dp-mode client or
        server), or the clients did, each its share, under SecAgg+ (distributed).
        The accountant steps at this round's rate: clients asked / available."""
        cfg = self.cfg
        asked, available = self._fit_sample
        asked = max(asked, accepted, 1)
        scaled = []
        for b, a in zip(before, self.global_arrays, strict=True):
            if a.dtype.kind == "f":
                a = (b + (accepted / asked) * (a.astype(np.float64) - b)).astype(a.dtype)
            scaled.append(a)
        std = noise_std(cfg.dp_noise_multiplier, cfg.dp_clipping_norm, asked)
        if cfg.dp_mode != "distributed":
            add_noise(scaled, std, self._dp_rng)  # replaces the float arrays, not in place
        self.set_global(scaled)
        self.accountant.step(min(1.0, asked / max(available, asked)))
        epsilon = self.accountant.epsilon()
        extra = self.rounds.setdefault(server_round, RoundLog()).extra
        extra.update(dp_epsilon=epsilon, dp_noise_std=std, dp_sample_rate=asked / max(available, 1))
        if self.recorder is not None:
            self.recorder.extra.update(dp_epsilon=epsilon, dp_delta=cfg.dp_delta)

    def set_global(self, arrays: NDArrays) -> None:
        self.global_arrays = arrays
        self._encoded = None

    def global_payload(self) -> Parameters:
        """The global shared tensors, serialized once per round (not per client)."""
        if self._encoded is None:
            self._encoded = ndarrays_to_parameters(self.global_arrays)
        return self._encoded

    def payload_for(self, client_key: str | None, server_round: int) -> Parameters:
        """What one client receives; per-client aggregation overrides this."""
        return self.global_payload()

    def client_config(self, client_key: str | None, server_round: int) -> dict[str, Scalar]:
        """Per-client instructions sent with every payload, fit and evaluate alike
        (e.g. FedFac's masks)."""
        return {}

    def expected_spec(self, client_key: str) -> list[TensorSpec]:
        """The spec a reply must match; the upload spec may differ per method."""
        return self.spec

    def key_of(self, proxy: ClientProxy) -> str | None:
        return self.node_keys.get(proxy.node_id)

    def bind(self, node_id: int, key: str) -> str | None:
        """Tie a client key to the node that presents it: None if it may, else why
        not. A key stays with its first node while that node is connected (another
        node presenting it is an impostor, and never gets its payload); it moves only
        when that node is gone (a site restarted without node authentication,
        which gives it a new node id). A node keeps the key it first presented."""
        owner = self.key_owner.get(key)
        if owner is not None and owner != node_id:
            connected = (
                {p.node_id for p in self._manager.all().values()} if self._manager else set()
            )
            if owner in connected:
                return f"client key {key!r} belongs to node {owner}, still connected"
            log.warning("client key %r moves from node %d (gone) to node %d", key, owner, node_id)
        current = self.node_keys.get(node_id)
        if current is not None and current != key:
            return f"node {node_id} presented client key {current!r} before"
        self.key_owner[key] = node_id
        self.node_keys[node_id] = key
        return None

    # ---- the server checkpoint (strategies/checkpoint.py) -----------------------------------

    def server_state(self) -> dict[str, np.ndarray]:
        """Everything the server has learned, as named arrays (and the privacy spent)."""
        state = {f"global/{s.name}": a for s, a in zip(self.spec, self.global_arrays)}
        if self._accountant is not None:
            state[DP_HISTORY] = self._accountant.history()
        return state

    def restore_server_state(self, arrays: dict[str, np.ndarray]) -> None:
        """The inverse of ``server_state``; ValueError naming the first misfit."""
        self.set_global(take_arrays(arrays, "global/", self.spec))
        if DP_HISTORY in arrays:
            self.accountant.restore(arrays[DP_HISTORY])

    def resume(self, resume_from: str) -> None:
        """Start from a checkpoint; ConfigError naming ``resume-from`` if it does not fit."""
        path = checkpoint_path(resume_from)
        server_round, arrays = load_server_state(path, self.cfg.method)
        try:
            self.restore_server_state(arrays)
        except ValueError as err:
            raise ConfigError(
                f"config key 'resume-from': {path} does not fit this run's model and method ({err})"
            ) from None
        self.round_offset = server_round
        if self.recorder is not None:
            self.recorder.resume(server_round, rounds_before(path, server_round), path)
        log.info("resumed from %s: %d rounds done before", path, server_round)

    def save_checkpoint(self, server_round: int) -> None:
        every = self.cfg.checkpoint_every
        if self.recorder is None or every == 0:
            return
        if server_round % every and server_round != self.cfg.num_server_rounds:
            return
        save_server_state(
            self.recorder.dir,
            self.cfg.method,
            self.round_offset + server_round,
            self.server_state(),
        )

    # ---- Flower Strategy API ---------------------------------------------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.global_payload()

    def wait_for_federation(self, client_manager: ClientManager) -> int:
        """Once per run, before the first round: nodes register asynchronously,
        so wait until the number of connected clients stops changing (at most
        SETTLE_S). Returns the number connected."""
        if not self._settled:
            deadline = time.monotonic() + SETTLE_S
            last, since = -1, time.monotonic()
            while time.monotonic() < deadline:
                n = client_manager.num_available()
                if n != last:
                    last, since = n, time.monotonic()
                elif n > 0 and time.monotonic() - since >= 1.0:
                    break
                time.sleep(0.1)
            self._settled = True
        return client_manager.num_available()

    def _sample(self, client_manager: ClientManager, fraction: float) -> list[ClientProxy]:
        self._manager = client_manager
        self.wait_for_federation(client_manager)
        wanted = self.cfg.min_available_clients
        if client_manager.num_available() < wanted:
            log.info("waiting up to %ds for %d clients (min-available-clients)", WAIT_S, wanted)
            if not client_manager.wait_for(wanted, timeout=WAIT_S):
                log.warning(
                    "only %d of %d clients connected: going on",
                    client_manager.num_available(),
                    wanted,
                )
        available = client_manager.num_available()
        n = max(1, int(math.ceil(fraction * available)))
        return client_manager.sample(num_clients=n, min_num_clients=n)

    def eval_in_fit(self, server_round: int) -> bool:
        """Whether this round's fit replies carry the previous round's evaluation."""
        return self.cfg.eval_in_fit and server_round >= 2

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if server_round - 1 in self.rounds:
            self.rounds[server_round - 1].ended = time.perf_counter()
        self.rounds[server_round] = rl = RoundLog()
        out = []
        sample = self._sample(client_manager, self.cfg.fraction_fit)
        self._fit_sample = (len(sample), client_manager.num_available())
        for proxy in sample:
            key = self.key_of(proxy)
            payload = self.payload_for(key, server_round)
            rl.bytes_down += payload_bytes(payload)
            config: dict[str, Scalar] = {"server-round": self.round_offset + server_round}
            if self.cfg.dp_mode == "distributed":  # each client's noise share depends on it
                config[DP_PARTICIPANTS] = len(sample)
            config.update(self.client_config(key, server_round))
            if self.eval_in_fit(server_round):
                config[EVALUATE_FIRST] = True
            out.append((proxy, FitIns(payload, config)))
        rl.marks["configure"] = time.perf_counter()
        return out

    def check_reply(self, client_key: str, arrays: NDArrays, num_examples: int) -> str | None:
        """None if a reply is acceptable, else the reason to reject it."""
        spec = self.expected_spec(client_key)
        if len(arrays) != len(spec):
            return f"{len(arrays)} tensors, expected {len(spec)}"
        for s, a in zip(spec, arrays):
            problem = s.matches(a)
            if problem:
                return problem
            if a.dtype.kind == "f" and a.size and float(np.abs(a).max()) > self.cfg.max_abs_value:
                return f"'{s.name}' has |value| {float(np.abs(a).max()):.3g} > max-abs-value"
        if num_examples <= 0:
            return f"num_examples is {num_examples}"
        return None

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        rl = self.rounds.setdefault(server_round, RoundLog())
        rl.marks["waiting for clients"] = time.perf_counter()
        rl.failures = len(failures)
        for failure in failures:
            log.warning("round %d: a client failed: %s", server_round, failure_reason(failure))
        accepted: list[Reply] = []
        for proxy, res in results:
            key = res.metrics.get(CLIENT_KEY)
            rl.bytes_up += payload_bytes(res.parameters)
            who = f"client {key!r} (node {proxy.node_id})"
            if not isinstance(key, str) or not key:
                reason = "no client-key in its metrics"
            else:
                try:
                    arrays = parameters_to_ndarrays(res.parameters)
                    # the decoded arrays are what is kept: drop this reply's reference to
                    # the bytes (at 10,000 clients a round's replies are gigabytes); not
                    # in place: SecAgg+ hands every reply one shared Parameters object
                    res.parameters = Parameters(tensors=[], tensor_type=res.parameters.tensor_type)
                    if self.cfg.secure_aggregation:
                        arrays = self.from_secure_sum(server_round, arrays)
                    reason = self.check_reply(key, arrays, res.num_examples)
                except Exception as err:  # noqa: BLE001 - undecodable bytes
                    reason = f"undecodable payload ({type(err).__name__}: {err})"
            if reason is None:
                reason = self.bind(proxy.node_id, key)
            if reason is None:
                bad = [
                    k
                    for k, v in res.metrics.items()
                    if isinstance(v, float) and not math.isfinite(v)
                ]
                if bad:
                    reason = f"non-finite metrics {bad}"
            if reason is not None:
                log.warning("round %d: rejected reply from %s: %s", server_round, who, reason)
                rl.rejected.append(f"{key}: {reason}")
                continue
            accepted.append(Reply(key, arrays, int(res.num_examples), dict(res.metrics)))
            train_loss = res.metrics.get("train-loss")
            if isinstance(train_loss, (int, float)) and math.isfinite(train_loss):
                rl.train_losses.append(float(train_loss))
        rl.replies = len(accepted)
        self.check_class_lists(server_round, accepted)
        refusals = [r for r in map(failure_reason, failures) if REFUSED in r]
        if not accepted and refusals and len(refusals) == len(failures):
            raise RunRefused(
                f"round {server_round}: every site asked refused this run by its policy, "
                f"nothing was sent; first: {refusals[0]}"
            )
        if self.eval_in_fit(server_round):  # the previous round's record, from these replies
            self.record_round(server_round - 1, self.evaluations_in_fit(accepted))
        if len(accepted) < self.cfg.min_replies:
            log.error(
                "round %d: %d acceptable replies, fewer than min-replies=%d: the round is "
                "skipped and the global state kept",
                server_round,
                len(accepted),
                self.cfg.min_replies,
            )
            return self.global_payload(), {}
        accepted.sort(key=lambda r: r.client_key)  # order-independent aggregation
        if not self.cfg.secure_aggregation and self.cfg.dp_mode == "off":
            accepted = self.bound_replies(server_round, accepted)
            if not accepted:
                log.error(
                    "round %d: every reply was rejected: the global state is kept", server_round
                )
                return self.global_payload(), {}
        if self.cfg.dp_mode == "server":
            for r in accepted:
                clip_update(r.arrays, self.global_arrays, self.cfg.dp_clipping_norm)
        dp = self.cfg.dp_mode != "off"
        before = [a.astype(np.float64) for a in self.global_arrays] if dp else []
        self.aggregate(server_round, accepted)
        if dp:
            self.release_dp(server_round, before, len(accepted))
        self.save_checkpoint(server_round)
        rl.marks["aggregate"] = time.perf_counter()
        return self.global_payload(), {"replies": len(accepted)}

    def check_class_lists(self, server_round: int, replies: list[Reply]) -> None:
        """Stop the run, before anything is aggregated, when sites report different
        class lists (each site's label ids come from its own; give ``class-names``)."""
        for r in replies:
            fingerprint = r.metrics.get(CLASSES_KEY)
            if isinstance(fingerprint, str) and fingerprint:
                self.class_lists[r.client_key] = fingerprint
        groups: dict[str, list[str]] = {}
        for key, fingerprint in sorted(self.class_lists.items()):
            groups.setdefault(fingerprint, []).append(key)
        if len(groups) > 1:
            sides = "; ".join(", ".join(keys) for keys in groups.values())
            raise ClassListMismatch(
                f"round {server_round}: the sites' class lists differ ({sides} each have one "
                "of their own), so the same label id means different classes: nothing was "
                "aggregated. Give the run config key 'class-names' (every class, in order) "
                "and each site maps its labels by name"
            )

    def bound_replies(self, server_round: int, replies: list[Reply]) -> list[Reply]:
        """What one client can do, bounded (strategies/robust.py): weights capped at
        weight-cap x the median count, updates at update-norm-bound x the median norm."""
        cfg = self.cfg
        rl = self.rounds.setdefault(server_round, RoundLog())
        for r, n in zip(replies, capped_counts([r.num_examples for r in replies], cfg.weight_cap)):
            if n < r.num_examples:
                rl.extra["weights_capped"] = rl.extra.get("weights_capped", 0) + 1
                r.num_examples = n
        decoded: dict[int, NDArrays] = {}  # each distinct payload decoded once, not per reply
        references = []
        for r in replies:
            payload = self.payload_for(r.client_key, server_round)
            if id(payload) not in decoded:
                decoded[id(payload)] = parameters_to_ndarrays(payload)
            references.append(decoded[id(payload)])
        uploads, check = bound_updates(
            [r.arrays for r in replies], references, cfg.update_norm_bound, cfg.update_norm_action
        )
        for r, u in zip(replies, uploads):
            r.arrays = u
        if check.limit is not None:
            rl.extra.update(update_norm_limit=check.limit, updates_clipped=check.clipped)
        for i in check.rejected or []:
            reason = f"update norm above update-norm-bound x the median ({check.limit:.3g})"
            log.warning(
                "round %d: rejected reply from %r: %s", server_round, replies[i].client_key, reason
            )
            rl.rejected.append(f"{replies[i].client_key}: {reason}")
        keep = [r for i, r in enumerate(replies) if i not in set(check.rejected or [])]
        return keep

    def from_secure_sum(self, server_round: int, arrays: NDArrays) -> NDArrays:
        """SecAgg+ hands every reply the same unmasked weighted mean, dequantized to
        float64: back to the spec's dtypes (integers rounded). The usual per-reply
        checks (shape, finite, max-abs-value) then check that aggregate, and the
        round records its largest value against the clipping range (a value at the
        range was clipped)."""
        if len(arrays) != len(self.spec):
            return arrays  # check_reply rejects it
        out = []
        for s, a in zip(self.spec, arrays):
            out.append((np.rint(a) if np.dtype(s.dtype).kind in "iu" else a).astype(s.dtype))
        largest = max((float(np.abs(a).max()) for a in arrays if a.size), default=0.0)
        extra = self.rounds.setdefault(server_round, RoundLog()).extra
        extra["secagg_aggregate_max_abs"] = largest
        extra["secagg_clipping_range"] = self.cfg.secagg_clipping_range
        if largest >= self.cfg.secagg_clipping_range * (1 - 1e-6):
            log.warning(
                "round %d: the secure aggregate reaches secagg-clipping-range=%g: values "
                "were clipped; raise the range",
                server_round,
                self.cfg.secagg_clipping_range,
            )
        return out

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Turn the accepted replies into the next global shared tensors."""
        if not self.spec:
            return
        if self.aggregation in ("median", "trimmed-mean"):
            arrays = [r.arrays for r in replies]
            self.set_global(robust_mean(arrays, self.aggregation, self.cfg.trim_fraction))
            return
        if self.aggregation == "mean":
            weights = [1.0] * len(replies)
        else:
            weights = [float(r.num_examples) for r in replies]
        self.set_global(weighted_mean([r.arrays for r in replies], weights))

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if self.cfg.eval_in_fit and server_round < self.cfg.num_server_rounds:
            return []  # the next round's fit replies carry this round's evaluation
        rl = self.rounds.setdefault(server_round, RoundLog())
        out = []
        for proxy in self._sample(client_manager, self.cfg.fraction_evaluate):
            key = self.key_of(proxy)
            payload = self.payload_for(key, server_round)
            rl.bytes_down_eval += payload_bytes(payload)
            config: dict[str, Scalar] = {"server-round": self.round_offset + server_round}
            config.update(self.client_config(key, server_round))
            out.append((proxy, EvaluateIns(payload, config)))
        return out

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        evals = []
        for proxy, res in results:
            e = Evaluation(res.metrics.get(CLIENT_KEY), res.loss, res.num_examples, res.metrics)
            problem = e.problem() or self.bind(proxy.node_id, str(e.client_key))
            if problem is not None:
                log.warning(
                    "round %d: rejected evaluation from node %d (%s): metrics %r",
                    server_round,
                    proxy.node_id,
                    problem,
                    dict(res.metrics),
                )
                continue
            evals.append(e)
        return self.record_round(server_round, evals)

    def evaluations_in_fit(self, replies: list[Reply]) -> list[Evaluation]:
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
            e = Evaluation(
                r.client_key, loss, int(n) if isinstance(n, (int, float)) else 0, metrics
            )
            if e.problem() is None:
                out.append(e)
        return out

    def round_extras(self, server_round: int, evals: list[Evaluation]) -> dict[str, Any]:
        """Method-specific entries of a round's record (FedCP's PIR)."""
        return {}

    def record_round(
        self, server_round: int, evals: list[Evaluation]
    ) -> tuple[float | None, dict[str, Scalar]]:
        """One round's record in results.json, from its clients' evaluations."""
        rl = self.rounds.setdefault(server_round, RoundLog())
        if not evals:
            log.error("round %d: no usable evaluation replies", server_round)
            return None, {}
        per_client = {str(e.client_key): float(e.metrics["accuracy"]) for e in evals}
        counts = {str(e.client_key): int(e.num_examples) for e in evals}
        losses = [float(e.loss) for e in evals if math.isfinite(float(e.loss))]
        extras: dict[str, list[float]] = {}
        for e in evals:
            for name, value in e.metrics.items():
                if name.startswith(RECORDED_METRICS) and isinstance(value, (int, float)):
                    extras.setdefault(name, []).append(float(value))
        keys = sorted(per_client)
        mean = float(np.mean([per_client[k] for k in keys]))
        pooled = sum(per_client[k] * counts[k] for k in keys) / sum(counts.values())
        record: dict[str, Any] = {
            "round": self.round_offset + server_round,
            "accuracy_mean": mean,
            "accuracy_pooled": float(pooled),
            "loss_mean": float(np.mean(losses)) if losses else None,
            "train_loss_mean": float(np.mean(rl.train_losses)) if rl.train_losses else None,
            "per_client_accuracy": {k: per_client[k] for k in keys},
            "bytes_down": rl.bytes_down,
            "bytes_up": rl.bytes_up,
            "bytes_down_eval": rl.bytes_down_eval,
            "seconds": (rl.ended or time.perf_counter()) - rl.started,
            "server_seconds": rl.server_seconds(),
            "replies": rl.replies,
            "rejected": rl.rejected,
            "failures": rl.failures,
        }
        for name, values in sorted(extras.items()):
            record[name.replace("-", "_") + "_mean"] = float(np.mean(values))
        record.update(self.round_extras(server_round, evals))
        record.update(rl.extra)
        if self.recorder is not None:
            self.recorder.add_round(record)
        return None, {"accuracy": mean, "accuracy-pooled": float(pooled)}

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return None  # personalised models are evaluated on the clients only
