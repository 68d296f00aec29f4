"""Answered (2026-12-06): a never-asked client cost 18.7 KB under ``flwr run`` (Flower's
node store: a Context and the run config parsed again a node) and 10 KB in-process (a
proxy, a Context and a ClientApp a client); both are now made on demand, and what is
left is Flower's node registration, about 340 B a client resident at a million
(docs/notes/2026-12-06-what-a-never-sampled-client-costs.md).

``python -m benchmarks.studies.idle_cost [N ...]``: what a simulated client that is never
asked costs, piece by piece, per engine. Each piece is built as its engine builds it, at
N clients (default 10,000, 100,000 and 1,000,000), and measured: Python's heap by
tracemalloc, and the resident memory the process gained (protobuf messages live outside
Python's heap), both over N; the seconds it took (under tracemalloc, which slows
allocation: ``--untraced`` gives the seconds a run spends, no traced bytes). A piece
Flower builds that the project now avoids is measured where it fits this machine
(``--flower-max``: its N at most); ``--pieces`` picks rows.

One markdown table on stdout.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from benchmarks.presets import REPO

CONFIG = {"dataset": "synthetic", "sim-samples": 40, "hidden-dim": 500, "method": "fedper"}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


TRACED = [True]  # --untraced: seconds as a run spends them (tracemalloc slows allocation)


def measure(build: Callable[[], Any]) -> tuple[Any, float, float, float]:
    """(what ``build`` returned, traced bytes (0 untraced), resident bytes gained,
    seconds)."""
    gc.collect()
    before = rss_mb()
    if TRACED[0]:
        tracemalloc.start()
    t0 = time.perf_counter()
    out = build()
    seconds = time.perf_counter() - t0
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if TRACED[0] else 0
    tracemalloc.stop()
    return out, traced, (rss_mb() - before) * 2**20, seconds


def flower_nodes(n: int) -> tuple[Any, dict[int, int]]:
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    return factory, vce_api._register_nodes(n, factory)


def _registration(n: int) -> Any:
    return flower_nodes(n)


def _compact_registration(n: int) -> Any:
    from pflower.patches import node_stores

    factory, mapping = flower_nodes(n)
    return factory, node_stores.compact(factory.state(), mapping)


def _flower_stores(n: int) -> Any:
    from flwr.compat.client.run_info_store import DeprecatedRunInfoStore
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.supercore.run import Run

    _, mapping = flower_nodes(n)
    run = Run.create_empty(run_id=1)
    patched = DeprecatedRunInfoStore.register_context
    DeprecatedRunInfoStore.register_context = getattr(patched, "_pflower_flower", patched)
    try:
        flower = vce_api._register_node_info_stores
        flower = getattr(flower, "_pflower_flower", flower)
        return measure(lambda: flower(mapping, run, str(REPO)))
    finally:
        DeprecatedRunInfoStore.register_context = patched


def _sparse_stores(n: int) -> Any:
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.supercore.run import Run

    from pflower.patches import node_stores

    factory, mapping = flower_nodes(n)
    kept = node_stores.compact(factory.state(), mapping)
    run = Run.create_empty(run_id=1)
    return measure(lambda: vce_api._register_node_info_stores(kept, run, str(REPO)))


def _ids(n: int) -> list[int]:
    import random

    return [random.getrandbits(64) for _ in range(n)]


def _start_grid_proxies(n: int) -> Any:
    from flwr.server import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy

    ids = _ids(n)

    def build() -> Any:
        manager, registered = SimpleClientManager(), {}
        for node_id in ids:
            proxy = GridClientProxy(node_id=node_id, grid=None, run_id=1)  # type: ignore[arg-type]
            manager.register(proxy)
            registered[node_id] = proxy
        return manager, registered

    return measure(build)


def _grid_nodes(n: int) -> Any:
    import numpy as np

    ids = _ids(n)
    return measure(lambda: np.fromiter(ids, dtype=np.uint64, count=n))


def _registration_order(n: int) -> Any:
    ids = _ids(n)
    return measure(lambda: {node_id: place for place, node_id in enumerate(ids)})


STUDY = (40, 100, 500, 0.5, 0.4, 0.1, 0)  # the scale presets' study (StudyArgs)


def _one_stream(n: int) -> Any:
    from pflower.data.synthetic import StudyArgs, _index

    study = StudyArgs(*STUDY)
    return measure(lambda: _index(n, *study[:5], study.seed))


def _client_streams(n: int) -> Any:
    from pflower.data.synthetic import StudyArgs, simulated_client

    return measure(lambda: simulated_client(n - 1, n, StudyArgs(*STUDY), client_streams=True))


INPROCESS = {**CONFIG, "output-dir": "/tmp/pflower-idle-cost", "run-name": "idle"}


def _inprocess_before(n: int) -> Any:
    from flwr.common import Context, RecordDict

    from pflower.engine.inprocess import LocalProxy

    def build() -> list[Any]:  # the engine before #94: a proxy, Context and app a client
        node = {"num-partitions": n, "torch-threads": 1}
        return [
            LocalProxy(
                i + 1, Context(0, i + 1, {**node, "partition-id": i}, RecordDict(), {}), INPROCESS
            )  # fmt: skip
            for i in range(n)
        ]

    build_server_first(n)
    return measure(build)


def build_server_first(n: int) -> None:
    """The run's strategy and model, built once before measuring (not per client)."""
    from pflower.engine.inprocess import build_inprocess

    build_inprocess(INPROCESS, 1)


def _inprocess_now(n: int) -> Any:
    from pflower.engine.inprocess import build_inprocess

    build_server_first(n)
    return measure(lambda: build_inprocess(INPROCESS, n))


def _partitions(n: int) -> Any:
    """A partitioned data set's partitions (Dirichlet 0.5 over 10 classes, 40 rows a
    client; pflower/data/compact.py), built as each process that serves clients
    builds them; the labels are the data set's, made before measuring."""
    import numpy as np

    from pflower.data import compact

    labels = np.random.default_rng(0).integers(0, 10, 40 * n)
    return measure(lambda: compact.dirichlet(labels, n, 0.5, 0, seed=0))


RAY, BOTH, LOCAL = "Ray (flwr run)", "both (each process that draws data)", "in-process"
# (engine, what is held, how it is measured, whether the project still builds it)
PIECES: list[tuple[str, str, Callable[[int], Any], bool]] = [
    (RAY, "Flower's node registration: a NodeInfo protobuf, key maps, node -> partition",
     lambda n: measure(lambda: _registration(n)), True),
    (RAY, "the same, once the engine starts (compact nodes: 3 arrays)",
     lambda n: measure(lambda: _compact_registration(n)), True),
    (RAY, "Flower's node stores under flwr run: a Context, the run config parsed a node",
     _flower_stores, False),
    (RAY, "sparse node stores, no node asked yet", _sparse_stores, True),
    (RAY, "Flower's start_grid: a GridClientProxy a node, held twice", _start_grid_proxies, False),
    (RAY, "GridNodes: the node ids in registration order", _grid_nodes, True),
    (RAY, "the sampler's registration order, a dict", _registration_order, False),
    (BOTH, "the study's one stream: where each client's draws begin", _one_stream, False),
    (BOTH, "sim-client-streams: the last client drawn alone", _client_streams, True),
    (BOTH, "a partitioned set's partitions: an offset a client, a row index a row (40)",
     _partitions, True),
    (LOCAL, "a proxy, a Context and a ClientApp a client", _inprocess_before, False),
    (LOCAL, "build_inprocess now: the strategy and a count", _inprocess_now, True),
]  # fmt: skip


def one(n: int, piece: int) -> dict[str, Any]:
    """One piece at ``n`` clients, in this (fresh) process."""
    from pflower.patches import node_stores

    node_stores.sparse_node_stores()
    _, traced, resident, seconds = PIECES[piece][2](n)
    return {"traced": traced / n, "resident": resident / n, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    import json
    import subprocess

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.idle_cost", description=__doc__
    )
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--flower-max", type=int, default=100_000)
    parser.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--untraced", action="store_true", help="no tracemalloc: the seconds a run spends"
    )
    parser.add_argument("--pieces", nargs="+", type=int, help="only these rows (from 0)")
    args = parser.parse_args(argv)
    TRACED[0] = not args.untraced
    if args.one:
        print(json.dumps(one(*args.one)))
        return 0
    head = " | ".join(f"{n:,}" for n in args.sizes)
    print("traced (Python's heap) / resident bytes a client, and seconds, by clients:\n")
    print(f"| engine | what is held | now | {head} |")
    print("|---|---|---|" + "---|" * len(args.sizes))
    for i, (engine, piece, _, now) in enumerate(PIECES):
        if args.pieces and i not in args.pieces:
            continue
        cells = []
        for n in args.sizes:
            if not now and n > args.flower_max:
                cells.append("not built here")
                continue
            cmd = [sys.executable, "-m", "benchmarks.studies.idle_cost", "--one", str(n), str(i)]
            cmd += ["--untraced"] if args.untraced else []
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if out.returncode != 0:
                cells.append("failed")
                print(out.stderr[-2000:], file=sys.stderr)
                continue
            m = json.loads(out.stdout.strip().splitlines()[-1])
            cells.append(f"{m['traced']:,.0f} / {m['resident']:,.0f} B, {m['seconds']:.1f} s")
        print(f"| {engine} | {piece} | {'yes' if now else 'no'} | " + " | ".join(cells) + " |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
