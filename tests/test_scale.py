"""Many simulated clients (#33): personal state spills to disk past a memory budget,
and Flower's in-memory LinkState finds a node's messages without scanning all."""

from __future__ import annotations

from typing import Any

import pytest

import pflower.patches
from methods import method_names
from pflower.engine.inprocess import build_inprocess, run_inprocess

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
SMALL = {"sim-samples": 60, "hidden-dim": 16, "num-server-rounds": 3, "run-name": "spill"}


def _run(tmp_path, **keys: Any) -> tuple[dict, list]:
    config = {**SMALL, "method": "feddecomp", "output-dir": str(tmp_path), **keys}
    server, rounds = build_inprocess(config, 4)
    server.fit(rounds, timeout=None)
    contexts = [p.context for p in server.client_manager().all().values()]
    res = server.strategy.recorder.results_path.read_text()
    return __import__("json").loads(res), contexts


@pytest.mark.parametrize("keys", [{"personal-state": "disk"}, {"personal-state-budget-mb": 1e-3}])
def test_spilled_personal_state_gives_the_same_run_and_leaves_memory_empty(tmp_path, keys) -> None:
    memory, in_memory = _run(tmp_path / "m", **{"personal-state": "memory"})
    disk, spilled = _run(tmp_path / "d", **keys)
    assert all(len(c.state) > 0 for c in in_memory)  # FedDecomp's tau, in each context
    assert all(len(c.state) == 0 for c in spilled)  # nothing kept in the engine's memory
    # in the run's directory, one folder a client; the last round's state beside the
    # ones of the checkpoints before it: round 1's, written, and round 2's, being
    # written while round 3 trained (the server checkpoints every round)
    folders = sorted((tmp_path / "d" / "spill" / "personal-state").iterdir())
    assert [f.name for f in folders] == [f"client-{i}" for i in range(4)]
    kept = ["r1.npz", "r2.npz", "r3.npz"]
    assert all(sorted(p.name for p in f.iterdir()) == kept for f in folders)
    for a, b in zip(memory["rounds"], disk["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]


def test_the_linkstate_index_finds_what_flowers_lookup_finds_in_the_same_order() -> None:
    """Three nodes, five messages (one expired before it is asked for), lookups with and
    without a limit: the patched LinkState and Flower's own give the same messages in
    the same order, and a second lookup of a node finds nothing in either."""
    import secrets
    import time
    import uuid

    from flwr.common import Message, Metadata, RecordDict
    from flwr.common.constant import (
        HEARTBEAT_INTERVAL_INF,
        NOOP_ACCOUNT_NAME,
        NOOP_FLWR_AID,
        SUPERLINK_NODE_ID,
    )
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.federation.noop_federation_manager import NOOP_FEDERATION_ID

    assert pflower.patches.linkstate_index()
    flower = InMemoryLinkState._pflower_flower
    states = []
    for _ in range(2):
        factory = LinkStateFactory(
            FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
        )
        state = factory.state()
        for _ in range(3):
            node = state.create_node(
                NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32), HEARTBEAT_INTERVAL_INF
            )
            state.acknowledge_node_heartbeat(
                node_id=node, heartbeat_interval=HEARTBEAT_INTERVAL_INF
            )
        run = state.create_run(None, None, None, {}, NOOP_FEDERATION_ID, None, NOOP_FLWR_AID, "x")
        states.append((state, sorted(state.nodes), run))
    (patched, nodes_p, run_p), (plain, nodes_f, run_f) = states
    plan = [(0, 30.0), (1, 30.0), (0, 1.0), (0, 30.0), (1, 30.0)]  # (node, ttl): one expires
    for k, ttl in plan:
        message_id, created = str(uuid.uuid4()), time.time()
        for state, nodes, run, store in (
            (patched, nodes_p, run_p, InMemoryLinkState.store_message_ins),
            (plain, nodes_f, run_f, flower["store"]),
        ):
            meta = Metadata(
                run, message_id, SUPERLINK_NODE_ID, nodes[k], "", "1", created, ttl, "train"
            )
            assert store(state, Message(metadata=meta, content=RecordDict())) == message_id
    time.sleep(1.2)  # the 1-second message expires
    asks = [(1, 1), (0, None), (2, None), (1, 1), (1, None), (0, None)]
    found = {"patched": [], "flower": []}
    for k, limit in asks:
        got_p = InMemoryLinkState.get_message_ins(patched, node_id=nodes_p[k], limit=limit)
        got_f = flower["get"](plain, node_id=nodes_f[k], limit=limit)
        found["patched"].append([m.metadata.message_id for m in got_p])
        found["flower"].append([m.metadata.message_id for m in got_f])
    assert found["patched"] == found["flower"]
    assert [len(ids) for ids in found["flower"]] == [1, 2, 0, 1, 0, 0]  # not a vacuous match


def test_many_clients_per_client_figures_go_to_a_file(tmp_path, monkeypatch) -> None:
    import json

    import pflower.results

    monkeypatch.setattr(pflower.results, "PER_CLIENT_INLINE", 3)  # as if 3 were many
    config = {**SMALL, "method": "fedper", "output-dir": str(tmp_path)}
    server, rounds = build_inprocess(config, 4)
    server.fit(rounds, timeout=None)
    run_dir = server.strategy.recorder.dir
    res = json.loads((run_dir / "results.json").read_text())
    assert all(r["per_client_accuracy"] == {} for r in res["rounds"])
    assert all(r["per_client_file"] == "per_client.jsonl" for r in res["rounds"])
    lines = [json.loads(x) for x in (run_dir / "per_client.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [1, 2, 3]
    assert sorted(lines[-1]["accuracy"]) == [f"client-{i}" for i in range(4)]
    for figure in ("loss", "train_loss", "samples"):  # every per-client figure goes there
        assert sorted(lines[-1][figure]) == [f"client-{i}" for i in range(4)]
        assert all(f"per_client_{figure}" not in r for r in res["rounds"])
    assert res["final_accuracy_mean"] == pytest.approx(sum(lines[-1]["accuracy"].values()) / 4)


def test_factorized_fl_per_client_aggregates_spill_past_the_budget(tmp_path) -> None:
    """A budget of a few bytes: every aggregate goes to disk, and the run is the same."""
    runs = {}
    for name, budget in (("memory", 2048.0), ("disk", 1e-5)):
        config = {
            **SMALL,
            "method": "factorized-fl-beta",
            "output-dir": str(tmp_path / name),
            "personal-state-budget-mb": budget,
        }
        server, rounds = build_inprocess(config, 4)
        server.fit(rounds, timeout=None)
        strategy = server.strategy
        runs[name] = __import__("json").loads(strategy.recorder.results_path.read_text())
        if name == "disk":
            assert (
                not strategy.payloads.per_client.memory
                and len(strategy.payloads.per_client.on_disk) == 4
            )
            assert len(list((strategy.recorder.dir / "client-payloads").glob("*.npz"))) == 4
        else:
            assert len(strategy.payloads.per_client.memory) == 4
    for a, b in zip(runs["memory"]["rounds"], runs["disk"]["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("method", method_names())
def test_every_method_trains_with_partial_participation(method: str, tmp_path) -> None:
    """fraction-fit 0.5 of 4 clients: 2 a round; the others keep their state through
    the round they sit out and come back (FedFac's factor analysis and Factorized-FL's
    matching see 2); every client is scored at some point."""
    config = {
        **SMALL,
        "method": method,
        "fraction-fit": 0.5,
        "personal-state": "memory",  # in each client's Context, where the test reads it
        "output-dir": str(tmp_path),
    }
    trained: dict[int, set[int]] = {}

    def record(kind: str, cid: str, instruction: Any, reply: Any) -> None:
        if kind == "fit":
            trained.setdefault(int(instruction.config["server-round"]), set()).add(int(cid))

    server, rounds = build_inprocess(config, 4, record)

    def now() -> dict[int, str]:  # each node's state, as its Context is handed out now
        return {
            p.node_id: p.context.state.object_id for p in server.client_manager().all().values()
        }

    states = [now()]  # before round 1
    contexts = states[0]
    aggregate_fit = server.strategy.aggregate_fit

    def after_fit(*args: Any) -> Any:
        states.append(now())
        return aggregate_fit(*args)

    server.strategy.aggregate_fit = after_fit
    server.fit(rounds, timeout=None)
    res = __import__("json").loads(server.strategy.recorder.results_path.read_text())
    assert [r["round"] for r in res["rounds"]] == [1, 2, 3]
    assert all(r["replies"] == 2 or method == "local" for r in res["rounds"])
    assert [len(trained[r]) for r in (1, 2, 3)] == [2, 2, 2]
    for r in (1, 2, 3):
        for node in set(contexts) - trained[r]:  # sat out round r: its state as before
            assert states[r][node] == states[r - 1][node], (r, node)
    assert any(states[3][n] != states[0][n] for n in contexts)  # not vacuous: states move
    scored = set().union(*(r["per_client_accuracy"] for r in res["rounds"]))
    assert scored == {f"client-{i}" for i in range(4)}


def test_in_process_clients_share_the_threads_a_ray_node_takes_one(tmp_path, monkeypatch):
    """The in-process engine trains as many clients at once as torch has threads, each
    on one (``parallel=1``: one client at a time on every thread), through its node
    config's ``torch-threads``; a simulated node without that key (a Ray actor, one per
    core) is pinned to one thread. Parallel or not, the run's numbers are the same."""
    import torch
    from flwr.common import Context, RecordDict

    import client_app.base
    from client_app.app import build_client

    seen: list[int] = []  # torch's threads as each client trained
    train = client_app.base.train_epochs

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return train(*args, **kwargs)

    monkeypatch.setattr(client_app.base, "train_epochs", counting)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        results = []
        for parallel, want in ((1, 3), (0, 1)):
            seen.clear()
            config = {**SMALL, "method": "fedavg", "output-dir": str(tmp_path / str(parallel))}
            results.append(run_inprocess({**config, "run-name": "r"}, 6, parallel=parallel))
            assert set(seen) == {want}, parallel
        one, side_by_side = results
        for a, b in zip(one["rounds"], side_by_side["rounds"], strict=True):
            assert a["per_client_accuracy"] == b["per_client_accuracy"]
            assert a["train_loss_mean"] == pytest.approx(b["train_loss_mean"], abs=1e-6)
        ray_node = Context(0, 1, {"partition-id": 0, "num-partitions": 2}, RecordDict(), {})
        build_client(ray_node, config)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method", method_names())
def test_a_resident_model_per_worker_trains_what_a_copy_per_message_trains(
    method: str, tmp_path, monkeypatch
) -> None:
    """A simulated client's model is its worker's resident copy of the template, put
    back to the template each message: every method ends each round with the same
    numbers as with a fresh deep copy per message (a method that left state on the
    model would carry it into the next client's message and fail here)."""
    import client_app.build

    fresh = client_app.build._fresh
    copies: list[bool] = []  # one entry per deep copy of the template

    def counted(template: Any, reuse: bool) -> Any:
        copies.append(reuse)
        return fresh(template, reuse)

    monkeypatch.setattr(client_app.build, "_fresh", counted)
    runs, copied_models = [], []
    for reuse in (True, False):
        monkeypatch.setattr(client_app.build, "REUSE_MODELS", reuse)
        copies.clear()
        config = {**SMALL, "method": method, "fraction-fit": 0.75, "output-dir": str(tmp_path)}
        runs.append(run_inprocess({**config, "run-name": f"reuse-{reuse}"}, 4, parallel=1))
        copied_models.append(len(copies))
    with_reuse, per_message = copied_models  # per message: one copy a message
    assert with_reuse < per_message  # not vacuous: the resident model was reused
    resident, copied = runs
    for a, b in zip(resident["rounds"], copied["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]
        assert a["per_client_train_loss"] == b["per_client_train_loss"]


def test_a_simulated_nodes_registration_order_is_its_partition_id(tmp_path) -> None:
    """What the seeded sampler ranks simulated clients by (strategies/sampling.py):
    Flower's simulation engine registers node ``i`` for partition ``i`` with a random
    node id, and the in-memory LinkState keeps them in that order."""
    from types import SimpleNamespace

    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager

    from pflower.flower_lines import registration_order

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    partitions = vce_api._register_nodes(50, factory)  # node id -> partition id, as the engine
    assert sorted(partitions) != list(partitions)  # random ids: their order is not the partitions'
    assert registration_order(SimpleNamespace(state=factory.state())) == partitions
    assert registration_order(SimpleNamespace()) == {}  # a deployment's grid: none
    # the in-process engine's node ids are the same numbers: its reservoirs as before
    server, _ = build_inprocess({**SMALL, "method": "fedavg", "output-dir": str(tmp_path)}, 5)
    proxies = list(server.client_manager().all().values())
    assert [server.strategy.sampler.place(p) for p in proxies] == [p.node_id for p in proxies]


@pytest.mark.slow
def test_ray_and_in_process_train_the_same_clients_each_round_at_partial_participation(
    tmp_path, monkeypatch
) -> None:
    """Half of 20 clients a round: the Ray simulation (random node ids) and the
    in-process engine (node ids 1..20) sample the same partitions each round, take the
    streamed bounds' references from the same 8 of the 10 (the reservoir, ranked by
    partition), and end each round with the same numbers, client by client. The
    round's weights went to the actors by reference (``ray-weights-once``, here for
    every array of 1 KB or more)."""
    from pflower.engine.simulate import simulate
    from pflower.patches import ray_app, ray_pipeline, ray_weights

    monkeypatch.setattr(ray_weights, "MIN_BYTES", 1024)
    monkeypatch.setattr(ray_weights, "SENDER", ray_weights._Sender())
    config = {**SMALL, "method": "fedper", "fraction-fit": 0.5, "output-dir": str(tmp_path)}
    ray = simulate({**config, "run-name": "ray"}, 20)["rounds"]
    # the engine put its Ray patches in place (pflower.patches): they ran here
    assert ray_app.in_place() and ray_pipeline.in_place() and ray_weights.in_place()
    assert ray_weights.SENDER.stored  # the last round's weights, stored once
    local = run_inprocess({**config, "run-name": "local"}, 20)["rounds"]
    trained = [sorted(r["per_client_train_loss"]) for r in ray]
    assert trained == [sorted(r["per_client_train_loss"]) for r in local]
    assert len({tuple(t) for t in trained}) > 1  # not vacuous: the rounds differ
    for a, b in zip(ray, local, strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]
        assert a["per_client_train_loss"] == pytest.approx(b["per_client_train_loss"], abs=1e-6)


def _flower_nodes(count: int) -> tuple[Any, dict[int, int], Any]:
    """Flower's simulation engine's nodes, registered as it registers them: the
    state factory, node id -> partition id, and a run."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    return factory, vce_api._register_nodes(count, factory), Run.create_empty(run_id=7)


def test_sparse_node_stores_hand_out_flowers_contexts_and_keep_only_nodes_with_state() -> None:
    """``sparse-node-stores``: after registration no node has a store; a node's Context
    is Flower's (its node config, the run config parsed from the app as under ``flwr
    run``); a node is kept after its message only if its state holds something, and
    gets that state back; a changed run config is refused as Flower refuses it; stores
    Flower made are turned sparse when the engine starts."""
    from flwr.common import ConfigRecord
    from flwr.server.superlink.fleet.vce import vce_api

    from pflower.patches import node_stores

    assert pflower.patches.sparse_node_stores()
    _, mapping, run = _flower_nodes(50)
    flower = vce_api._register_node_info_stores._pflower_flower(mapping, run, app_dir=str(ROOT))
    stores = vce_api._register_node_info_stores(mapping, run, app_dir=str(ROOT))
    assert isinstance(stores, node_stores.SparseNodeStores) and len(stores) == 0
    node, partition = list(mapping.items())[1]
    theirs = flower[node].retrieve_context(run.run_id)
    ours = stores[node].retrieve_context(run.run_id)
    assert ours.run_config == theirs.run_config and len(ours.run_config) > 50  # pyproject's
    assert ours.node_config == theirs.node_config == {"partition-id": 1, "num-partitions": 50}
    assert partition == 1
    stores[node].update_context(run.run_id, ours)  # nothing in its state: not kept
    assert len(stores) == 0
    ours.state["pflower.test"] = ConfigRecord({"x": 1})
    stores[node].update_context(run.run_id, ours)
    assert list(stores) == [node]
    again = stores[node].retrieve_context(run.run_id)
    assert again.state["pflower.test"]["x"] == 1 and again.run_config is not ours.run_config
    again.run_config["alpha"] = 9.0
    with pytest.raises(ValueError, match="cannot be modified"):
        stores[node].update_context(run.run_id, again)
    with pytest.raises(KeyError):
        stores[12345]  # not a node of the engine
    flower[node].retrieve_context(run.run_id).state["k"] = ConfigRecord({"y": 2})
    converted = node_stores.from_flowers(mapping, flower)
    assert list(converted) == [node] and flower == {}  # Flower's stores freed
    assert converted[node].retrieve_context(run.run_id).state["k"]["y"] == 2


def test_the_sampler_draws_the_same_clients_from_their_numbers_as_from_proxies() -> None:
    """A federation of numbers (``IndexedClients``) is sampled as the proxies of a
    registered federation in partition order: the same clients, round after round,
    and a proxy is made only for the clients drawn."""
    from flwr.server import SimpleClientManager

    from server_app.nodes import LocalNodes
    from strategies.sampling import Sampler

    made: list[int] = []

    def proxy(i: int, held: Any) -> Any:
        made.append(i)
        return type("P", (), {"node_id": i + 1, "partition_id": i, "cid": str(i + 1)})()

    numbers = LocalNodes(5000, proxy)
    listed = SimpleClientManager()
    for i in range(5000):
        p = proxy(i, None)
        listed.clients[p.cid] = p
    made.clear()
    for server_round in (1, 2, 3):
        for fraction in (0.001, 0.3):
            for kind in ("fit", "evaluate"):
                a = Sampler(1, seed=3).sample(numbers, fraction, server_round, kind)
                b = Sampler(1, seed=3).sample(listed, fraction, server_round, kind)
                assert [p.node_id for p in a] == [p.node_id for p in b]
    assert len(made) == 3 * 2 * (5 + 1500)  # only the drawn clients were made


def test_in_process_clients_that_hold_no_state_are_not_kept(tmp_path) -> None:
    """The in-process engine keeps a client's Context only while its state holds
    something: after FedPer trains 2 of 8 clients a round, the contexts kept are those
    of the clients that trained (their heads), none with its state on disk."""
    trained: set[int] = set()

    def record(kind: str, cid: str, instruction: Any, reply: Any) -> None:
        if kind == "fit":
            trained.add(int(cid))

    for where, kept in (("memory", True), ("disk", False)):
        trained.clear()
        config = {**SMALL, "method": "fedper", "fraction-fit": 0.25, "personal-state": where}
        config.update({"fraction-evaluate": 0.25, "output-dir": str(tmp_path / where)})
        server, rounds = build_inprocess(config, 8, record)
        server.fit(rounds, timeout=None)
        nodes = server.client_manager()
        assert 2 <= len(trained) <= 6
        assert {i + 1 for i in nodes.contexts} == (trained if kept else set())
        res = __import__("json").loads(server.strategy.recorder.results_path.read_text())
        state = res["personal_state"]
        assert state["clients_that_can_train"] == 6 and state["mode"] == where
        assert state["clients_on_disk"] == (0 if kept else len(trained))


def test_compact_nodes_answer_what_flowers_linkstate_answered() -> None:
    """``sparse-node-stores`` moves the registered nodes out of Flower's LinkState into
    arrays when the engine starts: the same node ids in the same (partition) order,
    each node's NodeInfo as Flower registered it (its own id), the same answers to
    Flower's lookups and node listing, and a message to a node is stored as before."""
    import time
    import uuid

    from flwr.common import Message, Metadata, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.superlink.federation.noop_federation_manager import NOOP_FEDERATION_ID

    from pflower.patches import node_stores

    factory, mapping, _ = _flower_nodes(40)
    state = factory.state()
    run_id = state.create_run(None, None, None, {}, NOOP_FEDERATION_ID, None, "<id:none>", "x")
    order, before = list(state.nodes), dict(state.nodes)
    listed = state.get_nodes(run_id)
    partitions = node_stores.compact(state, mapping)
    assert isinstance(state.nodes, node_stores.CompactNodes) and mapping == {}
    assert list(state.nodes) == order and len(state.nodes) == 40
    assert [partitions[n] for n in order] == list(range(40)) and len(partitions) == 40
    assert state.get_nodes(run_id) == listed
    for node_id in (order[0], order[17], order[39]):
        ours, theirs = state.nodes[node_id], before[node_id]
        assert ours.node_id == node_id and ours.status == theirs.status == "online"
        assert ours.online_until == theirs.online_until and node_id in state.nodes
    assert 12345 not in state.nodes and state.nodes.get(12345) is None and 12345 not in partitions
    meta = Metadata(run_id, str(uuid.uuid4()), SUPERLINK_NODE_ID, order[5], "", "1", time.time(),
                    60.0, "train")  # fmt: skip
    assert state.store_message_ins(Message(metadata=meta, content=RecordDict())) is not None
    state.nodes[order[5]].status = "offline"  # what Flower sets on a node stays
    assert state.nodes[order[5]].status == "offline"
