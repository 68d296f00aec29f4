"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020, "Personalized Federated
Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach";
docs/per_fedavg.md): the federation learns an initial model w that each client
personalises with one gradient step of its own, F_i(w) = f_i(w - alpha grad f_i(w)).

Split: nothing personal; the whole model travels. Schedule: MAML-style meta steps,
each on fresh batches of the client's train split: w' = w - alpha grad f(w; D), then
w <- w - beta g with, ``first-order``, g = grad f(w'; D') (the gradient at w' applied
at w), or, ``hessian-free``, g = grad f(w'; D') - alpha d, d the finite-difference
Hessian-vector product (grad f(w + delta g'; D'') - grad f(w - delta g'; D'')) / (2
delta) of g' = grad f(w'; D'). The outer step is the run's optimizer at step size beta
(the baselines' mlp schedule: plain SGD, exactly the formula). Aggregation: the plain
mean of the returned models (the paper's 1/(rn) sum over the round's users; PFLlib
weighs by sample count). Evaluation: a copy of the received model after one SGD step
of alpha on one training batch, scored and dropped.

PFLlib runs the first-order variant only, with alpha = beta = the learning rate
(clientperavg.py: ``self.beta = self.learning_rate``, its ``--beta`` unread). Here
``beta`` is ``auto``: the run's ``lr``, the step the baselines' schedule tunes per
backbone. ``alpha`` 0.01 and ``delta`` 0.001 are the values the public
reimplementations take; the paper's own experiment values are not stored here to
check against (docs/per_fedavg.md).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams


class PerFedAvgParams(MethodParams):
    namespace: ClassVar[str] = "per-fedavg"
    auto_keys: ClassVar[tuple[str, ...]] = ("beta", "alpha", "variant")
    # PFLlib: alpha = beta = -lr 0.005 (clientperavg.py:13-16), the first-order step only
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {
        "pfllib": {"alpha": 0.005, "variant": "first-order"}
    }

    alpha: float = Field(0.01, alias="alpha", gt=0)  # the inner (personalisation) step
    beta: float = Field(0.05, alias="beta", gt=0)  # the outer (meta) step; auto: lr
    # the meta gradient: "first-order" drops the Hessian term, "hessian-free" estimates it
    variant: Literal["first-order", "hessian-free"] = "hessian-free"
    # the finite-difference step of the Hessian-vector product (hessian-free only): a
    # step as long as the gradient itself is no longer a local estimate of the curvature
    delta: float = Field(0.001, alias="delta", gt=0, lt=1)

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        lr = raw.get("lr")
        ok = isinstance(lr, int | float) and not isinstance(lr, bool) and lr > 0
        return {"beta": float(lr) if ok else 0.05}


METHODS = (
    Method(
        "per-fedavg",
        aggregation="mean",
        params=PerFedAvgParams,
        schedule=baseline_schedule,
        pfllib="PerAvg",
    ),
)
