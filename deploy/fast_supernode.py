"""Flower's ``flower-supernode`` with an idle poll that backs off.

    python -m deploy.fast_supernode --superlink superlink:9092 ...  (its flags)

Flower 1.39's SuperNode asks the SuperLink for a message, and when there is none
sleeps 3 s, so every round's message waits 1.5 s on average before a site sees
it (docs/PERFORMANCE.md). Here (``pflower.patches``: supernode-backoff, object-retries)
the idle sleep starts at 0.1 s after each message
and grows 1.5 times per empty pull up to Flower's 3 s: a site picks up the next
round quickly while the federation is busy and costs the SuperLink no more than
Flower's own pace when it is idle. The waits for a local ClientApp's reply and for
each of its parts (0.5 s in Flower) become 0.02 s, and a message part not yet on the
SuperLink is asked for again after 0.05 s (Flower: 1 s), then every 0.1 s. Nothing
else changes: same flags, same protocol.
"""

from __future__ import annotations

import pflower.patches


def main() -> None:
    pflower.patches.supernode_backoff()
    pflower.patches.object_retries()
    from flwr.supernode.cli.flower_supernode import flower_supernode

    flower_supernode()


if __name__ == "__main__":
    main()
