"""FedSplit / FedFac (METHODS.md section 4): an element-level split of the layers
in ``fa-layers`` by factor analysis, static (FA once) or dynamic (FA every round).

Split rule: no whole tensor is personal; the per-element split lives in the
strategy (FA) and travels as a mask. Schedule: plain local training of the whole
model. Aggregation: sample-weighted mean of the shared elements. The paper's Adam,
lr 1e-3 is the ``auto`` schedule (run_config/defaults.py); ``fa-layers`` resolves
per backbone and is checked against the model (``check_fa_layers``).
"""

from __future__ import annotations

from methods import Method
from models.fedfac import check_fa_layers
from models.roles import nothing_personal

_CLIENT = "client_app.fedfac:FedFacClient"
_STRATEGY = "strategies.fedfac:FedFacStrategy"

METHODS = {
    m.name: m
    for m in (
        Method("fedfac-static", nothing_personal, _CLIENT, _STRATEGY, check=check_fa_layers),
        Method("fedfac-dynamic", nothing_personal, _CLIENT, _STRATEGY, check=check_fa_layers),
    )
}
