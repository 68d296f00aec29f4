"""The baselines: trivial choices of the three parts of a method."""

from __future__ import annotations

from client_app.base import PFLClient
from client_app.baselines import FedAvgFTClient, FedRepClient
from methods import Method
from models.roles import bn_personal, everything_personal, head_personal, nothing_personal
from strategies.base import PFLStrategy

METHODS = {
    m.name: m
    for m in (
        Method("fedavg", nothing_personal, PFLClient, PFLStrategy),
        Method("fedavg-ft", nothing_personal, FedAvgFTClient, PFLStrategy),
        Method("local", everything_personal, PFLClient, PFLStrategy),
        Method("fedper", head_personal, PFLClient, PFLStrategy),
        Method("fedrep", head_personal, FedRepClient, PFLStrategy),
        Method("fedbn", bn_personal, PFLClient, PFLStrategy),
    )
}
