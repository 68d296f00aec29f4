"""The baselines: trivial choices of the three parts of a method."""

from __future__ import annotations

from methods import Method
from models.roles import bn_personal, everything_personal, head_personal, nothing_personal

METHODS = {
    m.name: m
    for m in (
        Method("fedavg", nothing_personal),
        Method("fedavg-ft", nothing_personal, "client_app.baseline_schedules:FedAvgFTClient"),
        Method("local", everything_personal),
        Method("fedper", head_personal),
        Method("fedrep", head_personal, "client_app.baseline_schedules:FedRepClient"),
        Method("fedbn", bn_personal),
    )
}
