"""DualFed = (shared encoder + global classifier, personal projector + personal
classifier + BN statistics; stage-wise local schedule; plain mean, as the
reference averages models unweighted)."""

from __future__ import annotations

from methods import BASE_STRATEGY, Method
from models.dualfed import dualfed_personal, to_dualfed

METHODS = {
    "dualfed": Method(
        "dualfed",
        dualfed_personal,
        "client_app.dualfed:DualFedClient",
        BASE_STRATEGY,
        aggregation="mean",
        transform=to_dualfed,
    ),
}
