"""Probes: numbers computed from a finished run's results.json and what the run's
config implies (never by reaching into a strategy). Each returns a flat dict that
the runner stores as ``results["probe"]`` and the report can tabulate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def fedfac_recovery(results: dict[str, Any], clients: int) -> dict[str, float]:
    """FedFac's simulation study (paper Sec. 4.3): the share of hidden neurons whose
    final shared/personal label equals the generating teacher's."""
    from pfl_data import simulation_study
    from run_config.schema import parse_run_config

    masks = results["rounds"][-1].get("fa_shared_mask") or {}
    if len(masks) != 1:
        raise ValueError(f"the recovery probe needs one split layer, got {list(masks)}")
    (mask,) = masks.values()
    truth = simulation_study(parse_run_config(results["config"]), clients).shared_neurons
    return {"index_recovery": float((np.asarray(mask, bool) == truth).mean())}


PROBES: dict[str, Callable[[dict[str, Any], int], dict[str, float]]] = {
    "fedfac-recovery": fedfac_recovery,
}
