"""``fleet-long-poll``: the SuperLink holds a SuperNode's empty pull open."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pflower import flower_lines
from pflower.patches.core import check, enabled
from pflower.patches.timing import HTTP_API_THREADS, LONG_POLL, LONG_POLLS_HELD


def held_pulls_cap() -> int:
    """How many empty pulls the SuperLink holds at once: ``LONG_POLLS_HELD``, but
    over HTTP Fleet at most a quarter of the HTTP API's threads, so that the
    ServerApp's pushes (the messages a held pull waits for) always find one."""
    if flower_lines.fleet_over_http():
        return min(LONG_POLLS_HELD, HTTP_API_THREADS // 4)
    return LONG_POLLS_HELD


def fleet_long_poll() -> bool:
    """``fleet-long-poll``, in the SuperLink: a SuperNode's pull that finds no
    message is held open up to ``LONG_POLL`` s and made again as soon as a message
    is stored for that node, so a site learns of its next message at once, not at
    its next poll. At most ``held_pulls_cap()`` pulls are held;
    beyond that a pull is answered at once, as Flower does. A SuperNode with
    ``supernode-backoff`` asks again at once after a held pull; an unpatched one
    sleeps as it always does."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    stored = threading.Condition()
    count: dict[int, int] = {}  # node id -> messages stored for it so far
    held = threading.BoundedSemaphore(held_pulls_cap())

    def storing(store: Callable[..., Any]) -> Callable[..., Any]:
        def store_message_ins(self: Any, message: Any) -> Any:
            out = store(self, message)
            node = message.metadata.dst_node_id
            with stored:
                count[node] = count.get(node, 0) + 1
                stored.notify_all()
            return out

        return store_message_ins

    for state in (InMemoryLinkState, SqlLinkState):
        state.store_message_ins = storing(state.store_message_ins)  # type: ignore[method-assign]
    handler = flower_lines.fleet_pull_handler()  # where the two Flower lines keep it
    pull = handler.pull_messages

    def pull_messages(request: Any, state: Any, store: Any) -> Any:
        if not held.acquire(blocking=False):
            return pull(request, state, store)
        try:
            node, deadline = request.node.node_id, time.monotonic() + LONG_POLL
            while True:
                with stored:
                    seen = count.get(node, 0)
                response = pull(request, state, store)
                left = deadline - time.monotonic()
                if response.messages_list or left <= 0:
                    return response
                with stored:  # woken by any node's message; pulls again only on its own
                    stored.wait_for(lambda s=seen: count.get(node, 0) != s, timeout=left)
        finally:
            held.release()

    handler.pull_messages = pull_messages
    return True
