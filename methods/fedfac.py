"""FedSplit / FedFac (METHODS.md section 4): an element-level split of the layers
in ``fa-layers`` by factor analysis, static (FA once) or dynamic (FA every round).

Split rule: no whole tensor is personal; the per-element split lives in the
strategy (FA) and travels as a mask. Schedule: plain local training of the whole
model. Aggregation: sample-weighted mean of the shared elements. The paper's Adam,
lr 1e-3 is the ``auto`` schedule (run_config/defaults.py); ``fa-layers`` resolves
per backbone and is checked against the model (``check_fa_layers``).
"""

from __future__ import annotations

from glob import escape

from methods import Method
from models.fedfac import PERSONAL_ROWS, check_fa_layers, parse_layers
from models.roles import nothing_personal
from pfl_privacy.disclosure import Disclosure
from run_config.schema import RunConfig


def fedfac_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """Dynamic FedFac runs FA on every row each round, so every row goes up, the
    personal ones included (the paper's protocol); static uploads every row only in
    round 1, before any row is personal. Ensemble sends whole personalised models."""
    out = []
    if cfg.method == "fedfac-dynamic" and cfg.fa_split == "fa":
        rows = tuple(f"{layer}.*{escape(PERSONAL_ROWS)}" for layer in parse_layers(cfg.fa_layers))
        keys = "method='fedfac-dynamic'" + (" fa-input='updates'" * (cfg.fa_input == "updates"))
        out.append(Disclosure("personal-rows", rows, keys))
    if cfg.new_client_mode == "ensemble" and (cfg.new_clients or cfg.new_client_sites.strip()):
        out.append(Disclosure("whole-model", ("*",), "new-client-mode='ensemble'"))
    return tuple(out)


_CLIENT = "client_app.fedfac:FedFacClient"
_STRATEGY = "strategies.fedfac:FedFacStrategy"

METHODS = {
    m.name: m
    for m in (
        Method(
            name,
            nothing_personal,
            _CLIENT,
            _STRATEGY,
            check=check_fa_layers,
            disclosures=fedfac_disclosures,
        )
        for name in ("fedfac-static", "fedfac-dynamic")
    )
}
