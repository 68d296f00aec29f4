"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, MLSys 2020, "Federated
Optimization in Heterogeneous Networks"; docs/fedprox.md): FedAvg whose clients
minimise their loss plus mu/2 ||w - w_g||^2, w_g the global model they received
(held fixed while they train), so that heterogeneous clients drift less far from it.

Split: nothing is personal (as FedAvg). Schedule: ``local-epochs`` of cross-entropy
plus the proximal term, the baselines' local solver per backbone. Aggregation:
FedAvg's sample-weighted mean. Evaluation: the global model.

The paper tunes mu per data set from {0.001, 0.01, 0.1, 1}; its authors' README
says no mu suits every setting. 0.01 here: the grid's value the paper kept for its
neural-network (LSTM) task Sent140 (1 went with its convex multinomial logistic
regressions), and this project's backbones are neural networks.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams, check_proximal_pull
from pflower.config.schema import RunConfig


class FedProxParams(MethodParams):
    namespace: ClassVar[str] = "fedprox"

    mu: float = Field(0.01, alias="mu", ge=0)  # the pull of the local model to w_g

    def check(self, cfg: RunConfig) -> None:
        check_proximal_pull("fedprox.mu", self.mu, cfg)


METHODS = (
    Method(
        "fedprox",
        params=FedProxParams,
        schedule=baseline_schedule,
        # PFLlib's -mu default 0 (main.py:449) is FedAvg: the profile keeps ours, 0.01
        pfllib="FedProx",
    ),
)
