"""FedCP = (personal head only, CE + MMD with CPN routing, sample-weighted mean)."""

from __future__ import annotations

from client_app.fedcp import FedCPClient
from methods import Method
from models.fedcp import fedcp_split, fedcp_transform
from strategies.fedcp import FedCPStrategy

METHODS = {"fedcp": Method("fedcp", fedcp_split, FedCPClient, FedCPStrategy, fedcp_transform)}
