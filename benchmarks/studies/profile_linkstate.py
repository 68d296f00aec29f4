"""Answered (2026-11-24): a Ray client-round grew with the federation because Flower's
engine scans every stored message for every node ten times a second; with the
linkstate-index patch it is flat from 200 to 1,600 clients
(docs/notes/2026-11-24-where-the-per-client-cost-grew-with-the-federation.md).

Where a Ray simulation's time goes as clients grow: the time inside Flower's
InMemoryLinkState.get_message_ins (the engine's per-node message lookup), with and
without the linkstate-index patch (pflower.patches; docs/PERFORMANCE.md):

    python -m benchmarks.studies.profile_linkstate 800            # Flower as it is
    python -m benchmarks.studies.profile_linkstate 800 --patched  # with the index

FedPer on the embedded default, 40 samples a client, 2 rounds; one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any
from unittest import mock


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.profile_linkstate")
    parser.add_argument("clients", type=int, help="simulated clients")
    parser.add_argument("--patched", action="store_true", help="with the linkstate index")
    args = parser.parse_args(argv)
    patched, clients = args.patched, args.clients
    # before anything imports the ServerApp, which applies the index unless told not to
    os.environ["PFLOWER_FLOWER_PATCHES"] = "1" if patched else "0"
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    import pflower.patches

    if patched:
        assert pflower.patches.linkstate_index()
    spent = {"seconds": 0.0, "calls": 0}
    lookup = InMemoryLinkState.get_message_ins

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return lookup(self, *args, **kwargs)
        finally:
            spent["seconds"] += time.perf_counter() - t0
            spent["calls"] += 1

    from pflower.engine.simulate import simulate

    config = {
        "method": "fedper",
        "num-server-rounds": 2,
        "sim-samples": 40,
        "output-dir": tempfile.mkdtemp(),
        "run-name": "profile",
    }
    t0 = time.perf_counter()
    # a measuring wrapper for this run only (mock restores the method after it)
    with mock.patch.object(InMemoryLinkState, "get_message_ins", timed):
        rounds = simulate(config, clients, num_cpus=1.0)["rounds"]
    line = {
        "clients": clients,
        "patched": patched,
        "wall_s": round(time.perf_counter() - t0, 1),
        "round_s": [round(r["seconds"], 1) for r in rounds],
        "s_per_client_round": round(rounds[-1]["seconds"] / clients, 4),
        "get_message_ins_s": round(spent["seconds"], 1),
        "calls": spent["calls"],
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1:])
