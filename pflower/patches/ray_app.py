"""``ray-app-once``: the Ray simulation sends its actors the ClientApp once, not with
every message."""

from __future__ import annotations

from typing import Any

from pflower.patches.core import check, enabled


def in_place() -> bool:
    """Whether ``ray-app-once`` is applied in this process."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    return bool(getattr(BasicActorPool.submit, "_pflower_app_once", False))


def ray_app_once() -> bool:
    """``ray-app-once``: Flower's Ray backend passes each job its ``app_fn`` (in
    simulation a closure that returns the loaded ClientApp) as an argument of the
    actor call, so Ray cloudpickles the ClientApp, its mods and their closures by
    value for every message: 0.5-2.3 ms of the simulation process's CPU a message
    (more the more modules are loaded: cloudpickle walks ``sys.modules``), holding
    the GIL the streamed fold and the other submissions wait for. Here the pool
    stores that function in Ray's object store once (``ray.put``) and passes its
    reference, which Ray resolves to the same function in the actor before the call:
    the actor runs what it ran before. Returns whether it is in place."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    if in_place():
        return True
    if not enabled():
        return False
    check(("flwr",))
    submit = BasicActorPool.submit

    def submit_once(self: Any, actor_fn: Any, job: tuple[Any, Any, str, Any]) -> Any:
        import ray

        app_fn, message, cid, context = job
        stored = getattr(self, "_pflower_app", None)
        if stored is None or stored[0] is not app_fn:  # a pool keeps one app_fn
            stored = (app_fn, ray.put(app_fn))  # the reference keeps it in the store
            self._pflower_app = stored
        return submit(self, actor_fn, (stored[1], message, cid, context))

    submit_once._pflower_app_once = True  # type: ignore[attr-defined]
    submit_once._pflower_flower = submit  # type: ignore[attr-defined]
    BasicActorPool.submit = submit_once
    return True


def when_the_engine_starts() -> bool:
    """Apply the Ray patches (``ray-app-once``, ``ray-two-in-flight``) when the
    simulation engine starts (``vce_api.run_api``, which builds the Ray backend), not
    at import: a process that imports the apps without running the engine (a
    deployed ServerApp, a ClientApp) never imports Ray. Returns whether they will be
    applied."""
    from flwr.server.superlink.fleet.vce import vce_api

    from pflower.patches.ray_pipeline import ray_two_in_flight

    if getattr(vce_api.run_api, "_pflower_ray", False):
        return True
    if not enabled():
        return False
    check(("flwr",))
    run_api = vce_api.run_api

    def run_api_patched(*args: Any, **kwargs: Any) -> Any:
        ray_app_once()
        ray_two_in_flight()
        return run_api(*args, **kwargs)

    run_api_patched._pflower_ray = True  # type: ignore[attr-defined]
    vce_api.run_api = run_api_patched
    return True
