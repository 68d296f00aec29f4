"""The cohort engine (local-training = "cohort", pflower/engine/cohort.py): the same
clients, data, personal state and seeds as the per-client in-process engine, so the
same numbers, with no Message a client; refused where it cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.common import Context, RecordDict

from pflower.config.schema import ConfigError
from pflower.engine.inprocess import run_inprocess
from server_app.app import _run
from tests.helpers import SMALL

COMPARED = ("per_client_accuracy", "per_client_loss", "per_client_train_loss", "failed")


def _both(config: dict[str, Any], clients: int, tmp_path: Path, **kw: Any) -> list[dict]:
    runs = []
    for mode in ("per-client", "cohort"):
        cfg = {**SMALL, **config, "local-training": mode}
        cfg.update({"output-dir": str(tmp_path), "run-name": mode})
        runs.append(run_inprocess(cfg, clients, **kw))
    return runs


def largest_difference(a: dict, b: dict) -> float:
    """The largest relative difference between two runs' per-client figures."""
    worst = 0.0
    for ra, rb in zip(a["rounds"], b["rounds"], strict=True):
        for key in COMPARED[:3]:
            assert ra[key].keys() == rb[key].keys(), key
            for client, x in ra[key].items():
                worst = max(worst, abs(x - rb[key][client]) / max(abs(x), 1e-12))
    return worst


# one client after another inside the cohort: the per-client engine's own code, the same bits
@pytest.mark.parametrize(
    "method, keys",
    [
        ("fedrep", {}),
        ("ditto", {}),
        ("fedrod", {}),
        ("feddecomp", {"local-epochs": 2}),
        ("fedper", {"model": "cnn4", "dataset": "{dev:400}"}),  # a conv net, BatchNorm-free
        ("fedbn", {"model": "resnet8", "dataset": "{dev:400}", "batch-size": 8}),  # BatchNorm
    ],
)
def test_the_cohort_trains_every_client_as_the_per_client_engine(
    method: str, keys: dict, tmp_path
) -> None:
    if str(keys.get("dataset", "")).startswith("{dev"):
        from benchmarks.presets import resolve

        keys = {**keys, "dataset": resolve(keys["dataset"])}
        keys |= {"train-per-client": 16, "test-per-client": 4, "partitioner": "iid"}
    config = {"method": method, "num-server-rounds": 3, **keys}
    per_client, cohort = _both(config, 4, tmp_path)
    assert len(cohort["rounds"]) == 3
    for a, b in zip(per_client["rounds"], cohort["rounds"], strict=True):
        for key in COMPARED:
            assert a.get(key) == b.get(key), (method, a["round"], key)
        assert a["bytes_up"] == b["bytes_up"] and a["replies"] == b["replies"] == 4
    # not vacuous: the clients learned, each its own model
    last = cohort["rounds"][-1]["per_client_accuracy"]
    assert len(last) == 4 and len(set(cohort["rounds"][0]["per_client_train_loss"].values())) > 1


# the base schedule on the MLP: trained at once under vmap (client_app/batched.py); the
# tolerance is float rounding, measured (docs/PERFORMANCE.md: train losses within 2.1e-7 over
# 5 rounds on the study's MLP); 1e-4 leaves room for the other methods' schedules
@pytest.mark.parametrize(
    "method, keys",
    [
        ("fedavg", {}),
        ("fedavg-ft", {}),
        ("fedper", {"optimizer": "adam", "lr": 0.01, "weight-decay": 1e-4}),
        ("fedbn", {"momentum": 0.9, "weight-decay": 1e-3, "local-epochs": 2}),
        ("local", {"batch-size": 7}),
    ],
)
def test_the_batched_step_agrees_with_one_client_after_another(
    method: str, keys: dict, tmp_path, monkeypatch
) -> None:
    import pflower.engine.cohort

    batched = []
    step = pflower.engine.cohort.train_at_once
    monkeypatch.setattr(
        pflower.engine.cohort, "train_at_once", lambda *a: batched.append(1) or step(*a)
    )
    per_client, cohort = _both({"method": method, "num-server-rounds": 3, **keys}, 4, tmp_path)
    assert batched  # the clients trained at once
    assert largest_difference(per_client, cohort) < 1e-4
    assert [r["bytes_up"] for r in per_client["rounds"]] == [
        r["bytes_up"] for r in cohort["rounds"]
    ]
    # not vacuous: the clients learned, each its own model
    losses = cohort["rounds"][0]["per_client_train_loss"]
    assert len(losses) == 4 and len(set(losses.values())) > 1


def test_dropouts_and_a_refusing_site_fail_the_same_clients(tmp_path) -> None:
    nodes = [{"site": f"client-{i}"} for i in range(4)]
    nodes[1]["allowed-methods"] = "fedavg"  # refuses fedper
    config = {"method": "fedper", "num-server-rounds": 3, "dropout-rate": 0.3}
    per_client, cohort = _both(config, 4, tmp_path, node_configs=nodes)
    for a, b in zip(per_client["rounds"], cohort["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"], a["round"]
        assert a["failures"] == b["failures"] and len(a["failed"]) == len(b["failed"])
    failed = [why for r in cohort["rounds"] for why in r["failed"]]
    assert any("'allowed-methods'" in why and why.startswith("node 2: ") for why in failed)
    assert any("dropped out" in why for why in failed)


def test_the_cohort_is_refused_outside_the_in_process_engine() -> None:
    context = Context(0, 0, {}, RecordDict(), {})
    with pytest.raises(ConfigError, match="'local-training'.*in-process engine only"):
        _run(None, context, {**SMALL, "method": "fedavg", "local-training": "cohort"})


def test_a_message_attack_is_refused_under_the_cohort(tmp_path) -> None:
    config = {**SMALL, "method": "fedavg", "local-training": "cohort", "run-name": "x"}
    config.update({"attack": "sign-flip", "attack-clients": 1, "output-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="'local-training'.*attack 'sign-flip'"):
        run_inprocess(config, 2)


def test_a_bad_value_names_the_key() -> None:
    from methods import parse_run_config

    with pytest.raises(Exception, match="local-training"):
        parse_run_config({"method": "fedavg", "local-training": "batched"})


def test_the_auc_is_sklearns() -> None:
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from client_app.train import roc_auc

    rng = np.random.default_rng(0)
    for size in (2, 5, 20, 333):
        labels = rng.integers(0, 2, size)
        labels[:2] = (0, 1)  # both classes
        scores = np.round(rng.random(size), 1)  # ties
        assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
