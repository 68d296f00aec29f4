"""``sparse-node-stores``: the simulation engine keeps a node's Context only while
the node holds personal state.

Flower's engine (``vce_api._register_node_info_stores``) builds, before any round,
one ``DeprecatedRunInfoStore`` per simulated node, each with its own Context, its
own node config and two copies of the run config; under ``flwr run`` each node's
run config is parsed again from the app's ``pyproject.toml``: 18.7 KB and 2.3 ms a
node (measured, docs/PERFORMANCE.md "A million simulated clients"), 19 GB and 40
minutes for a million nodes before the first round. Here the engine's mapping of
node stores is a ``SparseNodeStores``: a node's store is made when the engine asks
for it (a message for that node), its run config parsed once for the run and
copied into each Context handed out, and after the message the node is kept only
if its Context's state holds something (the node's state, as the engine would have
kept it); a node with an empty state costs nothing. What a ClientApp sees is what
Flower's stores give it: a Context with the run's id, the node's id, its
``partition-id`` / ``num-partitions`` node config, the run config, and the state it
left last time.

Flower builds the stores in the process's main thread, while the ServerApp's thread
imports the app, which applies this patch: at scale the patch is in place first
(registering a million nodes takes seconds), at a few thousand nodes it may not be.
So ``register_context`` is patched too (the stores made after it parse the run config
once, 1.1 KB a node), and when the engine starts (``run_api``) stores Flower made
are turned into a ``SparseNodeStores`` (their memory freed before the first round).
``how()`` says which happened in this process.

Flower's in-memory LinkState keeps a protobuf ``NodeInfo`` per registered node (1.6
KB of resident memory a node, measured at a million), and ``_register_nodes`` fills
its public-key and owner maps: when the engine starts, the simulated nodes are moved
into a ``CompactNodes`` mapping (three arrays, 24 bytes a node; a node's NodeInfo made
from the first node's, with its own id, when Flower looks it up, and kept from then
on, so what Flower sets on it stays), the engine's node -> partition mapping likewise,
and the freed memory handed back to the system. Registration itself stays Flower's
(it runs before any of the app is imported).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np

from pflower.patches.core import check, enabled

log = logging.getLogger("flwr.pflower")
_FLAG = "_pflower_sparse_nodes"
_how: list[str] = []  # how this process's engine got its stores: "sparse" / "converted"


def how() -> str:
    """How the last simulation engine of this process got its node stores:
    ``sparse`` (this patch built them), ``converted`` (Flower built them, this patch
    replaced them when the engine started), or ``flower`` (Flower's, unpatched)."""
    return _how[-1] if _how else "flower"


class NodeIndex:
    """Node ids in registration order (the partition order) and where each one is."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids  # uint64, registration order
        self.order = np.argsort(ids, kind="stable")
        self.sorted = ids[self.order]

    def place(self, node_id: Any) -> int | None:
        """The node's partition id (its place in registration order), or None."""
        if isinstance(node_id, bool) or not isinstance(node_id, (int, np.integer)):
            return None
        if not 0 <= int(node_id) < 2**64:
            return None
        i = int(np.searchsorted(self.sorted, np.uint64(node_id)))
        if i < len(self.sorted) and int(self.sorted[i]) == int(node_id):
            return int(self.order[i])
        return None


class CompactNodes(MutableMapping):
    """A LinkState's ``nodes``: node id -> NodeInfo, for the registered simulated nodes
    from ``index`` (a NodeInfo made from ``template`` when first asked for, then kept),
    and any other node set later as Flower sets it."""

    def __init__(self, index: NodeIndex, template: Any) -> None:
        self.index, self.template = index, template
        self.touched: dict[int, Any] = {}  # registered nodes looked up or set since
        self.gone: set[int] = set()  # registered nodes deleted since
        self.added: dict[int, Any] = {}  # nodes set after registration

    def _registered(self, node_id: Any) -> bool:
        return self.index.place(node_id) is not None

    def __getitem__(self, node_id: int) -> Any:
        node = self.touched.get(node_id)
        if node is None:
            node = self.added.get(node_id)
        if node is not None:
            return node
        if node_id in self.gone or not self._registered(node_id):
            raise KeyError(node_id)
        node = type(self.template)()
        node.CopyFrom(self.template)
        node.node_id = int(node_id)
        self.touched[int(node_id)] = node
        return node

    def __setitem__(self, node_id: int, node: Any) -> None:
        if self._registered(node_id):
            self.touched[int(node_id)] = node
            self.gone.discard(int(node_id))
        else:
            self.added[int(node_id)] = node

    def __delitem__(self, node_id: int) -> None:
        if node_id not in self:
            raise KeyError(node_id)
        if self.added.pop(node_id, None) is None:
            self.touched.pop(node_id, None)
            self.gone.add(int(node_id))

    def __contains__(self, node_id: object) -> bool:
        if node_id in self.touched or node_id in self.added:
            return True
        return node_id not in self.gone and self._registered(node_id)

    def __iter__(self) -> Iterator[int]:
        for node_id in self.index.ids.tolist():
            if node_id not in self.gone:
                yield node_id
        yield from list(self.added)

    def __len__(self) -> int:
        return len(self.index.ids) - len(self.gone) + len(self.added)


class CompactPartitions(MutableMapping):
    """The engine's node id -> partition id mapping, from a ``NodeIndex``."""

    def __init__(self, index: NodeIndex) -> None:
        self.index = index

    def __getitem__(self, node_id: int) -> int:
        place = self.index.place(node_id)
        if place is None:
            raise KeyError(node_id)
        return place

    def __setitem__(self, node_id: int, partition: int) -> None:
        raise TypeError("the simulated federation's nodes are registered once")

    __delitem__ = __setitem__

    def __contains__(self, node_id: object) -> bool:
        return self.index.place(node_id) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self.index.ids.tolist())

    def __len__(self) -> int:
        return len(self.index.ids)


def compact(state: Any, nodes_mapping: dict[int, int]) -> CompactPartitions | None:
    """Move the engine's registered nodes out of Flower's ``state`` (an in-memory
    LinkState) and its ``nodes_mapping`` (emptied) into compact ones; returns the new
    mapping, or None (nothing done) if the state's nodes are not exactly the engine's,
    in partition order."""
    nodes = getattr(state, "nodes", None)
    if not isinstance(nodes, dict) or not nodes or len(nodes) != len(nodes_mapping):
        return None
    with state.lock:
        ids = np.fromiter(nodes.keys(), dtype=np.uint64, count=len(nodes))
        mapped = np.fromiter(nodes_mapping.keys(), dtype=np.uint64, count=len(nodes_mapping))
        places = np.fromiter(nodes_mapping.values(), dtype=np.int64, count=len(nodes_mapping))
        if not (np.array_equal(mapped, ids) and np.array_equal(places, np.arange(len(ids)))):
            return None
        template = nodes[int(ids[0])]
        index = NodeIndex(ids)
        keys = {node.public_key for node in nodes.values()}
        state.node_public_keys.difference_update(keys)
        for key in keys:
            state.node_public_key_to_node_id.pop(key, None)
        for owned in state.owner_to_node_ids.values():
            owned.difference_update(nodes.keys())
        state.nodes = CompactNodes(index, template)
    nodes_mapping.clear()
    _trim()
    return CompactPartitions(index)


def _trim() -> None:
    """Hand the freed heap back to the system (glibc); nothing elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class SparseNodeStores(dict):
    """Node id -> its store, made on demand (``__missing__``); a store stays in the
    mapping only while its node's state holds something."""

    def __init__(
        self,
        nodes_mapping: dict[int, int],
        run_id: int,
        run_config: Callable[[], dict[str, Any]],
    ) -> None:
        super().__init__()
        self.nodes_mapping = nodes_mapping
        compact_ = isinstance(nodes_mapping, CompactPartitions)  # distinct by construction
        self.num_partitions = len(nodes_mapping) if compact_ else len(set(nodes_mapping.values()))
        self.run_id = run_id
        self._run_config = run_config
        self._config: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def run_config(self) -> dict[str, Any]:
        """The run config, made once (the engine's worker threads may ask at once)."""
        with self._lock:
            if self._config is None:
                self._config = self._run_config()
            return self._config

    def __missing__(self, node_id: int) -> Any:
        if node_id not in self.nodes_mapping:
            raise KeyError(node_id)
        return _store_class()(self, node_id)

    def held(self, store: Any, keep: bool) -> None:
        with self._lock:
            if keep:
                self[store.node_id] = store
            else:
                self.pop(store.node_id, None)


@functools.cache
def _store_class() -> type:
    """The store class (made on first use: Flower's simulation is imported by then)."""
    from flwr.app import Context, RecordDict
    from flwr.common.constant import NUM_PARTITIONS_KEY, PARTITION_ID_KEY
    from flwr.compat.client.run_info_store import DeprecatedRunInfoStore

    class SparseStore(DeprecatedRunInfoStore):
        """One node's store: its state only, a Context made around it when asked."""

        def __init__(self, stores: SparseNodeStores, node_id: int) -> None:
            super().__init__(
                node_id,
                {
                    PARTITION_ID_KEY: stores.nodes_mapping[node_id],
                    NUM_PARTITIONS_KEY: stores.num_partitions,
                },
            )
            self.stores = stores
            self.state = RecordDict()

        def register_context(self, run_id: int, *args: Any, **kwargs: Any) -> None:
            return None  # the run's context is made when asked

        def retrieve_context(self, run_id: int) -> Any:
            if run_id != self.stores.run_id:
                return super().retrieve_context(run_id)  # Flower's error
            config = self.stores.run_config()
            return Context(run_id, self.node_id, self.node_config, self.state, config.copy())

        def update_context(self, run_id: int, context: Any) -> None:
            if context.run_config != self.stores.run_config():
                raise ValueError(  # Flower's check, its words
                    "The `run_config` field of the `Context` object cannot be "
                    f"modified (run_id: {run_id})."
                )
            self.state = context.state
            self.stores.held(self, keep=len(context.state) > 0)

    return SparseStore


def _flower_run_config(run: Any, app_dir: str | None) -> Callable[[], dict[str, Any]]:
    """The run config Flower's store gives every node, by Flower's own code, once."""
    from flwr.compat.client.run_info_store import DeprecatedRunInfoStore

    register = getattr(DeprecatedRunInfoStore.register_context, "_pflower_flower", None)
    register = register or DeprecatedRunInfoStore.register_context

    def make() -> dict[str, Any]:
        probe = DeprecatedRunInfoStore(node_id=0, node_config={})
        register(probe, run.run_id, run=run, app_dir=app_dir)
        return probe.run_infos[run.run_id].initial_run_config

    return make


def from_flowers(nodes_mapping: dict[int, int], stores: dict[int, Any]) -> SparseNodeStores:
    """Flower's stores turned sparse: the nodes whose state holds something kept, the
    rest dropped (``stores`` is emptied)."""
    first = next(iter(stores.values()))
    run_id, info = next(iter(first.run_infos.items()))
    sparse = SparseNodeStores(nodes_mapping, run_id, lambda: info.initial_run_config)
    for node_id, store in stores.items():
        context = store.run_infos[run_id].context
        if len(context.state) > 0:
            kept = sparse[node_id]
            kept.state = context.state
            sparse.held(kept, keep=True)
    stores.clear()
    return sparse


def _wrapped_chain(fn: Any, flag: str) -> bool:
    while fn is not None:
        if getattr(fn, flag, False):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def sparse_node_stores() -> bool:
    """``sparse-node-stores`` (see the module): applied where the ServerApp and the
    ClientApp are imported, in Flower's simulation process. Returns whether it is in
    place."""
    from flwr.compat.client.run_info_store import DeprecatedRunInfoStore
    from flwr.server.superlink.fleet.vce import vce_api

    if _wrapped_chain(vce_api.run_api, _FLAG):
        return True
    if not enabled():
        return False
    check(("flwr",))
    flower_register = DeprecatedRunInfoStore.register_context
    flower_stores = vce_api._register_node_info_stores
    configs: dict[tuple[int, str | None], dict[str, Any]] = {}
    lock = threading.Lock()

    def register_context(
        self: Any, run_id: int, run: Any = None, app_dir: str | None = None, fab: Any = None
    ) -> None:
        """Flower's, with the run config parsed once a run (the stores Flower made
        before ``_register_node_info_stores`` was replaced)."""
        if run_id in self.run_infos or run is None or fab is not None:
            return flower_register(self, run_id, run, app_dir, fab)
        with lock:
            config = configs.get((run_id, app_dir))
            if config is None:
                config = configs[(run_id, app_dir)] = _flower_run_config(run, app_dir)()
        from flwr.app import Context, RecordDict
        from flwr.compat.client.run_info_store import RunInfo

        self.run_infos[run_id] = RunInfo(
            initial_run_config=config,
            context=Context(run_id, self.node_id, self.node_config, RecordDict(), config.copy()),
        )
        return None

    def register_node_info_stores(
        nodes_mapping: dict[int, int], run: Any, app_dir: str | None = None
    ) -> SparseNodeStores:
        _how.append("sparse")
        return SparseNodeStores(nodes_mapping, run.run_id, _flower_run_config(run, app_dir))

    run_api = vce_api.run_api

    @functools.wraps(run_api)
    def run_api_sparse(
        app_fn: Any,
        backend_fn: Any,
        nodes_mapping: Any,
        state_factory: Any,
        node_info_stores: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if not isinstance(node_info_stores, SparseNodeStores) and node_info_stores:
            _how.append("converted")
            node_info_stores = from_flowers(nodes_mapping, node_info_stores)
        compacted = compact(state_factory.state(), nodes_mapping)
        if compacted is not None:
            nodes_mapping = compacted
            if isinstance(node_info_stores, SparseNodeStores):
                node_info_stores.nodes_mapping = compacted
        log.info(
            "simulation engine: %d nodes, their stores %s, the LinkState's nodes %s",
            len(nodes_mapping),
            how(),
            "compact" if compacted is not None else "Flower's",
        )
        return run_api(
            app_fn, backend_fn, nodes_mapping, state_factory, node_info_stores, *args, **kwargs
        )

    setattr(run_api_sparse, _FLAG, True)
    register_context._pflower_flower = flower_register  # type: ignore[attr-defined]
    register_node_info_stores._pflower_flower = flower_stores  # type: ignore[attr-defined]
    DeprecatedRunInfoStore.register_context = register_context
    vce_api._register_node_info_stores = register_node_info_stores
    vce_api.run_api = run_api_sparse
    return True
