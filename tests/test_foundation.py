"""The foundation: roles, wire, personal state, validation, config, end to end."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays

from methods import get_method, parse_run_config
from models.backbones import build_backbone
from pflower.config.schema import ConfigError, RunConfig, check_against_data
from pflower.engine.simulate import simulate
from tests.helpers import FakeProxy, config, fit_res, make_client, make_strategy

BASELINES = ["fedavg", "local", "fedper", "fedrep", "fedbn"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("method", BASELINES)
@pytest.mark.parametrize("model", ["mlp", "resnet8"])
def test_roles_are_disjoint_and_cover_the_model(method: str, model: str) -> None:
    net = build_backbone(model, (3, 32, 32), 10)
    roles = get_method(method).roles(net, config(method=method, model=model))
    names = list(net.state_dict())
    assert not set(roles.shared) & set(roles.personal)
    assert sorted(roles.shared + roles.personal) == sorted(names)
    personal = set(roles.personal)
    if method == "fedavg":
        assert not personal
    if method == "local":
        assert not roles.shared
    if method in ("fedper", "fedrep"):
        assert personal == {n for n in names if n.startswith("head.")}
    if method == "fedbn" and model == "resnet8":
        assert personal and all(".1." in n or "bn" in n or "downsample" in n for n in personal)
        assert not any(n.endswith("conv1.weight") for n in personal)


@pytest.mark.parametrize("method", BASELINES)
def test_the_wire_carries_exactly_the_shared_list(method: str) -> None:
    cfg = config(method=method)
    client, _ = make_client(cfg)
    strategy = make_strategy(cfg)
    sent = client.fit(parameters_to_ndarrays(strategy.global_payload()), {"server-round": 1})[0]
    assert [tuple(a.shape) for a in sent] == [s.shape for s in strategy.spec]
    assert [str(a.dtype) for a in sent] == [s.dtype for s in strategy.spec]
    assert len(sent) == len(client.roles.shared)
    if method == "local":
        assert sent == [] and strategy.spec == []


@pytest.mark.parametrize("method", ["fedper", "fedrep", "fedbn", "local"])
def test_personal_tensors_survive_aggregation_and_are_restored(method: str) -> None:
    cfg = config(method=method, model="mlp")
    client, context = make_client(cfg)
    strategy = make_strategy(cfg)
    payload = parameters_to_ndarrays(strategy.global_payload())
    upload, n, _ = client.fit(payload, {"server-round": 1})
    trained_personal = client.personal_state()
    assert trained_personal or method == "fedbn"  # the MLP has no BatchNorm
    # the server aggregates with another client's reply: personal parts are untouched
    other, _ = make_client(cfg, partition_id=1)
    upload2, n2, _ = other.fit(payload, {"server-round": 1})
    strategy.aggregate_fit(
        1,
        [
            (FakeProxy(1), fit_res(upload, "client-0", n)),
            (FakeProxy(2), fit_res(upload2, "client-1", n2)),
        ],
        [],
    )
    # a fresh client object for the same node (Flower builds one per round) restores them
    again, _ = make_client(cfg, context=context)
    again.restore_personal()
    for name, value in trained_personal.items():
        np.testing.assert_array_equal(again.personal_state()[name], value)
    fresh, _ = make_client(cfg, partition_id=2)
    if trained_personal:
        assert any(
            not np.array_equal(fresh.personal_state()[k], v) for k, v in trained_personal.items()
        ), "a client that never trained must not see another client's personal tensors"


def test_aggregation_is_the_sample_weighted_mean() -> None:
    # the bounds off: at two sites they cap the larger count at 2x the smaller one
    cfg = config(method="fedavg", **{"weight-cap": 0.0, "update-norm-bound": 0.0})
    strategy = make_strategy(cfg)
    a = [np.full(s.shape, 1.0, dtype=s.dtype) for s in strategy.spec]
    b = [np.full(s.shape, 4.0, dtype=s.dtype) for s in strategy.spec]
    strategy.aggregate_fit(
        1,
        [(FakeProxy(1), fit_res(a, "client-0", 10)), (FakeProxy(2), fit_res(b, "client-1", 30))],
        [],
    )
    for g in strategy.global_arrays:
        np.testing.assert_allclose(g, 3.25)


def test_too_few_replies_keep_the_global_state(caplog) -> None:
    cfg = config(method="fedavg", min_replies=2)
    strategy = make_strategy(cfg)
    before = [a.copy() for a in strategy.global_arrays]
    good = [np.full(s.shape, 2.0, dtype=s.dtype) for s in strategy.spec]
    with caplog.at_level("ERROR", logger="flwr"):
        strategy.aggregate_fit(
            1, [(FakeProxy(1), fit_res(good, "client-0"))], [RuntimeError("gone")]
        )
    assert "min-replies=2" in caplog.text
    for g, b in zip(strategy.global_arrays, before):
        np.testing.assert_array_equal(g, b)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"alpha": 0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"method": "fedsgd"}, "method"),
        ({"num-server-rounds": "ten"}, "num-server-rounds"),
        ({"no-such-key": 1}, "no-such-key"),
        ({"test-fraction": 1.5}, "test-fraction"),
        ({"partitioner": "random"}, "partitioner"),
        ({"lr": 0}, "lr"),
    ],
)
def test_config_errors_name_the_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_run_config(raw)


def test_more_classes_per_client_than_classes_names_the_key() -> None:
    cfg = parse_run_config({"partitioner": "pathological", "classes-per-client": 11})
    with pytest.raises(ConfigError, match="'classes-per-client'"):
        check_against_data(cfg, num_classes=10)


def test_pyproject_config_matches_the_schema_defaults() -> None:
    """The app's defaults are the schema's, but for the main job's method (a
    personalised one, docs/main_job.md; the library's neutral default is FedAvg)
    and the keys that say 'auto' (resolved per method, pflower/config/defaults.py). The
    methods' own tables (``[...config.fedcp]``) are checked in test_settings.py."""
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    toml = {k: v for k, v in app.items() if not isinstance(v, dict)}
    defaults = RunConfig().as_dict()
    assert set(toml) == set(defaults)
    assert toml["method"] == "fedfac-static" and defaults["method"] == "fedavg"
    for key, value in toml.items():
        if key != "method" and value != "auto":
            assert value == defaults[key], key
    parsed = parse_run_config({**toml, "method": "fedavg"})
    assert parsed.model_copy(update={"auto_resolved": ()}) == RunConfig()


@pytest.mark.slow
@pytest.mark.parametrize("method", BASELINES)
def test_end_to_end_simulation_improves(method: str, tmp_path: Path) -> None:
    cfg = {
        "method": method,
        "num-server-rounds": 3,
        "local-epochs": 2,
        "output-dir": str(tmp_path),
        "run-name": method,
    }
    results = simulate(cfg, num_clients=3)
    run_dir = tmp_path / method
    assert json.loads((run_dir / "results.json").read_text()) == results
    assert (run_dir / "accuracy.png").stat().st_size > 1000
    assert results["method"] == method and results["config"]["method"] == method
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        for key in (
            "accuracy_mean",
            "accuracy_pooled",
            "per_client_accuracy",
            "bytes_down",
            "bytes_up",
            "seconds",
        ):
            assert key in r
        assert len(r["per_client_accuracy"]) == 3
    assert results["final_accuracy_mean"] > rounds[0]["accuracy_mean"]
    assert results["best_accuracy_mean"] == max(r["accuracy_mean"] for r in rounds)
    if method == "local":
        assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 for r in rounds)
    else:
        assert all(r["bytes_up"] > 0 for r in rounds)


def test_a_round_waits_for_min_available_clients(monkeypatch, caplog) -> None:
    import threading

    from flwr.server.client_manager import SimpleClientManager

    import strategies.sampling

    cfg = config(method="fedavg", min_available_clients=2)
    strategy = make_strategy(cfg)
    manager = SimpleClientManager()
    manager.register(FakeProxy(1))
    late = threading.Timer(0.3, lambda: manager.register(FakeProxy(2)))
    late.start()
    sampled = strategy.configure_fit(1, strategy.global_payload(), manager)
    assert sorted(p.node_id for p, _ in sampled) == [1, 2]
    # a federation that never fills up: the round goes on with who is there
    monkeypatch.setattr(strategies.sampling, "WAIT_S", 0.2)
    strategy = make_strategy(config(method="fedavg", min_available_clients=5))
    with caplog.at_level("WARNING", logger="flwr"):
        sampled = strategy.configure_fit(1, strategy.global_payload(), manager)
    assert len(sampled) == 2 and "only 2 of 5 clients" in caplog.text


def test_cnn4_runs_a_cpu_image_batch_channels_last_with_the_same_numbers() -> None:
    """CNN4's features take a CPU image batch in channels-last memory (faster there:
    benchmarks/studies/channels_last.py); the layers, their state_dict and their numbers are
    those of the plain Sequential; a gradient stays in the parameter's own layout."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = build_backbone("cnn4", (3, 32, 32), 10)
    assert list(net.state_dict())[0] == "features.0.weight"
    seen: list[torch.Tensor] = []
    hook = net.features[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    x = torch.randn(5, 3, 32, 32)
    out = net(x)
    hook.remove()
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    assert not seen[0].is_contiguous()  # the batch of 5 as given was not
    plain = net.head(nn.Sequential.forward(net.features, x))
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert net.features[0].weight.grad.is_contiguous()
    # a flat input (no image) and an MLP are left as they are
    mlp = build_backbone("mlp", (3, 32, 32), 10)
    assert type(mlp.features) is nn.Sequential
