"""FedCP's aggregation: the sample-weighted mean of each shared group (phi, h_g,
CPN). The base's tensor-wise weighted mean is exactly that; this class adds the
per-client PIR (share of features routed to the personal head) to the round record."""

from __future__ import annotations

import numpy as np
from flwr.common import EvaluateRes, Scalar
from flwr.server.client_proxy import ClientProxy

from strategies.base import CLIENT_KEY, PFLStrategy, RoundLog


class FedCPStrategy(PFLStrategy):
    """Sample-weighted mean of phi, h_g and the CPN; records per-client PIR."""

    default_aggregation = "weighted"

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        pir: dict[str, float] = {}
        for _, res in results:
            key, value = res.metrics.get(CLIENT_KEY), res.metrics.get("pir")
            if isinstance(key, str) and isinstance(value, (int, float)) and 0 <= value <= 1:
                pir[key] = float(value)
        if pir:
            rl = self.rounds.setdefault(server_round, RoundLog())
            rl.extra["per_client_pir"] = {k: pir[k] for k in sorted(pir)}
            rl.extra["pir_mean"] = float(np.mean(list(pir.values())))
        return super().aggregate_evaluate(server_round, results, failures)
