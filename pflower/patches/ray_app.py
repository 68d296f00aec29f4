"""``ray-app-once``: the Ray simulation sends its actors the ClientApp once, not with
every message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pflower.patches.core import check, enabled


def in_place(flag: str = "_pflower_app_once") -> bool:
    """Whether the patch that marks its ``BasicActorPool.submit`` wrapper with ``flag``
    (default: ``ray-app-once``) is applied in this process."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    submit = BasicActorPool.submit
    while submit is not None:  # each wrapper keeps the one it wraps
        if getattr(submit, flag, False):
            return True
        # ours, or another's that says what it wraps (functools.wraps): a wrapper on top
        # must not hide the patch, or it would be applied twice (the inner one would
        # then put the outer one's reference into Ray's store: an error each message)
        inner = getattr(submit, "_pflower_flower", None)
        submit = inner if inner is not None else getattr(submit, "__wrapped__", None)
    return False


def wrap_submit(flag: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace Flower's ``BasicActorPool.submit`` with ``wrap(submit)``, marked with
    ``flag``, once a process; False with the patches off."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    if in_place(flag):
        return True
    if not enabled():
        return False
    check(("flwr",))
    submit = BasicActorPool.submit
    wrapped = wrap(submit)
    setattr(wrapped, flag, True)
    wrapped._pflower_flower = submit  # type: ignore[attr-defined]
    BasicActorPool.submit = wrapped
    return True


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

    def wrap(submit: Callable[..., Any]) -> Callable[..., Any]:
        def submit_once(self: Any, actor_fn: Any, job: tuple[Any, Any, str, Any]) -> Any:
            import ray

            app_fn, message, cid, context = job
            stored = getattr(self, "_pflower_app", None)
            if stored is None or stored[0] is not app_fn:  # a pool keeps one app_fn
                stored = (app_fn, ray.put(app_fn))  # the reference keeps it in the store
                self._pflower_app = stored
            return submit(self, actor_fn, (stored[1], message, cid, context))

        return submit_once

    return wrap_submit("_pflower_app_once", wrap)
