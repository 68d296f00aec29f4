"""DualFed = (shared encoder + global classifier, personal projector + personal
classifier + BN statistics; stage-wise local schedule; plain mean)."""

from __future__ import annotations

from client_app.dualfed import DualFedClient
from methods import Method
from models.dualfed import dualfed_personal, to_dualfed
from strategies.dualfed import DualFedStrategy

METHODS = {
    "dualfed": Method("dualfed", dualfed_personal, DualFedClient, DualFedStrategy, to_dualfed),
}
