"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov and Morency,
2020, "Think Locally, Act Globally: Federated Learning with Local and Global
Representations"; docs/lg_fedavg.md): every client keeps its own feature extractor
(a local representation of its data) and the clients learn one classifier on top,
averaged as FedAvg averages a whole model: FedPer's split the other way round.

Split: the body (``features.*``, every entry but the head's) stays home; the head
(``head.*``) travels. Schedule: ``local-epochs`` of cross-entropy on the whole model
(local body and received head together), the baselines' local solver per backbone.
Aggregation: FedAvg's sample-weighted mean of the heads. Evaluation: the client's
own body under the received head.
"""

from __future__ import annotations

from methods import Method
from methods.baselines import baseline_schedule

METHODS = (
    Method(
        "lg-fedavg",
        schedule=baseline_schedule,
        pfllib="LG-FedAvg",
    ),
)
