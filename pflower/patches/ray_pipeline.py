"""``ray-two-in-flight``: each Ray actor of the simulation has its next message
waiting while it runs one, instead of idling between them."""

from __future__ import annotations

from typing import Any

from pflower.patches.core import check, enabled

IN_FLIGHT = 2  # messages handed to an actor at once: the one it runs and the next


def in_place() -> bool:
    """Whether ``ray-two-in-flight`` is applied in this process."""
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    return bool(getattr(BasicActorPool.add_actors_to_pool, "_pflower_in_flight", False))


def ray_two_in_flight() -> bool:
    """``ray-two-in-flight``: Flower's Ray backend runs one engine worker thread per
    actor, and a worker hands its actor the next message only when the last reply is
    back: an actor idled a median 11 ms between messages of 30-45 ms (measured: 3.5
    ms for the reply to reach the simulation process, 3 to serialize and submit the
    next message, 3 more until the actor's ClientApp call began). Here the pool lists
    each actor ``IN_FLIGHT`` times and the engine runs a worker per listing, so while
    an actor runs one message the next is already in its queue; Ray runs an actor's
    calls one at a time, in the order they were made. What remains between two calls
    is Ray's own (about 9 ms at the median: arguments deserialized, outputs stored).
    Each message is still run by one actor, whole, with its own node's context, so
    what a client computes does not change. Flower's engine starts at most
    ``min(32, cores + 4)`` workers; past that, some actors have one message in flight,
    as before. Returns whether it is in place."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    if in_place():
        return True
    if not enabled():
        return False
    check(("flwr",))
    add, terminate = BasicActorPool.add_actors_to_pool, BasicActorPool.terminate_all_actors

    def add_actors_to_pool(self: Any, num_actors: int) -> None:
        before = len(self.pool)
        add(self, num_actors)
        # every actor's first listing before any second one: the first messages of a
        # round go to different actors (the pool hands out its last listing first)
        self.pool[before:before] = self.pool[before:] * (IN_FLIGHT - 1)

    def terminate_all_actors(self: Any) -> None:
        self.pool = list(dict.fromkeys(self.pool))  # each actor once
        terminate(self)

    def num_workers(self: Any) -> int:
        return self.pool.num_actors * IN_FLIGHT if self.pool else 0

    add_actors_to_pool._pflower_in_flight = True  # type: ignore[attr-defined]
    BasicActorPool.add_actors_to_pool = add_actors_to_pool
    BasicActorPool.terminate_all_actors = terminate_all_actors
    RayBackend.num_workers = property(num_workers)  # the engine's worker threads
    return True
