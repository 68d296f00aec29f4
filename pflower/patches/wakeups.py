"""``engine-wakeups``: the simulation engine hands a stored instruction to its
backend at once, not at its next 0.1 s look."""

from __future__ import annotations

import threading
from typing import Any

from pflower.patches.core import check, enabled

_stored = threading.Condition()  # notified whenever the LinkState stores an instruction
_generation = [0]  # instructions stored so far (read and bumped under _stored)


def generation() -> int:
    """How many instructions the in-memory LinkState has stored (the state to wait past)."""
    with _stored:
        return _generation[0]


def wait_past(seen: int, timeout: float) -> None:
    """Return once an instruction is stored after ``generation()`` was ``seen``, or
    after ``timeout`` s (the poll it replaces: a missed wake-up costs Flower's wait)."""
    with _stored:
        _stored.wait_for(lambda: _generation[0] != seen, timeout)


def in_place() -> bool:
    """Whether ``engine-wakeups`` is applied in this process."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    return bool(getattr(InMemoryLinkState, "_pflower_wakes", False))


def engine_wakeups() -> bool:
    """``engine-wakeups``: in the simulation engine's process, Flower's in-memory
    LinkState notifies each instruction it stores, and the engine's loop that hands
    stored instructions to the backend (``vce_api.add_messages_to_queue``, as
    ``linkstate-index`` replaces it) waits for that instead of sleeping 0.1 s
    between looks: a round's instructions reached the actors up to 0.1 s after the
    ServerApp sent them. The same calls, in the same order, with the same results;
    only the wait between them ends sooner. Returns whether it is in place."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    if in_place():
        return True
    if not enabled():
        return False
    check(("flwr",))
    store = InMemoryLinkState.store_message_ins

    def store_message_ins(self: Any, message: Any) -> str | None:
        message_id = store(self, message)
        if message_id is not None:
            with _stored:
                _generation[0] += 1
                _stored.notify_all()
        return message_id

    InMemoryLinkState.store_message_ins = store_message_ins
    InMemoryLinkState._pflower_wakes = True
    return True
