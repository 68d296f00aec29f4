"""FedDecomp = (split: A and B personal; schedule: tau then sigma; aggregation:
plain mean), on a model whose every weight is sigma + low-rank tau."""

from __future__ import annotations

from client_app.feddecomp import FedDecompClient
from methods import Method
from models.feddecomp import decompose, feddecomp_split
from strategies.feddecomp import FedDecompStrategy

METHODS = {
    "feddecomp": Method(
        "feddecomp", feddecomp_split, FedDecompClient, FedDecompStrategy, transform=decompose
    ),
}
