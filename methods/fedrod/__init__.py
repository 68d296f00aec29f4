"""FedRoD (Chen and Chao, ICLR 2022, "On Bridging Generic and Personalized Federated
Learning for Image Classification"): one model serves both goals. A shared body and
a shared generic head are trained with the balanced softmax (the client's label
prior added to the logits), so the generic head learns the class-balanced risk that
the union of clients would have; a personal head adds its logits to the generic
head's and learns the client's own distribution.

Split: the personal head (``personal_head.*``) stays home. Schedule: each batch, the
body and generic head take a balanced-softmax step, the personal head a
cross-entropy step on generic + personal logits (the body's features and the
generic logits detached for it). Aggregation: FedAvg's sample-weighted mean of the
body and generic head. Evaluation: generic + personal logits.

Its local schedule here is the baselines' per backbone (as Ditto's), not tuned.
"""

from __future__ import annotations

from methods import Method
from methods.baselines import baseline_schedule

METHODS = (
    Method(
        "fedrod",
        schedule=baseline_schedule,
        pfllib="FedROD",
    ),
)
