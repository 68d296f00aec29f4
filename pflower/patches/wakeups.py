"""``engine-wakeups``: the simulation engine hands a stored instruction to its
backend at once, not at its next 0.1 s look; the ServerApp's grid learns of the
replies it awaits when they are stored, not at its next look."""

from __future__ import annotations

import threading
from collections.abc import Callable
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


_replies = threading.Condition()  # notified whenever the LinkState stores a reply
_replies_stored = [0]  # replies stored so far (read and bumped under _replies)


def replies_stored() -> int:
    """How many replies the in-memory LinkState has stored (the state to wait past)."""
    with _replies:
        return _replies_stored[0]


def wait_for_replies(seen: int, count: int, timeout: float) -> None:
    """Return once ``count`` replies are stored after ``replies_stored()`` was
    ``seen``, or after ``timeout`` s (the poll it shortens)."""
    with _replies:
        _replies.wait_for(lambda: _replies_stored[0] - seen >= count, timeout)


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
    ServerApp sent them. It notifies each reply it stores too, and the ServerApp's
    grid (server_app/grid.py ``PollingGrid``, on Flower's in-memory grid) ends its
    wait between looks once as many replies as it still awaits are stored: a
    round's last reply waited a median 11-14 ms for its next look, 0.3 ms with
    this (100 clients, 10% a round, 20 rounds, two alternating pairs; timestamps
    at the store and at the hand-over).
    The same calls, in the same order, with the same results; only the wait
    between them ends sooner. Returns whether it is in place."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    if in_place():
        return True
    if not enabled():
        return False
    check(("flwr",))
    InMemoryLinkState.store_message_ins = _notifying(
        InMemoryLinkState.store_message_ins, _stored, _generation
    )
    InMemoryLinkState.store_message_res = _notifying(
        InMemoryLinkState.store_message_res, _replies, _replies_stored
    )
    InMemoryLinkState._pflower_wakes = True
    return True


def _notifying(
    store: Callable[[Any, Any], str | None], stored: threading.Condition, count: list[int]
) -> Callable[[Any, Any], str | None]:
    """``store`` (a LinkState's store of one message) that counts each message it
    stores in ``count`` and wakes the waiters on ``stored``."""

    def store_and_notify(self: Any, message: Any) -> str | None:
        message_id = store(self, message)
        if message_id is not None:
            with stored:
                count[0] += 1
                stored.notify_all()
        return message_id

    return store_and_notify
