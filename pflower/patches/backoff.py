"""``supernode-backoff``: a SuperNode's idle poll that backs off from 0.1 s."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pflower.patches.core import check, enabled
from pflower.patches.timing import FIRST_WAIT, FLOWER_IDLE_WAIT, GROWTH, HELD_PULL, LOCAL_WAIT


class IdleBackoff:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: the idle
    sleep starts at 0.1 s after each message and grows 1.5 times per empty pull up
    to Flower's 3 s, and is skipped after a pull the SuperLink held open (its
    ``fleet-long-poll``); its 0.5 s waits for a local ClientApp's reply, and for each
    of its parts, become 0.02 s (a lookup in the node's own state)."""

    def __init__(self, pause: Callable[[float], None] = time.sleep) -> None:
        self.pause = pause  # the sleep itself (a test records it: not the time module's)
        self.wait = FIRST_WAIT
        self.held = False  # the last empty pull was held open: ask again at once

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def message_arrived(self) -> None:
        self.wait = FIRST_WAIT

    def pulled(self, message: bool, seconds: float) -> None:
        """After each pull: whether it brought a message, how long it took."""
        if message:
            self.message_arrived()
        self.held = not message and seconds >= HELD_PULL

    def sleep(self, seconds: float) -> None:
        if seconds >= FLOWER_IDLE_WAIT:  # idle: back off towards Flower's pace
            if self.held:  # the SuperLink already waited for us
                self.held = False
                return
            self.pause(self.wait)
            self.wait = min(FLOWER_IDLE_WAIT, self.wait * GROWTH)
        else:
            self.pause(min(seconds, LOCAL_WAIT))


def supernode_backoff() -> IdleBackoff | None:
    """``supernode-backoff``: Flower's SuperNode loop (``start_client_internal``) with
    the idle poll of ``IdleBackoff``; None with the patches off."""
    if not enabled():
        return None
    check(("flwr",))
    import flwr.supernode.start_client_internal as loop

    backoff = IdleBackoff()
    pull = loop._pull_and_store_message

    def pull_and_reset(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        run_id = pull(*args, **kwargs)
        backoff.pulled(run_id is not None, time.monotonic() - start)
        return run_id

    loop.time = backoff  # type: ignore[assignment]
    loop._pull_and_store_message = pull_and_reset
    return backoff
