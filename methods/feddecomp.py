"""FedDecomp = (split: A and B personal; schedule: tau then sigma; aggregation:
plain mean of sigma, paper eq. 7; ``aggregation=weighted`` on request), on a
model whose every weight is sigma + low-rank tau."""

from __future__ import annotations

from methods import BASE_STRATEGY, Method
from models.feddecomp import decompose, feddecomp_split

METHODS = {
    "feddecomp": Method(
        "feddecomp",
        feddecomp_split,
        "client_app.feddecomp:FedDecompClient",
        BASE_STRATEGY,
        aggregation="mean",
        transform=decompose,
    ),
}
