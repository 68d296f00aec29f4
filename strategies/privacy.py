"""Privacy of the shared update on the server: SecAgg+'s sum back to the wire's
dtypes, and DP-FedAvg's release of a round (pflower.privacy does the arithmetic)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.common import NDArrays

from models.roles import TensorSpec
from pflower.config.schema import RunConfig
from pflower.privacy import (
    PrivacyAccountant,
    achieved_multiplier,
    add_noise,
    clip_update,
    noise_std,
)
from strategies.replies import Reply

log = logging.getLogger("flwr.pflower")

DP_HISTORY = "dp/accountant-history"  # in the checkpoint: the privacy already spent


def from_secure_sum(
    server_round: int,
    spec: list[TensorSpec],
    arrays: NDArrays,
    clipping_range: float,
    extra: dict[str, Any],
) -> NDArrays:
    """SecAgg+ hands every reply the same unmasked weighted mean, dequantized to
    float64: back to the spec's dtypes (integers rounded). The usual per-reply
    checks (shape, finite, max-abs-value) then check that aggregate, and the
    round records its largest value against the clipping range (a value at the
    range was clipped)."""
    if len(arrays) != len(spec):
        return arrays  # the reply check rejects it
    out = []
    for s, a in zip(spec, arrays):
        out.append((np.rint(a) if np.dtype(s.dtype).kind in "iu" else a).astype(s.dtype))
    largest = max((float(np.abs(a).max()) for a in arrays if a.size), default=0.0)
    extra["secagg_aggregate_max_abs"] = largest
    extra["secagg_clipping_range"] = clipping_range
    if largest >= clipping_range * (1 - 1e-6):
        log.warning(
            "round %d: the secure aggregate reaches secagg-clipping-range=%g: values "
            "were clipped; raise the range",
            server_round,
            clipping_range,
        )
    return out


def secure_decoder(
    server_round: int, cfg: RunConfig, spec: list[TensorSpec], extra: dict[str, Any]
) -> Callable[[NDArrays], NDArrays]:
    """What a fit reply's arrays go through before they are checked: unchanged, or
    under SecAgg+ ``from_secure_sum``."""
    if not cfg.secure_aggregation:
        return lambda arrays: arrays
    clip = cfg.secagg_clipping_range
    return lambda arrays: from_secure_sum(server_round, spec, arrays, clip, extra)


class DPRelease:
    """DP-FedAvg on the server: clipping (dp-mode=server), the noisy release of each
    round's mean and the accountant of the privacy spent (kept in the checkpoint)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.on = cfg.dp_mode != "off"
        self._accountant: PrivacyAccountant | None = None
        self.rng = np.random.default_rng()  # OS entropy: DP noise must not be predictable
        self.sample = (0, 0)  # (clients asked, clients available) in the last fit round

    @property
    def accountant(self) -> PrivacyAccountant:
        if self._accountant is None:
            self._accountant = PrivacyAccountant(self.cfg.dp_noise_multiplier, self.cfg.dp_delta)
        return self._accountant

    def clip(self, replies: list[Reply], global_arrays: NDArrays, extra: dict[str, Any]) -> None:
        """Each update clipped here, before the mean: dp-mode=server clips them all;
        dp-mode=client re-clips (the clients clipped already; an update above the
        norm came from a client that did not, and is logged). Under SecAgg+ the
        server sees only the sum, which it cannot clip per client."""
        if self.cfg.dp_mode not in ("server", "client") or self.cfg.secure_aggregation:
            return
        limit = self.cfg.dp_clipping_norm * (1 + 1e-4)  # float32 rounding of a clipped update
        over = []
        for r in replies:
            norm = clip_update(r.arrays, global_arrays, self.cfg.dp_clipping_norm)
            if self.cfg.dp_mode == "client" and norm > limit:
                over.append(f"{r.client_key} ({norm:.3g})")
        if over:
            log.warning(
                "dp-mode=client: %d update(s) above dp-clipping-norm=%g re-clipped: %s",
                len(over),
                self.cfg.dp_clipping_norm,
                ", ".join(over[:5]),
            )
            extra["dp_reclipped"] = len(over)

    def release(
        self,
        before: NDArrays,
        after: NDArrays,
        accepted: int,
        set_global: Callable[[NDArrays], None],
        extra: dict[str, Any],
    ) -> float:
        """One round's release; returns the epsilon spent so far. The clipped updates
        are summed over the ``accepted`` clients and divided by the number asked (a
        fixed denominator, McMahan et al. 2018): adding or removing one client's
        update moves the result by at most clipping-norm / asked, the sensitivity
        the noise is calibrated to. The server adds the noise (dp-mode client or
        server), or the clients did, each its share, under SecAgg+ (distributed).
        The accountant steps at this round's rate: clients asked / available."""
        cfg = self.cfg
        asked, available = self.sample
        asked = max(asked, accepted, 1)
        scaled = []
        for b, a in zip(before, after, strict=True):
            if a.dtype.kind == "f":
                a = (b + (accepted / asked) * (a.astype(np.float64) - b)).astype(a.dtype)
            scaled.append(a)
        target = cfg.dp_noise_multiplier
        std = noise_std(target, cfg.dp_clipping_norm, asked)
        achieved = target
        if cfg.dp_mode != "distributed":
            add_noise(scaled, std, self.rng)  # replaces the float arrays, not in place
        else:  # only the shares of the clients whose replies were summed are in it
            achieved = achieved_multiplier(target, accepted, asked)
            std = achieved * cfg.dp_clipping_norm / asked
            if achieved < target:
                log.warning(
                    "dp-mode=distributed: %d of the %d clients asked replied, so the "
                    "aggregate holds noise multiplier %.3g, below the target %g; epsilon "
                    "counts the noise that arrived",
                    accepted,
                    asked,
                    achieved,
                    target,
                )
        set_global(scaled)
        self.accountant.step(min(1.0, asked / max(available, asked)), achieved)
        epsilon = self.accountant.epsilon()
        extra.update(dp_epsilon=epsilon, dp_noise_std=std, dp_sample_rate=asked / max(available, 1))
        extra.update(dp_noise_multiplier_target=target, dp_noise_multiplier_achieved=achieved)
        return epsilon

    def state(self) -> dict[str, np.ndarray]:
        return {DP_HISTORY: self._accountant.history()} if self._accountant is not None else {}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        if DP_HISTORY in arrays:
            self.accountant.restore(arrays[DP_HISTORY])
