"""The Ray patches applied together when Flower's simulation engine starts:
``ray-app-once`` (pflower/patches/ray_app.py), ``ray-two-in-flight``
(ray_pipeline.py) and ``ray-weights-once`` (ray_weights.py)."""

from __future__ import annotations

import functools
from typing import Any

from pflower.patches.core import check, enabled
from pflower.patches.ray_app import ray_app_once
from pflower.patches.ray_pipeline import ray_two_in_flight
from pflower.patches.ray_weights import ray_weights_once


def when_the_engine_starts() -> bool:
    """Apply the Ray patches (``ray-app-once``, ``ray-two-in-flight``,
    ``ray-weights-once``) when the simulation engine starts (``vce_api.run_api``,
    which builds the Ray backend), not at import: a process that imports the apps
    without running the engine (a deployed ServerApp, a ClientApp) never imports
    Ray. Returns whether they will be applied."""
    from flwr.server.superlink.fleet.vce import vce_api

    if getattr(vce_api.run_api, "_pflower_ray", False):
        return True
    if not enabled():
        return False
    check(("flwr",))
    run_api = vce_api.run_api

    @functools.wraps(run_api)  # what it wraps stays visible (``sparse-node-stores``)
    def run_api_patched(*args: Any, **kwargs: Any) -> Any:
        ray_app_once()
        ray_two_in_flight()
        ray_weights_once()
        return run_api(*args, **kwargs)

    run_api_patched._pflower_ray = True  # type: ignore[attr-defined]
    vce_api.run_api = run_api_patched
    return True
