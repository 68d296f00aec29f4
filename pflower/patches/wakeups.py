"""``engine-wakeups``: the simulation engine's two 0.1 s polls wake when what they
wait for is stored."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from pflower.patches.core import check, enabled

_stored = threading.Condition()  # notified whenever the LinkState stores a message
_generation = [0]  # stores so far (read and bumped under _stored)


def generation() -> int:
    """How many messages the in-memory LinkState has stored (the state to wait past)."""
    with _stored:
        return _generation[0]


def wait_past(seen: int, timeout: float) -> None:
    """Return once a message is stored after ``generation()`` was ``seen``, or after
    ``timeout`` s (the poll it replaces: a missed wake-up costs what Flower's wait does)."""
    with _stored:
        _stored.wait_for(lambda: _generation[0] != seen, timeout)


def _bump() -> None:
    with _stored:
        _generation[0] += 1
        _stored.notify_all()


def engine_wakeups() -> bool:
    """``engine-wakeups``: in the simulation engine's process, Flower's in-memory
    LinkState notifies each message it stores; the loop that hands stored
    instructions to the backend (``vce_api.add_messages_to_queue``, as
    ``linkstate-index`` replaces it) and ``InMemoryGrid.send_and_receive`` (each
    legacy client proxy of the ServerApp) wait for that instead of sleeping 0.1 s
    between looks. A round's instructions reached the actors up to 0.1 s after the
    ServerApp sent them, and each reply reached the ServerApp up to 0.1 s after it
    was stored, holding one of the ServerApp's few proxy threads meanwhile.
    The same calls, in the same order, with the same results; only the waits between
    them end sooner. Returns whether it is in place."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    if getattr(InMemoryGrid, "_pflower_wakes", False):
        return True
    if not enabled():
        return False
    check(("flwr",))

    def notifying(store: Any) -> Any:
        def stored(self: Any, message: Any) -> str | None:
            message_id = store(self, message)
            if message_id is not None:
                _bump()
            return message_id

        return stored

    def send_and_receive(
        self: Any, messages: Iterable[Any], *, timeout: float | None = None
    ) -> Iterable[Any]:
        """Flower's, waiting for the next stored message instead of sleeping."""
        msg_ids = set(self.push_messages(messages))
        del messages
        end_time = time.time() + (timeout if timeout is not None else 0.0)
        ret: list[Any] = []
        while timeout is None or time.time() < end_time:
            seen = generation()  # before the pull: a reply stored after it wakes the wait
            res_msgs = self.pull_messages(msg_ids)
            ret.extend(res_msgs)
            msg_ids.difference_update({msg.metadata.reply_to_message_id for msg in res_msgs})
            if len(msg_ids) == 0:
                break
            wait_past(seen, self.pull_interval)
        return ret

    InMemoryLinkState.store_message_ins = notifying(InMemoryLinkState.store_message_ins)
    InMemoryLinkState.store_message_res = notifying(InMemoryLinkState.store_message_res)
    InMemoryGrid.send_and_receive = send_and_receive
    InMemoryGrid._pflower_wakes = True
    return True
