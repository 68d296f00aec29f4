"""Flower's Grid with one reply collector for the whole round.

Flower 1.39's deployed Grid (``HttpGrid.send_and_receive``) looks for replies every
3 s, and the legacy round loop calls it once per client, from a thread per client:
a round waits up to 3 s after its last reply, and N clients make N polls. Here every
Grid call is the wrapped grid's except ``send_and_receive``: it pushes its messages
and waits for one collector thread, which asks the SuperLink for every reply still
awaited in one pull, 0.02 s after the last reply arrived, then 1.5 times longer after
each empty pull, at most 0.1 s (a round in flight costs the SuperLink at most one
pull every 0.1 s between replies, whatever the number of clients). In simulation
(Flower's in-memory grid, the ``engine-wakeups`` patch) that wait also ends once
as many replies as are still awaited have been stored: a round's last reply is
found when it is stored, and the pulls before it keep their pace.

Pushes go one request at a time, and every message pushed while a request is in
flight goes in the next one: the legacy loop pushes each client's message from its
own thread at once, so a round's messages leave in a few requests (two in the
deployment benchmark's rounds, where there were three) and the payload they share
is uploaded once.

Flower's ``pull_messages`` downloads the parts of the replies it found one reply
after another, retrying a part that is not there yet for minutes; one site that
died while uploading its reply would hold back every other reply of the round.
So, on Flower's deployed grid, the collector's one request only finds the replies,
and each reply's parts are downloaded on a thread of its own, by Flower's own
``pull_messages`` handed that one reply (pflower.patches' ``reply-downloads-apart``,
which reads the grid's private Runtime API client; with the patches off, Flower's
``pull_messages`` brings the replies it finds whole).

On Flower's deployed grid each message leaves with its whole content packed in one
part, and each reply is unpacked before its caller sees it (pflower/packing.py):
every part is a request of its own at every hop.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.common import Message
from flwr.server import Grid

from pflower.packing import pack, unpack
from pflower.patches import reply_downloads, wakeups

FIRST_WAIT, GROWTH, LONGEST_WAIT = 0.02, 1.5, 0.1
# How long a deployed grid's node list is reused: Flower's legacy loop asks the
# SuperLink for it before every client-manager call, about 7 requests a round.
NODE_LIST_SECONDS = 1.0

log = logging.getLogger("flwr")


class _Awaited:
    """One send_and_receive's messages: the ids still awaited and the replies so far."""

    def __init__(self, ids: set[str]) -> None:
        self.ids, self.replies, self.done = ids, [], threading.Event()
        self.error: Exception | None = None  # the pull failed: raised in the caller


class _Push:
    """One push_messages call's messages, and what their push returned."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages, self.ids, self.done = messages, [], False
        self.error: Exception | None = None


class PollingGrid(Grid):
    """Delegates to ``grid``; only ``send_and_receive`` waits differently."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self._awaited: dict[str, _Awaited] = {}  # message id -> its caller's record
        self._lock = threading.Condition()
        self._collector: threading.Thread | None = None
        self._pushing = threading.Lock()  # held by the one push request in flight
        self._queued: list[_Push] = []  # push calls waiting for the next request
        self._downloading: set[str] = set()  # replies found, their parts on their way
        self._nodes: tuple[float, list[int]] | None = None  # (when asked, the node ids)
        self.pause: Callable[[float], None] = time.sleep  # between polls (tests record it)
        self.clock: Callable[[], float] = time.monotonic  # the node list's age (tests set it)
        self._wakes = _notified_of_replies(grid)  # see _pause

    def __getattr__(self, name: str) -> Any:  # anything a Grid subclass adds
        return getattr(self._grid, name)

    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    @property
    def run(self) -> Any:
        return self._grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self._grid.create_message(*args, **kwargs)

    def deployed(self) -> bool:
        """Whether the wrapped grid is Flower's deployed one (it talks to a SuperLink)."""
        return reply_downloads.deployed(self._grid)

    def get_node_ids(self) -> Iterable[int]:
        if not self.deployed():  # in memory: asking costs nothing
            return self._grid.get_node_ids()
        with self._lock:
            if self._nodes is not None and self.clock() - self._nodes[0] < NODE_LIST_SECONDS:
                return list(self._nodes[1])
        asked = self.clock()
        nodes = list(self._grid.get_node_ids())
        with self._lock:
            self._nodes = (asked, nodes)
        return list(nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        if self.deployed():  # the whole content in one part
            for message in messages:
                if isinstance(message, Message) and message.has_content():
                    message.content = pack(message.content)
        # One push request at a time, and the messages that came while it ran go
        # together in the next: the legacy loop's threads push a message each, at
        # once; pushed apart, each request stored the shared payload again (or, one
        # after another, waited for the one before); pushed together, Flower's grid
        # uploads each distinct part once, in one request per part.
        push = _Push(messages)
        with self._lock:
            self._queued.append(push)
        with self._pushing:
            if not push.done:  # not pushed by the request before: push every queued one
                with self._lock:
                    group, self._queued = self._queued, []
                self._push_group(group)
        if push.error is not None:
            raise push.error
        return push.ids

    def _push_group(self, group: list[_Push]) -> None:
        try:
            ids = list(self._grid.push_messages([m for p in group for m in p.messages]))
            if len(ids) == sum(len(p.messages) for p in group):  # an id (or None) each, in order
                for push in group:
                    push.ids, ids = ids[: len(push.messages)], ids[len(push.messages) :]
            else:  # a grid that leaves out what it did not store (Flower's in-memory one)
                stored = set(ids)
                for push in group:
                    push.ids = [
                        m.metadata.message_id
                        for m in push.messages
                        if m.metadata.message_id in stored
                    ]
        except BaseException as err:  # noqa: BLE001 - raised in each caller, as its own push would
            for push in group:
                push.error = err
        finally:
            for push in group:
                push.done = True

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        ids = list(self.push_messages(messages))
        if None in ids:  # Flower's HttpGrid could not store these: no reply will come
            log.warning(
                "%d of %d messages were not pushed; not waiting for them", ids.count(None), len(ids)
            )
        awaited = _Awaited({i for i in ids if i is not None})
        if not awaited.ids:
            return []
        with self._lock:
            self._awaited.update(dict.fromkeys(awaited.ids, awaited))
            if self._collector is None:
                self._collector = threading.Thread(
                    target=self._collect, name="pflower-reply-collector", daemon=True
                )
                self._collector.start()
            self._lock.notify()
        awaited.done.wait(timeout)
        with self._lock:  # on time or not: what came is the caller's, the rest is dropped
            for message_id in awaited.ids:
                self._awaited.pop(message_id, None)
        if awaited.error is not None:
            raise awaited.error
        return list(awaited.replies)

    def _collect(self) -> None:
        """Find every awaited reply in one request; hand each to its caller."""
        wait = FIRST_WAIT
        while True:
            with self._lock:
                while not self._awaited:
                    self._lock.wait()
                ids = [i for i in self._awaited if i not in self._downloading]
            seen = wakeups.replies_stored()
            try:
                found = self._find(ids) if ids else 0
            except Exception as err:  # noqa: BLE001 - each caller raises it, as Flower's would
                with self._lock:
                    for awaited in self._awaited.values():
                        awaited.error = err
                        awaited.done.set()
                    self._awaited.clear()
                continue
            wait = FIRST_WAIT if found else wait
            _pause(self, seen, len(ids) - found, wait)
            wait = min(LONGEST_WAIT, wait * GROWTH)

    def _find(self, ids: list[str]) -> int:
        """Ask the SuperLink for these replies; how many it had. On Flower's deployed
        grid each found reply's parts are downloaded on their own thread; on any
        other grid (in-memory), or with pflower.patches' ``reply-downloads-apart`` off,
        the replies come whole and are handed over here."""
        client = reply_downloads.runtime_client(self._grid)
        if client is None:
            got = list(self.pull_messages(ids))
            if self.deployed():  # Flower's own pull of packed replies
                got = [_unpacked(m) for m in got]
            self._hand_over(got)
            return len(got)
        from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullAppMessagesResponse

        res = client.PullMessages(PullAppMessagesRequest(message_ids=ids))
        for proto, tree in zip(res.messages_list, res.message_object_trees, strict=True):
            one = PullAppMessagesResponse(messages_list=[proto], message_object_trees=[tree])
            reply_to = proto.metadata.reply_to_message_id
            with self._lock:
                self._downloading.add(reply_to)
            # a daemon thread, not a pool's: a reply whose parts never come is retried
            # for minutes, and must not hold the ServerApp's exit at the end of a run
            threading.Thread(
                target=self._download,
                args=(client, one, reply_to),
                name="pflower-reply-download",
                daemon=True,
            ).start()
        return len(res.messages_list)

    def _download(self, client: Any, found: Any, reply_to: str) -> None:
        """One found reply's parts, by Flower's own pull_messages (its retries, its
        receipt to the SuperLink, its error reply when a part never arrives)."""
        try:
            found_whole = reply_downloads.pull_found(self._grid, client, found, reply_to)
            got = [_unpacked(m) for m in found_whole]
            self._hand_over(got)
        except Exception as err:  # noqa: BLE001 - raised in this reply's caller only
            with self._lock:
                if (awaited := self._awaited.get(reply_to)) is not None:
                    awaited.error = err
                    awaited.done.set()
        finally:
            with self._lock:
                self._downloading.discard(reply_to)

    def _hand_over(self, replies: list[Message]) -> None:
        with self._lock:
            for reply in replies:
                to = reply.metadata.reply_to_message_id
                if (awaited := self._awaited.pop(to, None)) is not None:
                    awaited.ids.discard(to)
                    awaited.replies.append(reply)
                    if not awaited.ids:
                        awaited.done.set()


def _notified_of_replies(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's in-memory grid (the simulation's) with
    ``engine-wakeups`` in place. Not imported to ask: a deployed ServerApp never
    loads it (0.57 s of imports)."""
    in_memory = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    return in_memory is not None and isinstance(grid, in_memory.InMemoryGrid) and wakeups.in_place()


def _pause(grid: PollingGrid, seen: int, left: int, wait: float) -> None:
    """The collector's wait between looks: ``wait`` s, ended in simulation (Flower's
    in-memory grid, whose LinkState notifies each reply it stores: ``engine-wakeups``)
    once the ``left`` replies still awaited are stored after ``seen``."""
    if left > 0 and grid._wakes:
        wakeups.wait_for_replies(seen, left, wait)
    else:
        grid.pause(wait)


def _unpacked(reply: Message) -> Message:
    if reply.has_content():
        reply.content = unpack(reply.content)
    return reply
