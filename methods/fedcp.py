"""FedCP = (personal head only, CE + MMD with CPN routing, sample-weighted mean)."""

from __future__ import annotations

from methods import Method
from models.fedcp import fedcp_split, fedcp_transform

METHODS = {
    "fedcp": Method(
        "fedcp",
        fedcp_split,
        "client_app.fedcp:FedCPClient",
        "strategies.fedcp:FedCPStrategy",
        transform=fedcp_transform,
    )
}
