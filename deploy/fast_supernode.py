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
else changes: same flags, same protocol. A restart right after a crash is taken
back once the SuperLink lets the old session go (``activation-retry``: asked again,
1-10 s apart, for up to 150 s, where Flower exits 305 at once).
"""

from __future__ import annotations

import pflower.patches


def secagg_refusal(argv: list[str]) -> str | None:
    """Why this SuperNode must not start, or None: a site that requires SecAgg+ with no
    roster to check its neighbours' keys against (a server could play them and read
    its upload), as ``deploy.site`` refuses ``--require-secure-aggregation`` alone
    (node config ``secagg-unverified-keys=true``: development only, as its
    ``--unverified-secagg-keys``)."""
    from flwr.common.config import parse_config_args

    from pflower.privacy.policy import roster_refusal

    given = [a.split("=", 1)[1] for a in argv if a.startswith("--node-config=")]
    given += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--node-config"]
    why = roster_refusal(parse_config_args(given) if given else {})
    return None if why is None else why + "; run the site with `python -m deploy.site --roster`"


def main() -> None:
    import sys

    refusal = secagg_refusal(sys.argv[1:])
    if refusal is not None:
        sys.exit(f"supernode: {refusal}")
    pflower.patches.activation_retry()  # restarted right after a crash: it asks again
    pflower.patches.supernode_backoff()
    pflower.patches.object_retries()
    from flwr.supernode.cli.flower_supernode import flower_supernode

    flower_supernode()


if __name__ == "__main__":
    main()
