"""Flower's ``flower-supernode`` with an idle poll that backs off.

    python -m deploy.fast_supernode --superlink superlink:9092 ...  (its flags)

Flower 1.39's SuperNode asks the SuperLink for a message, and when there is none
sleeps 3 s, so every round's message waits 1.5 s on average before a site sees
it (docs/PERFORMANCE.md). Here the idle sleep starts at 0.1 s after each message
and grows 1.5 times per empty pull up to Flower's 3 s: a site picks up the next
round quickly while the federation is busy and costs the SuperLink no more than
Flower's own pace when it is idle. The waits for a local ClientApp's reply
(0.5 s in Flower) become 0.1 s, and a message part not yet on the SuperLink is
asked for again after 0.05 s (Flower: 1 s), doubling. Nothing else changes: same
flags, same protocol.
"""

from __future__ import annotations

import time
from typing import Any

FIRST_WAIT, GROWTH = 0.1, 1.5
FIRST_OBJECT_RETRY = 0.05  # Flower's first retry of a missing object: 1 s
FLOWER_IDLE_WAIT = 3.0  # start_client_internal's sleep when no message came
LOCAL_WAIT = 0.1  # in place of its 0.5 s polls of the node's own state


class IdleBackoff:
    """Stands in for the ``time`` module inside Flower's SuperNode loop."""

    def __init__(self) -> None:
        self.wait = FIRST_WAIT

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def message_arrived(self) -> None:
        self.wait = FIRST_WAIT

    def sleep(self, seconds: float) -> None:
        if seconds >= FLOWER_IDLE_WAIT:  # idle: back off towards Flower's pace
            time.sleep(self.wait)
            self.wait = min(FLOWER_IDLE_WAIT, self.wait * GROWTH)
        else:
            time.sleep(min(seconds, LOCAL_WAIT))


def install() -> IdleBackoff:
    """Patch Flower's SuperNode loop (flwr 1.39's ``start_client_internal``)."""
    import flwr.supernode.start_client_internal as loop

    backoff = IdleBackoff()
    pull = loop._pull_and_store_message

    def pull_and_reset(*args: Any, **kwargs: Any) -> Any:
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            backoff.message_arrived()
        return run_id

    loop.time = backoff  # type: ignore[assignment]
    loop._pull_and_store_message = pull_and_reset
    return backoff


def faster_object_retries() -> None:
    """Retry a message part that is not there yet after 0.05 s, doubling, not after 1 s.

    A SuperNode stores a message before its parts arrive, and a ClientApp that
    starts at once (a warm one) asks for parts that are still on their way: with
    Flower's 1 s first retry that cost about 1.8 s a CIFAR message here. Only the
    first waits change (Flower's doubling and 10 s cap stay)."""
    from flwr.supercore.inflatable import inflatable_utils as objects

    for fn in (objects.pull_objects, objects.pull_and_inflate_object_from_tree):
        if "initial_backoff" not in (fn.__kwdefaults__ or {}):  # not flwr 1.39's signature
            raise RuntimeError(f"flwr's {fn.__name__} takes no initial_backoff")
        fn.__kwdefaults__["initial_backoff"] = FIRST_OBJECT_RETRY


def main() -> None:
    install()
    faster_object_retries()
    from flwr.supernode.cli.flower_supernode import flower_supernode

    flower_supernode()


if __name__ == "__main__":
    main()
