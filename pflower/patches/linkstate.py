"""``linkstate-index``: the simulation engine's message lookups, per node."""

from __future__ import annotations

import threading
from typing import Any

from pflower.patches import timing, wakeups
from pflower.patches.core import check, enabled


def _index(state: Any) -> dict[int, list[str]]:
    """The LinkState's undelivered message ids by destination node (built on first use)."""
    index = state.__dict__.get("_pflower_by_node")
    if index is None:
        index = {}
        for message_id, message in state.message_ins_store.items():
            index.setdefault(message.metadata.dst_node_id, []).append(message_id)
        state.__dict__["_pflower_by_node"] = index
    return index


def linkstate_index() -> bool:
    """``linkstate-index``: Flower's in-memory LinkState keeps, per destination node,
    the ids of the messages stored for it (added where Flower stores one, pruned when
    read), so a node's lookup checks only its own messages, in the same order, with
    the same checks and side effects as Flower's; and the engine's loop asks only
    the nodes that have messages (Flower's asks all N, ten times a second). Applied
    where the ServerApp is imported (the simulation runs the engine in that
    process). Returns whether it is in place."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.date import now

    if getattr(InMemoryLinkState, "_pflower_indexed", False):
        return True
    if not enabled():
        return False
    check(("flwr",))
    store = InMemoryLinkState.store_message_ins

    def store_message_ins(self: Any, message: Any) -> str | None:
        message_id = store(self, message)
        if message_id is not None:
            with self.lock:
                ids = _index(self).setdefault(message.metadata.dst_node_id, [])
                if message_id not in ids:
                    ids.append(message_id)
        return message_id

    def get_message_ins(
        self: Any, node_id: int, limit: int | None, *, run_id: int | None = None
    ) -> list[Any]:
        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")
        found: list[Any] = []
        with self.lock:
            ids = _index(self).get(node_id, [])
            for message_id in list(ids):
                self._check_stored_messages({message_id})  # Flower's expiry checks
                message = self.message_ins_store.get(message_id)
                if message is None:  # deleted (replied to, expired): forget it
                    ids.remove(message_id)
                    continue
                if (
                    message.metadata.dst_node_id == node_id
                    and (run_id is None or message.metadata.run_id == run_id)
                    and message.metadata.delivered_at == ""
                ):
                    found.append(message)
                if limit and len(found) == limit:
                    break
        delivered_at = now().isoformat()
        for message in found:
            message.metadata.delivered_at = delivered_at
        return found

    def add_messages_to_queue(
        state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event
    ) -> None:
        """Flower's loop, asking only the nodes that have messages stored for them
        (and with ``engine-wakeups``, looking again as soon as one is stored)."""
        while not f_stop.is_set():
            seen = wakeups.generation()
            if isinstance(state, InMemoryLinkState):
                with state.lock:
                    nodes = [n for n, ids in _index(state).items() if ids and n in nodes_mapping]
            else:
                nodes = list(nodes_mapping.keys())
            for node_id in nodes:
                for message in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(message)
            if wakeups.in_place():
                wakeups.wait_past(seen, timing.ENGINE_POLL)
            else:
                f_stop.wait(timing.ENGINE_POLL)

    # Flower's own two, for a side-by-side check (tests/test_scale.py)
    InMemoryLinkState._pflower_flower = {"store": store, "get": InMemoryLinkState.get_message_ins}
    InMemoryLinkState.store_message_ins = store_message_ins
    InMemoryLinkState.get_message_ins = get_message_ins
    InMemoryLinkState._pflower_indexed = True
    vce_api.add_messages_to_queue = add_messages_to_queue  # read when the engine starts
    return True
