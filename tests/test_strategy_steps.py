"""The strategy base's steps, each on its own: sampling, reply validation and client
identity, the class-list check, SecAgg+'s dequantization, DP's release, the
checkpoint schedule and the round record."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.server.client_manager import SimpleClientManager

from models.roles import CLASSES_KEY, EVAL_PREFIX, TensorSpec
from pflower.privacy.policy import REFUSED
from strategies import checkpoint
from strategies.privacy import DPRelease, from_secure_sum
from strategies.recording import Rounds, evaluations_in_fit
from strategies.replies import (
    ClassListMismatch,
    ClassLists,
    ClientKeys,
    Evaluation,
    Reply,
    RunRefused,
    accept_fit_replies,
    check_failures,
    enough_replies,
)
from strategies.sampling import Sampler
from tests.helpers import FakeProxy, config, fit_res

SPEC = [TensorSpec("w", (2, 3), "float32"), TensorSpec("n", (1,), "int64")]


def good(value: float = 1.0) -> list[np.ndarray]:
    return [np.full((2, 3), value, np.float32), np.array([3], np.int64)]


def accept(results: list[Any], keys: ClientKeys | None = None) -> tuple[list[Reply], list[str]]:
    keys = keys or ClientKeys()

    def check(key: str, arrays: list[np.ndarray], n: int) -> str | None:
        from strategies.replies import check_arrays

        return check_arrays(SPEC, arrays, n, max_abs_value=100.0)

    accepted, rejected, received = accept_fit_replies(1, results, lambda a: a, check, keys)
    assert received > 0
    return accepted, rejected


def test_replies_are_checked_against_the_spec_and_rejected_with_a_reason() -> None:
    bad_shape = [np.zeros((3, 2), np.float32), np.array([3], np.int64)]
    too_big = good(1e4)
    nan = good(float("nan"))
    results = [
        (FakeProxy(1), fit_res(good(), "a")),
        (FakeProxy(2), fit_res(bad_shape, "b")),
        (FakeProxy(3), fit_res(too_big, "c")),
        (FakeProxy(4), fit_res(nan, "d")),
        (FakeProxy(5), fit_res(good(), "e", metrics={"train-loss": float("inf")})),
        (FakeProxy(6), fit_res(good(), "")),
        (FakeProxy(7), fit_res(good(), "g", num_examples=0)),
    ]
    accepted, rejected = accept(results)
    assert [r.client_key for r in accepted] == ["a"]
    reasons = "\n".join(rejected)
    assert "'w' has shape (3, 2), expected (2, 3)" in reasons
    assert "max-abs-value" in reasons
    assert "non-finite values" in reasons
    assert "non-finite metrics ['train-loss']" in reasons
    assert "no client-key" in reasons
    assert "num_examples is 0" in reasons
    # the kept reply's bytes were dropped once decoded (memory at scale)
    assert results[0][1].parameters.tensors == []


def test_a_client_key_stays_with_its_node_while_that_node_is_connected() -> None:
    keys = ClientKeys()
    manager = SimpleClientManager()
    keys.manager = manager
    manager.register(FakeProxy(1))
    assert keys.bind(1, "site-a") is None
    assert "belongs to node 1" in (keys.bind(2, "site-a") or "")
    assert "presented client key 'site-a' before" in (keys.bind(1, "site-b") or "")
    manager.unregister(manager.all()["1"])  # node 1 is gone: the key may move
    manager.register(FakeProxy(2))
    assert keys.bind(2, "site-a") is None
    accepted, rejected = accept([(FakeProxy(3), fit_res(good(), "site-a"))], keys)
    assert not accepted and "belongs to node 2, still connected" in rejected[0]
    assert keys.key_owner["site-a"] == 2


def test_class_lists_that_differ_stop_the_run_naming_the_sites() -> None:
    lists = ClassLists()
    same = [Reply("a", [], 1, {CLASSES_KEY: "x"}), Reply("b", [], 1, {CLASSES_KEY: "x"})]
    lists.check(1, same)
    with pytest.raises(ClassListMismatch, match="a, b; c"):
        lists.check(2, [Reply("c", [], 1, {CLASSES_KEY: "y"})])


def test_a_round_every_site_refused_stops_the_run() -> None:
    refusal = RuntimeError(f"Message: site 'a' {REFUSED}: method")
    with pytest.raises(RunRefused, match="every site asked refused"):
        check_failures(1, [], [refusal])
    check_failures(1, [], [RuntimeError("crashed")])  # a crash is not a refusal
    assert not enough_replies(1, 1, 2) and enough_replies(1, 2, 2)


def test_the_secure_sum_returns_to_the_wire_dtypes_and_records_clipping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    extra: dict[str, Any] = {}
    summed = [np.full((2, 3), 8.0), np.array([2.6])]
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        out = from_secure_sum(4, SPEC, summed, clipping_range=8.0, extra=extra)
    assert out[0].dtype == np.float32 and out[1].dtype == np.int64 and out[1][0] == 3
    assert extra["secagg_aggregate_max_abs"] == 8.0
    assert "round 4: the secure aggregate reaches secagg-clipping-range" in caplog.text


def test_dp_divides_by_the_clients_asked_not_the_clients_that_replied() -> None:
    cfg = config(method="fedavg", **{"dp-mode": "client", "dp-noise-multiplier": 0.0})
    dp = DPRelease(cfg)
    dp.sample = (4, 8)  # 4 asked of 8 available, 2 replied
    before = [np.zeros(3)]
    after = [np.ones(3, np.float32)]  # the mean of the two replies moved by 1
    released: list[Any] = []
    extra: dict[str, Any] = {}
    dp.release(before, after, accepted=2, set_global=released.append, extra=extra)
    np.testing.assert_allclose(released[0][0], 0.5)  # 2 of the 4 asked: half the move
    assert extra["dp_sample_rate"] == 0.5
    assert len(dp.accountant.history()) == 1
    restored = DPRelease(cfg)
    restored.restore(dp.state())
    assert restored.accountant.epsilon() == dp.accountant.epsilon()


def test_checkpoints_every_k_rounds_and_after_the_last(tmp_path: Path) -> None:
    due = [r for r in range(1, 8) if checkpoint.checkpoint_due(r, every=3, last_round=7)]
    assert due == [3, 6, 7]
    assert not any(checkpoint.checkpoint_due(r, every=0, last_round=7) for r in range(1, 8))


def test_the_round_record_is_built_from_the_clients_evaluations() -> None:
    rounds = Rounds(recorder=None)
    rounds.offset = 5
    rl = rounds.of(1)
    rl.train_losses = [1.0, 3.0]
    replies = [
        Reply("a", [], 10, {f"{EVAL_PREFIX}accuracy": 0.5, f"{EVAL_PREFIX}num-examples": 10}),
        Reply("b", [], 30, {f"{EVAL_PREFIX}accuracy": 1.0, f"{EVAL_PREFIX}num-examples": 30}),
        Reply("c", [], 30, {"train-loss": 1.0}),  # no evaluation carried
    ]
    evals = evaluations_in_fit(replies)
    assert [e.client_key for e in evals] == ["a", "b"]
    _, metrics = rounds.record(1, evals)
    assert metrics["accuracy"] == 0.75 and metrics["accuracy-pooled"] == 0.875
    bad = Evaluation("x", 0.0, 5, {"accuracy": 1.5})
    assert bad.problem() == "accuracy 1.5"


def test_the_first_round_waits_for_registrations_to_settle() -> None:
    """Nodes register one by one while the first round waits: it waits until the
    count stops changing, so all five are there (without the wait: one)."""
    import threading
    import time

    manager = SimpleClientManager()
    manager.register(FakeProxy(0))

    def arrive() -> None:
        for node in range(1, 5):
            time.sleep(0.3)
            manager.register(FakeProxy(node))

    late = threading.Thread(target=arrive)
    late.start()
    sampler = Sampler(min_available_clients=1)
    assert sampler.wait_for_federation(manager) == 5
    late.join()
    assert len(sampler.sample(manager, 0.5, 1, "fit")) == 3  # ceil(0.5 x 5)
    assert len(sampler.sample(manager, 0.01, 1, "fit")) == 1  # at least one


def test_a_rounds_sample_is_the_seeds_in_any_run_and_any_registration_order() -> None:
    """The same seed and round draw the same clients whatever order the nodes
    registered in, and whatever Python's global generator did before (Flower's own
    sample draws from it); another round, kind or seed draws others. In simulation
    the clients are ranked by the engine's registration order (the partition ids),
    not by their random node ids."""
    import random
    from types import SimpleNamespace

    from flwr.server import SimpleClientManager

    def drawn(nodes: list[int], seed: int, server_round: int, kind: str = "fit") -> list[int]:
        manager = SimpleClientManager()
        for node in nodes:
            manager.register(FakeProxy(node))
        random.seed(len(nodes) + server_round)  # whatever came before
        sampler = Sampler(min_available_clients=1, seed=seed)
        sampler.settled = True
        return sorted(p.node_id for p in sampler.sample(manager, 0.1, server_round, kind))

    nodes = list(range(1, 101))
    first = drawn(nodes, 0, 3)
    assert len(first) == 10
    assert drawn(list(reversed(nodes)), 0, 3) == first
    assert drawn(nodes, 0, 4) != first and drawn(nodes, 1, 3) != first
    assert drawn(nodes, 0, 3, "evaluate") != first

    # a simulation's random node ids, ranked by the order the engine registered them
    ids = random.Random(7).sample(range(10**6, 10**9), 100)
    state = SimpleNamespace(nodes={node: None for node in ids}, lock=None)
    grid = SimpleNamespace(state=state)
    manager = SimpleClientManager()
    for node in sorted(ids):
        proxy = FakeProxy(node)
        proxy.grid = grid
        manager.register(proxy)
    sampler = Sampler(min_available_clients=1, seed=0)
    sampler.settled = True
    places = sorted(ids.index(p.node_id) + 1 for p in sampler.sample(manager, 0.1, 3, "fit"))
    assert places == first  # the same partitions as nodes 1..100 in order
