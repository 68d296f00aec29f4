"""Faults and bad input: every case is rejected or survived, and nothing learned is lost.

The counts printed here feed docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.common import Context, Message, MessageType, RecordDict, parameters_to_ndarrays
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_app.app import build_client, dropped_out, make_client_app
from client_app.state import ContextStore, DiskStore
from methods import parse_run_config
from pflower.config.schema import ConfigError, RunConfig
from pflower.engine.simulate import simulate
from server_app.app import build_server
from strategies.outcome import DROPPED_OUT
from tests.helpers import SMALL, FakeProxy, config, fit_res, make_client, make_strategy

COUNTS: dict[str, int] = {}


def _count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


# ---- bad updates ---------------------------------------------------------------------------

CORRUPTIONS = [
    "extra-tensor",
    "missing-tensor",
    "wrong-shape",
    "wrong-dtype",
    "nan",
    "inf",
    "absurd-magnitude",
    "empty-payload",
    "non-finite-metric",
    "no-client-key",
    "zero-examples",
    "garbage-bytes",  # a tensor's bytes that are no numpy array (set on the reply below)
]

# the bounds on weights and update norms off: this checks which replies are rejected and
# that the rest are averaged exactly (tests/test_robust.py checks the bounds)
STRATEGY = make_strategy(
    config(method="fedper", model="mlp", weight_cap=0.0, update_norm_bound=0.0)
)
SPEC = STRATEGY.spec


def corrupt(
    kind: str, arrays: list[np.ndarray], data: st.DataObject
) -> tuple[list, dict, str, int]:
    arrays = [a.copy() for a in arrays]
    metrics: dict = {}
    key, n = "client-bad", 10
    i = data.draw(st.integers(0, len(arrays) - 1), label="tensor")
    if kind == "extra-tensor":
        arrays.append(np.zeros(3, dtype=np.float32))
    elif kind == "missing-tensor":
        del arrays[i]
    elif kind == "wrong-shape":
        arrays[i] = np.zeros(arrays[i].size + data.draw(st.integers(1, 5)), dtype=arrays[i].dtype)
    elif kind == "wrong-dtype":
        arrays[i] = arrays[i].astype(data.draw(st.sampled_from([np.float64, np.float16, np.int32])))
    elif kind in ("nan", "inf"):
        flat = arrays[i].reshape(-1)
        flat[data.draw(st.integers(0, flat.size - 1))] = np.nan if kind == "nan" else -np.inf
    elif kind == "absurd-magnitude":
        flat = arrays[i].reshape(-1)
        flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(st.floats(1e7, 3e38))
    elif kind == "empty-payload":
        arrays = []
    elif kind == "non-finite-metric":
        metrics["train-loss"] = data.draw(st.sampled_from([float("nan"), float("inf")]))
    elif kind == "no-client-key":
        key = ""
    elif kind == "zero-examples":
        n = 0
    return arrays, metrics, key, n


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(CORRUPTIONS), min_size=1, max_size=4), data=st.data())
def test_bad_updates_are_rejected_and_the_good_ones_aggregated(kinds: list[str], data) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    good = [
        [rng.normal(size=s.shape).astype(s.dtype) for s in SPEC]
        for _ in range(data.draw(st.integers(1, 3)))
    ]
    weights = [data.draw(st.integers(1, 50)) for _ in good]
    results = [
        (FakeProxy(i), fit_res(a, f"client-{i}", w)) for i, (a, w) in enumerate(zip(good, weights))
    ]
    for j, kind in enumerate(kinds):
        arrays, metrics, key, n = corrupt(kind, good[0], data)
        res = fit_res(arrays, key, n, metrics)
        if kind == "garbage-bytes":
            i = data.draw(st.integers(0, len(arrays) - 1), label="garbled tensor")
            res.parameters.tensors[i] = data.draw(st.binary(max_size=64), label="bytes")
        results.append((FakeProxy(100 + j), res))
        _count("bad-update")
    order = data.draw(st.permutations(range(len(results))))
    STRATEGY.set_global([np.zeros(s.shape, s.dtype) for s in SPEC])
    STRATEGY.rounds.clear()
    STRATEGY.aggregate_fit(1, [results[k] for k in order], [])
    assert STRATEGY.rounds[1].replies == len(good)
    assert len(STRATEGY.rounds[1].rejected) == len(kinds)
    if "garbage-bytes" in kinds:
        assert any("undecodable payload" in r for r in STRATEGY.rounds[1].rejected)
    total = sum(weights)
    for t, g in enumerate(STRATEGY.global_arrays):
        assert np.isfinite(g).all()
        expected = sum(w * a[t].astype(np.float64) for w, a in zip(weights, good)) / total
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)


# ---- dropout -------------------------------------------------------------------------------


def test_dropout_is_seeded_and_near_its_rate() -> None:
    picks = [dropped_out(0.3, 0, str(r), f"client-{c}") for r in range(1, 51) for c in range(20)]
    assert picks == [
        dropped_out(0.3, 0, str(r), f"client-{c}") for r in range(1, 51) for c in range(20)
    ]
    assert 0.25 < np.mean(picks) < 0.35
    assert not any(dropped_out(0.0, 0, "1", f"client-{c}") for c in range(100))


def test_a_dropped_client_keeps_its_personal_state(monkeypatch) -> None:
    cfg = config(method="fedper", dropout_rate=0.99)
    client, context = make_client(cfg)
    client.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 1})
    before = {k: v.copy() for k, v in ContextStore(context).load().items()}
    context.run_config = cfg.as_dict()
    context.node_config = {"partition-id": 0, "num-partitions": 4}
    app = make_client_app(SMALL | {"dropout-rate": 0.99})
    for attr in ("_run_id", "_task_id", "_node_id"):  # what a SuperNode would have set
        monkeypatch.setattr(TaskIdentity, attr, 0, raising=False)
    msg = Message(RecordDict(), dst_node_id=1, message_type=MessageType.TRAIN, group_id="2")
    with pytest.raises(Exception, match="dropped out"):
        app(msg, context)
    _count("dropout-state")
    after = ContextStore(context).load()
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v)


@pytest.mark.slow
def test_training_goes_on_under_dropout(tmp_path: Path) -> None:
    results = simulate(
        {
            "method": "fedper",
            "num-server-rounds": 4,
            "dropout-rate": 0.3,
            "local-epochs": 2,
            "output-dir": str(tmp_path),
            "run-name": "dropout",
        },
        num_clients=5,
    )
    rounds = results["rounds"]
    failures = sum(r["failures"] for r in rounds)
    COUNTS["dropout-failures"] = failures
    assert failures > 0 and len(rounds) == 4
    assert all(r["replies"] + r["failures"] == 5 for r in rounds)
    # each failure named in its round's record, its node and why
    assert all(len(r["failed"]) == r["failures"] for r in rounds)
    assert all(
        why.startswith("node ") and DROPPED_OUT in why for r in rounds for why in r["failed"]
    )
    # eval-in-fit: round r's evaluations come with round r + 1's fit replies, so a client
    # that drops out of round r + 1 has none for round r; everyone is back at the end
    for r, nxt in zip(rounds, rounds[1:]):
        assert len(r["per_client_accuracy"]) == nxt["replies"]
    assert len(rounds[-1]["per_client_accuracy"]) == 5  # dropped clients come back
    assert rounds[-1]["accuracy_mean"] > rounds[0]["accuracy_mean"]


# ---- a corrupt personal-state file ---------------------------------------------------------


@pytest.mark.parametrize(
    "damage", ["flip-byte", "truncate", "empty", "not-a-zip", "wrong-checksum"]
)
def test_a_corrupt_state_file_is_detected_and_reinitialised(
    damage: str, tmp_path: Path, caplog
) -> None:
    cfg = config(method="fedper")
    store = DiskStore(tmp_path, "exp", "client-0")
    client, _ = make_client(cfg)
    client.store = store
    initial = {k: v.copy() for k, v in client.personal_state().items()}
    client.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 1})
    assert store.load() is not None
    raw = store.path.read_bytes()
    if damage == "flip-byte":
        raw = raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0xFF]) + raw[len(raw) // 2 + 1 :]
    elif damage == "truncate":
        raw = raw[: len(raw) // 3]
    elif damage == "empty":
        raw = b""
    elif damage == "not-a-zip":
        raw = b"hello" * 100
    elif damage == "wrong-checksum":
        arrays = dict(np.load(store.path))
        arrays["__sha256__"] = np.array("0" * 64)
        store.path.unlink()
        np.savez(store.path, **arrays)
        raw = store.path.read_bytes()
    store.path.write_bytes(raw)
    _count("corrupt-state-file")
    fresh, _ = make_client(cfg)
    fresh.store = store
    with caplog.at_level("ERROR", logger="flwr"):
        fresh.restore_personal()
    assert "corrupt" in caplog.text
    for k, v in initial.items():
        np.testing.assert_array_equal(fresh.personal_state()[k], v)
    fresh.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 2})
    assert store.load() is not None  # the next save repairs the file


def test_a_corrupt_newest_state_falls_back_to_the_one_before_and_the_chain_says_so(
    tmp_path: Path,
) -> None:
    """#93: a deployed site keeps its state before the newest. After two fits a
    corrupt newest file costs one fit's personal training, not all of it, and what
    each load and save did is noted with its sha256, parent and generation (the chain
    the site's ledger carries, deploy/site_guard.py)."""
    from pflower.store import STATE_EVENTS

    cfg = config(method="fedper")
    store = DiskStore(tmp_path, "exp", "client-0")
    client, _ = make_client(cfg)
    client.store = store
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    STATE_EVENTS.clear()
    client.fit(payload, {"server-round": 1})
    after_one = {k: v.copy() for k, v in client.personal_state().items()}
    client.fit(payload, {"server-round": 2})
    saves = [e for e in STATE_EVENTS if "saved" in e]
    assert [e["generation"] for e in saves] == [1, 2]
    assert saves[1]["parent"] == saves[0]["saved"]  # the chain: each names its parent
    assert store.previous.exists()
    raw = bytearray(store.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    store.path.write_bytes(bytes(raw))
    STATE_EVENTS.clear()
    fresh, _ = make_client(cfg)
    fresh.store = store
    fresh.restore_personal()
    for k, v in after_one.items():  # round 1's state, not the initial one
        np.testing.assert_array_equal(fresh.personal_state()[k], v)
    corrupt, restored = list(STATE_EVENTS)
    assert corrupt["corrupt"] == store.path.name
    assert restored == {
        "restored": saves[0]["saved"],
        "parent": None,
        "generation": 1,
        "from": "previous",
    }
    fresh.fit(payload, {"server-round": 3})  # repairs the newest, keeps the good one before
    assert store.load() is not None and store.restored[1] == 2
    with np.load(store.previous) as before:
        assert str(before["__sha256__"]) == saves[0]["saved"]


def test_a_round_before_one_with_no_reply_keeps_its_record(tmp_path: Path) -> None:
    """#93 (found by the soak: a SuperLink killed in a round left it without a reply):
    with eval-in-fit a round is scored by the next round's fits; when the next round
    has none, the round is still recorded, unscored, with what it trained (before,
    results.json lost it). Seed 7 drops client 0 in round 1 and every client in
    round 2."""
    from pflower.engine.inprocess import run_inprocess
    from strategies.outcome import RunFailed

    cfg = {**SMALL, "method": "fedper", "num-server-rounds": 3, "dropout-rate": 0.5, "seed": 7}
    with pytest.raises(RunFailed, match="round 2: no reply was aggregated"):
        run_inprocess({**cfg, "output-dir": str(tmp_path), "run-name": "r"}, 3)
    rounds = json.loads((tmp_path / "r" / "results.json").read_text())["rounds"]
    assert [(r["round"], r["replies"]) for r in rounds] == [(1, 1), (2, 0), (3, 2)]
    assert rounds[0]["accuracy_mean"] is None and rounds[1]["failures"] == 3


# ---- config fuzzing ------------------------------------------------------------------------

# the config keys (params and auto_resolved are filled by the parser, not keys)
FIELDS = {k: v for k, v in RunConfig.model_fields.items() if k not in ("params", "auto_resolved")}


def _bad_value(name: str, data: st.DataObject) -> object:
    info = FIELDS[name]
    ann = info.annotation
    wrong_type = data.draw(st.sampled_from([[1, 2], {"a": 1}, None]))
    if ann in (int, float):
        bounds = [
            m
            for m in info.metadata
            if hasattr(m, "gt") or hasattr(m, "ge") or hasattr(m, "lt") or hasattr(m, "le")
        ]
        if bounds and data.draw(st.booleans()):
            lower = [
                getattr(m, "gt", None)
                if getattr(m, "gt", None) is not None
                else getattr(m, "ge", None)
                for m in bounds
            ]
            lower = [v for v in lower if v is not None]
            if lower:
                return min(lower) - data.draw(st.integers(1, 10**6))
        return data.draw(st.sampled_from(["not-a-number", wrong_type]))
    if ann is bool:
        return data.draw(st.sampled_from(["maybe", 3, wrong_type]))
    if getattr(ann, "__origin__", None) is not None or "Literal" in str(ann):
        return data.draw(st.sampled_from(["no-such-choice", 42, wrong_type]))
    return wrong_type


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_random_invalid_configs_name_the_bad_key(data) -> None:
    name = data.draw(st.sampled_from(sorted(FIELDS)))
    key = FIELDS[name].alias or name
    if data.draw(st.booleans()):
        raw = {key: _bad_value(name, data)}
    else:
        key = data.draw(st.from_regex(r"[a-z]{3,8}-[a-z]{3,8}", fullmatch=True))
        if key in {f.alias for f in FIELDS.values()}:
            return
        raw = {key: 1}
    _count("invalid-config")
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_run_config(raw)
    # the ServerApp fails on it before any model, strategy or training exists
    context = Context(0, 0, {}, RecordDict(), raw)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        build_server(context)
    with pytest.raises(ConfigError, match=f"'{key}'"):
        build_client(Context(0, 0, {"partition-id": 0, "num-partitions": 2}, RecordDict(), raw))


# ---- determinism ---------------------------------------------------------------------------


@pytest.mark.slow
def test_same_config_and_seed_give_the_same_results(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        cfg = {
            "method": "fedper",
            "num-server-rounds": 2,
            "output-dir": str(tmp_path),
            "run-name": name,
            "seed": 7,
        }
        runs.append(simulate(cfg, num_clients=3)["rounds"])
    for r1, r2 in zip(*runs):
        assert r1["per_client_accuracy"] == r2["per_client_accuracy"]
        assert r1["bytes_up"] == r2["bytes_up"]
    _count("determinism-runs")


def test_a_diverged_round_keeps_the_personal_state_from_before(caplog) -> None:
    cfg = config(method="fedper", lr=0.05)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    good = {k: v.copy() for k, v in client.store.load().items()}
    poisoned = [np.full_like(a, np.nan) for a in payload]  # a global state that diverges
    upload, _, _ = client.fit(poisoned, {"server-round": 2})
    assert not np.isfinite(upload[0]).all()  # the server's checks reject this upload
    kept = client.store.load()
    assert all(np.array_equal(kept[k], good[k]) for k in good)
    assert "training diverged" in caplog.text
