"""FedCP's aggregation: the sample-weighted mean of each shared group (phi, h_g,
CPN). The base's tensor-wise weighted mean is exactly that; this class adds the
per-client PIR (share of features routed to the personal head) to the round record."""

from __future__ import annotations

import numpy as np
from flwr.common import Scalar

from strategies.base import Evaluation, PFLStrategy


class FedCPStrategy(PFLStrategy):
    """Sample-weighted mean of phi, h_g and the CPN; records per-client PIR."""

    def record_round(
        self, server_round: int, evals: list[Evaluation]
    ) -> tuple[float | None, dict[str, Scalar]]:
        pir: dict[str, float] = {}
        for e in evals:
            value = e.metrics.get("pir")
            if isinstance(value, (int, float)) and 0 <= value <= 1:
                pir[str(e.client_key)] = float(value)
        if pir:
            self.note(
                server_round,
                per_client_pir={k: pir[k] for k in sorted(pir)},
                pir_mean=float(np.mean(list(pir.values()))),
            )
        return super().record_round(server_round, evals)


STRATEGIES = {"fedcp": FedCPStrategy}
