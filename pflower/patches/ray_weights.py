"""``ray-weights-once``: the Ray simulation stores a round's weights in Ray's object
store once, not once in every message that carries them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

FLAG = "_pflower_weights_once"  # marks the submit wrapper
MIN_BYTES = 64 * 1024  # an array smaller than this travels inside its message, as before
FIRST_SEEN = 4096  # ids of large arrays sent once, in case another message sends them
ACTOR_CACHE_BYTES = 256 * 1024 * 1024  # what an actor keeps of the arrays it fetched


class _Sender:
    """The simulation process's side. A large array's bytes sent in a second message
    (the same object: a round's instructions share the global model's arrays) are
    stored once (``ray.put``), and every message after that carries the reference.
    A message that sends arrays a second time and none of the stored ones begins a
    new round's set: the last set's references are dropped (Ray keeps an object alive
    while a submitted call still holds its reference)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # Flower's engine submits from several threads
        self.stored: dict[int, tuple[bytes, Any]] = {}  # id(data) -> (data, reference)
        # ids only: a reused id costs one needless put, never a wrong array
        self.first_seen: OrderedDict[int, None] = OrderedDict()

    def sending(self, message: Any) -> None:
        """Decide, before ``message`` is pickled, which of its arrays go by reference."""
        import ray
        from flwr.app import Message

        if not isinstance(message, Message) or not message.has_content():
            return  # an error message (or a test's stand-in): nothing to store
        large = [
            array.data
            for record in message.content.array_records.values()
            for array in record.values()
            if len(array.data) >= MIN_BYTES
        ]
        with self.lock:
            hits = any(self.ref(d) is not None for d in large)
            again = [d for d in large if id(d) in self.first_seen and self.ref(d) is None]
            if again and not hits:
                self.stored.clear()  # the last round's arrays: no message sends them now
            for data in again:
                del self.first_seen[id(data)]
                self.stored[id(data)] = (data, ray.put(data))
            for data in large:
                if self.ref(data) is None:
                    self.first_seen[id(data)] = None
                    self.first_seen.move_to_end(id(data))
            while len(self.first_seen) > FIRST_SEEN:
                self.first_seen.popitem(last=False)

    def ref(self, data: bytes) -> Any:
        """The reference ``data`` travels as, or None: inside its message."""
        found = self.stored.get(id(data))
        return found[1] if found is not None and found[0] is data else None


def _reduce(array: Any) -> tuple[Any, ...]:
    """How Ray pickles a flwr ``Array`` in the simulation process: its stored bytes as
    their reference, the rest as before (``_chunks`` is a cache of the bytes)."""
    state = {k: v for k, v in array.__dict__.items() if k != "_chunks"}
    data = state.pop("data")
    with SENDER.lock:
        ref = SENDER.ref(data)
    return type(array), state, data if ref is None else None, ref


_fetched: OrderedDict[bytes, bytes] = OrderedDict()
_fetched_lock = threading.Lock()


def _unreduce(reduced: tuple[Any, ...]) -> Any:
    """The actor's side: the ``Array`` again, its stored bytes fetched once an actor
    (the same bytes object for every message that references them)."""
    cls, state, data, ref = reduced
    if data is None:
        import ray

        key = ref.binary()
        with _fetched_lock:
            data = _fetched.get(key)
            if data is not None:
                _fetched.move_to_end(key)
        if data is None:
            data = ray.get(ref)
            with _fetched_lock:
                _fetched[key] = data
                while sum(map(len, _fetched.values())) > ACTOR_CACHE_BYTES and len(_fetched) > 1:
                    _fetched.popitem(last=False)
    array = cls.__new__(cls)
    array.__dict__.update(state)
    array.__dict__["data"] = data
    return array


SENDER = _Sender()


def in_place() -> bool:
    """Whether ``ray-weights-once`` is applied in this process."""
    from pflower.patches import ray_app

    return ray_app.in_place(FLAG)


def ray_weights_once() -> bool:
    """``ray-weights-once``: Flower's Ray backend passes each message to its actor as
    an argument of the call, so Ray pickles the message's arrays into the object
    store once a message and the actor unpickles its own copy: for a round of FedAvg
    the same global weights, serialized, stored and copied again for every client
    (Ray alone, this machine: a call carrying and returning 3.5 MB took 4.15 ms of
    the caller's CPU and 4.65 of the actor's; 1.95 and 3.75 by reference). Here a
    large array's bytes, once a second message sends the same object, are stored
    once (``ray.put``), and the messages carry its reference (Ray's
    ``register_serializer`` for flwr's ``Array``, in the simulation process only); an
    actor fetches each stored array once and hands the same bytes to each message
    that references them. The ClientApp receives equal arrays in the same message:
    what it computes does not change. Returns whether it is in place."""
    from pflower.patches.ray_app import wrap_submit

    def wrap(submit: Callable[..., Any]) -> Callable[..., Any]:
        def submit_weights_once(self: Any, actor_fn: Any, job: tuple[Any, ...]) -> Any:
            if not getattr(self, "_pflower_weights", False):  # once a pool: Ray is up
                register()
                self._pflower_weights = True
            SENDER.sending(job[1])
            return submit(self, actor_fn, job)

        return submit_weights_once

    return wrap_submit(FLAG, wrap)


def register() -> None:
    """Ray pickles flwr's ``Array`` with ``_reduce`` in this process (Ray's own API:
    the unpickling function travels with each array, so actors need nothing)."""
    import ray.util
    from flwr.app import Array

    ray.util.register_serializer(Array, serializer=_reduce, deserializer=_unreduce)
