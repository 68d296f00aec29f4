"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma and Guan, AAAI 2023, "FedALA: Adaptive
Local Aggregation for Personalized Federated Learning"; docs/fedala.md): before it
trains, each client mixes the received global model into its own previous local
model element-wise on the top layers, theta = theta_prev + (theta_global -
theta_prev) * W, with W in [0, 1] learned by gradient descent on a random share of
its training data; the lower layers take the global values outright. Then ordinary
local training.

Split: the network (``net.*``) travels; the previous local model's top layers
(``previous.*``), W (``weights.*``) and the client's phase (``phase``) stay home.
Schedule: W learned until its loss settles the first time the client has a local
model to mix into, one pass over the sample at each later fit; then ``local-epochs``
on the mixed model. Aggregation: FedAvg's sample-weighted mean (the base's).
Evaluation: the mix of the received model with the kept W (no W step).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams


class FedAlaParams(MethodParams):
    namespace: ClassVar[str] = "fedala"
    # PFLlib's defaults are these: -et 1.0, -s 80, -p 2 (main.py:484-486) and ALA's
    # threshold 0.1 and window 10 (utils/ALA.py:19-20); the profile changes none of them
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {"pfllib": {}}

    # the top parameter tensors ALA mixes, counted as PFLlib's -p counts them (2: the
    # last layer's weight and bias, the paper's p = 1 layer); 0: every tensor (ALA.py:30)
    layers: int = Field(2, alias="layers", ge=0)
    # W's step size (the paper's eta)
    eta: float = Field(1.0, alias="eta", ge=0)
    # the share of the client's training data W learns on, in percent (the paper's s)
    rand_percent: int = Field(80, alias="rand-percent", gt=0, le=100)
    # W's first learning stops once the standard deviation of its last num-pre-loss
    # recorded losses is under this
    threshold: float = Field(0.1, alias="threshold", gt=0)
    num_pre_loss: int = Field(10, alias="num-pre-loss", ge=1)
    # at most this many passes in W's first learning (PFLlib's loop has no bound)
    max_start_epochs: int = Field(100, alias="max-start-epochs", ge=1)


METHODS = (
    Method(
        "fedala",
        params=FedAlaParams,
        pfllib="FedALA",
        schedule=baseline_schedule,
    ),
)
