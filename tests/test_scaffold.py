"""SCAFFOLD (methods/scaffold): its split, the corrected local step and option II's
control-variate update against a hand-computed case, the server's mean in two parts
(each with its own weights and step), the disclosure, and a short federation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays

from methods import ConfigError, parse_run_config
from strategies.replies import Reply
from tests.helpers import config, make_client, make_strategy, raw_config, short_federation


def test_only_the_clients_control_variate_stays_home() -> None:
    cfg = config(method="scaffold")
    client, _ = make_client(cfg)
    personal = set(client.roles.personal)
    assert personal and all(n.startswith("own_control.") for n in personal)
    shared = set(client.roles.shared)
    params = {n for n, _ in client.model.net.named_parameters()}
    assert {f"net.{n}" for n in params} <= shared
    assert {f"control.{n.replace('.', '__')}" for n in params} <= shared
    assert {f"own_control.{n.replace('.', '__')}" for n in params} == personal


def _gradient_at_start(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list:
    """The plain loss's gradient at the model as it stands, on the whole split."""
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    g = [p.grad.detach().clone() for p in net.parameters()]
    net.zero_grad()
    return g


def _one_step_client(**keys):
    # one batch holds the whole split: one local step per epoch
    cfg = config(method="scaffold", **{"batch-size": 10_000, "local-epochs": 1, "momentum": 0.0, "weight-decay": 0.0, **keys})  # fmt: skip
    client, _ = make_client(cfg)
    return cfg, client


def test_one_local_step_is_corrected_by_c_minus_c_i_and_c_i_becomes_the_gradient() -> None:
    cfg, client = _one_step_client()
    m, net = client.model, client.model.net
    gen = torch.Generator().manual_seed(3)
    for buf in (*m.control.of(net), *m.own_control.of(net)):
        buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
    c = [t.clone() for t in m.control.of(net)]
    c_i = [t.clone() for t in m.own_control.of(net)]
    x = [p.detach().clone() for p in net.parameters()]
    g = _gradient_at_start(net, client.x_train, client.y_train)
    client.local_train({}, torch.Generator().manual_seed(0))
    lr = cfg.lr
    for w, w0, gi, cg, ci in zip(net.parameters(), x, g, c, c_i):
        assert torch.allclose(w.detach(), w0 - lr * (gi + cg - ci), atol=1e-6)
    # option II after K = 1 step: c_i+ = c_i - c + (x - y) / lr = the gradient at x
    for own, gi in zip(m.own_control.of(net), g):
        assert torch.allclose(own, gi, atol=1e-5)
    # the control arrays go up as c + (c_i+ - c_i)
    for up, cg, ci, gi in zip(m.control.of(net), c, c_i, g):
        assert torch.allclose(up, cg + gi - ci, atol=1e-5)


def test_with_zero_controls_the_step_is_fedavgs() -> None:
    _, client = _one_step_client()
    net = client.model.net
    x = [p.detach().clone() for p in net.parameters()]
    g = _gradient_at_start(net, client.x_train, client.y_train)
    client.local_train({}, torch.Generator().manual_seed(0))
    for w, w0, gi in zip(net.parameters(), x, g):
        assert torch.allclose(w.detach(), w0 - client.cfg.lr * gi, atol=1e-6)


def test_the_server_moves_each_part_by_its_own_weights_and_step() -> None:
    # the model by sample count (aggregation='weighted'), moved half way (server-lr 0.5);
    # c by equal weights, moved by the round's share of the federation (2 of 4)
    cfg = config(method="scaffold", aggregation="weighted", **{"scaffold.server-lr": 0.5})
    strategy = make_strategy(cfg)
    strategy.rounds.facts.federation_size = 4
    before = [a.copy() for a in strategy.global_arrays]
    names = [s.name for s in strategy.wire.up_spec()]
    gen = np.random.default_rng(0)
    ups = [[gen.normal(size=a.shape).astype(a.dtype) for a in before] for _ in range(2)]
    counts = [10, 30]
    replies = [Reply(f"client-{i}", ups[i], counts[i], {}) for i in range(2)]
    strategy.aggregate_held(1, replies, {})
    after = strategy.global_arrays
    control = [n.startswith("control.") for n in names]
    assert any(control) and not all(control)
    for i, is_control in enumerate(control):
        x = before[i].astype(np.float64)
        u0, u1 = (u[i].astype(np.float64) for u in ups)
        if is_control:
            want = x + 0.5 * ((u0 + u1) / 2 - x)  # share 2/4, equal weights
        else:
            want = x + 0.5 * ((10 * u0 + 30 * u1) / 40 - x)  # server-lr 0.5, by count
        assert np.allclose(after[i], want.astype(before[i].dtype), atol=1e-6), names[i]


def test_a_mean_in_parts_streams_as_it_is_held() -> None:
    from strategies.robust import RunningMean, weighted_mean

    gen = np.random.default_rng(1)
    arrays = [[gen.normal(size=(3,)), gen.normal(size=(2, 2)).astype(np.float32)] for _ in range(3)]
    weights = [[5.0, 1.0], [7.0, 1.0], [2.0, 1.0]]
    held = weighted_mean(arrays, weights)
    total = RunningMean()
    for a, w in zip(reversed(arrays), reversed(weights)):
        total.add(a, w)
    for got, want in zip(total.mean(), held):
        assert np.array_equal(got, want)
    assert np.allclose(held[0], sum(w[0] * a[0] for a, w in zip(arrays, weights)) / 14)
    assert np.allclose(held[1], sum(a[1] for a in arrays) / 3)


def test_secure_aggregation_refuses_parts_weighed_apart_naming_the_key() -> None:
    raw = raw_config(method="scaffold", aggregation="weighted", **{"secure-aggregation": True})
    with pytest.raises(ConfigError, match="'secure-aggregation'.*aggregation='mean'"):
        parse_run_config(raw)
    parse_run_config(raw_config(method="scaffold", **{"secure-aggregation": True}))


def test_a_bad_server_lr_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="scaffold.server-lr"):
        parse_run_config(raw_config(method="scaffold", **{"scaffold.server-lr": 0}))


def test_the_payload_carries_the_model_and_c_and_nothing_personal() -> None:
    cfg = config(method="scaffold")
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    assert len(payload) == len(client.roles.shared)
    assert len(client.upload({})) == len(client.roles.shared)


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("scaffold", tmp_path)
    assert np.isfinite(res["final_accuracy_mean"])


def test_adam_is_refused_naming_the_key() -> None:
    # option II reads the local steps as SGD steps of size lr (docs/scaffold.md)
    with pytest.raises(ConfigError, match="config key 'optimizer'"):
        parse_run_config(raw_config(method="scaffold", optimizer="adam"))
