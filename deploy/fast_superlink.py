"""Flower's ``flower-superlink`` with a Fleet API that long-polls.

    python -m deploy.fast_superlink --fleet-api-address 0.0.0.0:9092 ...  (its flags)

Flower 1.39's SuperLink answers a SuperNode's pull at once, message or not, and
the SuperNode sleeps before asking again, so a site learns of its next message at
its next poll (0.4-0.7 s a message with ``deploy.fast_supernode``'s backoff,
docs/PERFORMANCE.md). Here (``pflower.patches``: fleet-long-poll) a pull that
finds nothing is held open up to 2 s and answered when a message is stored; a
``deploy.fast_supernode`` then asks again at once. Same flags, same protocol: an
unpatched SuperNode sees a slower empty pull and nothing else.
"""

from __future__ import annotations

import pflower.patches


def main() -> None:
    pflower.patches.fleet_long_poll()
    from flwr.superlink.cli import flower_superlink

    raise SystemExit(flower_superlink())


if __name__ == "__main__":
    main()
