"""LG-FedAvg (methods/lg_fedavg): its split is FedPer's turned round (the body
personal, the head shared) on every backbone, only the head travels and the client
is scored with its own body under the received head, a backbone without a body is
refused, and a short federation runs with ``method='lg-fedavg'`` alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays

from client_app.base import PFLClient
from client_app.method_client import client_class
from methods import ConfigError, get_method, method_names, parse_run_config
from models.backbones import build_backbone
from pflower.data import DataInfo, data_info
from tests.helpers import config, make_client, make_strategy, raw_config, short_federation

CIFAR = DataInfo((3, 32, 32), 10)
HEAD = ("head.weight", "head.bias")


def test_lg_fedavg_is_registered_with_the_base_schedule_and_mean() -> None:
    assert "lg-fedavg" in method_names()
    method = get_method("lg-fedavg")
    assert client_class(method) is PFLClient  # every parameter, local-epochs, cross-entropy
    assert method.aggregation == "weighted" and not method.per_client


def _roles(method: str, model: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    raw = raw_config(method=method, model=model)
    if model != "mlp":
        raw["dataset"] = "images.parquet"
    cfg = parse_run_config(raw)
    m = get_method(method)
    roles = m.roles(m.build_model(cfg, CIFAR if model != "mlp" else data_info(cfg)), cfg)
    return roles.shared, roles.personal


def test_on_the_mlp_the_hidden_layer_is_personal_and_the_head_shared() -> None:
    shared, personal = _roles("lg-fedavg", "mlp")
    assert shared == HEAD
    assert personal == ("features.1.weight", "features.1.bias")


def test_on_cnn4_every_conv_and_the_fc_layer_are_personal() -> None:
    shared, personal = _roles("lg-fedavg", "cnn4")
    assert shared == HEAD
    layers = ("features.0", "features.3", "features.7")  # conv, conv, Linear(-> 512)
    assert personal == tuple(f"{layer}.{p}" for layer in layers for p in ("weight", "bias"))


@pytest.mark.parametrize("model", ["mlp", "cnn4", "resnet8"])
def test_the_split_is_fedpers_turned_round(model: str) -> None:
    shared, personal = _roles("lg-fedavg", model)
    assert (shared, personal) == _roles("fedper", model)[::-1]
    if model == "resnet8":  # BatchNorm's statistics belong to the local representation
        assert any(n.endswith("running_mean") for n in personal) and shared == HEAD


def test_only_the_head_travels_and_the_score_is_the_own_body_under_the_received_head() -> None:
    cfg = config(method="lg-fedavg", local_epochs=2)
    client, _ = make_client(cfg)
    strategy = make_strategy(cfg)
    assert tuple(s.name for s in strategy.spec) == HEAD
    payload = parameters_to_ndarrays(strategy.global_payload())
    body_before = {k: v.clone() for k, v in client.model.features.state_dict().items()}
    upload, n, _ = client.fit(payload, {"server-round": 1})
    assert strategy.check_reply(client.client_key, upload, n) is None
    head = client.model.head
    assert len(upload) == 2
    np.testing.assert_array_equal(upload[0], head.weight.detach().numpy())
    np.testing.assert_array_equal(upload[1], head.bias.detach().numpy())
    assert not np.array_equal(upload[0], payload[0])  # the head trained before it went back
    # the body trained too, and was stored, never sent
    stored = client.store.load()
    assert set(stored) == {f"features.{k}" for k in body_before}
    assert any(
        not np.array_equal(stored[f"features.{k}"], v.numpy()) for k, v in body_before.items()
    )
    # a new round's head replaces the client's; its own body stays
    new_head = [np.full_like(a, 0.01 * (i + 1)) for i, a in enumerate(payload)]
    _, _, scores = client.evaluate(new_head, {"server-round": 2})
    np.testing.assert_array_equal(head.weight.detach().numpy(), new_head[0])
    for k, v in client.model.features.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), stored[f"features.{k}"])
    with torch.no_grad():
        own = client.model(client.x_test).argmax(1)
    assert scores["accuracy"] == pytest.approx(float((own == client.y_test).float().mean()))


def test_a_backbone_without_a_body_is_a_config_error_naming_the_model() -> None:
    assert not list(build_backbone("logreg", (20,), 2).state_dict().keys() - set(HEAD))
    cfg = config(method="lg-fedavg", model="logreg")
    with pytest.raises(ConfigError, match="'model'.*'logreg'"):
        get_method("lg-fedavg").build_model(cfg, data_info(cfg))


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("lg-fedavg", tmp_path, clients=3)
    last = res["rounds"][-1]
    assert np.isfinite(last["accuracy_mean"]) and not last["rejected"]
    # what went up is three heads (and their headers), not three whole models
    cfg = parse_run_config({"method": "lg-fedavg", "sim-samples": 60, "hidden-dim": 16})
    model = get_method("lg-fedavg").build_model(cfg, data_info(cfg))
    head = sum(t.numel() * t.element_size() for t in model.head.state_dict().values())
    body = sum(t.numel() * t.element_size() for t in model.features.state_dict().values())
    assert 3 * head <= last["bytes_up"] < 3 * (head + body)
