"""pFedMe (methods/pfedme/): the inner steps on a 1-D quadratic against their hand-computed
iterates and the closed-form proximal point, w's step, the server's beta step against
hand-computed means, only w on the wire, theta kept by the client (across a restart) and
scored, its keys, and a short federation with ``method='pfedme'`` alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays
from torch import nn

from methods import parse_run_config
from methods.pfedme import PFedMeParams
from methods.pfedme.client import inner_steps, outer_step
from pflower.config.schema import ConfigError
from strategies.replies import Reply
from tests.helpers import (
    assert_only_the_global_copy_travels,
    config,
    make_client,
    make_strategy,
    raw_config,
    short_federation,
)

ROOT = Path(__file__).resolve().parents[1]


def solve(w: float, k: int, lam: float = 3.0, lr: float = 0.1, mu: float = 0.0) -> float:
    """theta after k inner steps from theta = w on f(theta) = 0.5 a (theta - c)^2, a = 1,
    c = 4 (grad f = theta - 4)."""
    theta = nn.Parameter(torch.tensor([w], dtype=torch.float64))
    anchor = torch.tensor([w], dtype=torch.float64)
    params = PFedMeParams(k=k, lam=lam, personal_lr=lr, mu=mu)
    inner_steps([theta], [anchor], lambda: 0.5 * ((theta - 4.0) ** 2).sum(), params)
    return float(theta.detach())


def test_the_inner_steps_on_a_quadratic_reach_the_proximal_point() -> None:
    # one step from theta = w = 0: 0 - 0.1 (1 (0 - 4) + 3 (0 - 0)) = 0.4
    assert solve(0.0, 1) == pytest.approx(0.4)
    # each step: theta - theta* shrinks by 1 - lr (a + lambda) = 1 - 0.1 * 4 = 0.6, where
    # theta* = (a c + lambda w) / (a + lambda) = (4 + 0) / 4 = 1: theta_K = 1 - 0.6^K
    assert solve(0.0, 2) == pytest.approx(0.64)
    assert solve(0.0, 5) == pytest.approx(0.92224)
    assert solve(0.0, 200) == pytest.approx(1.0)
    # w = 2: theta* = (4 + 3 * 2) / 4 = 2.5; one step 2 - 0.1 (2 - 4) = 2.2 = 2.5 - 0.5 * 0.6
    assert solve(2.0, 1) == pytest.approx(2.2)
    assert solve(2.0, 200) == pytest.approx(2.5)


def test_mu_adds_an_l2_term_to_the_inner_problem() -> None:
    # mu = 0.5: step 1 from 0: 0 - 0.1 (-4 + 0 + 0) = 0.4; step 2 from 0.4:
    # 0.4 - 0.1 ((0.4 - 4) + 3 * 0.4 + 0.5 * 0.4) = 0.4 - 0.1 (-2.2) = 0.62
    assert solve(0.0, 2, mu=0.5) == pytest.approx(0.62)
    # the proximal point (a c + lambda w) / (a + lambda + mu) = 4 / 4.5
    assert solve(0.0, 300, mu=0.5) == pytest.approx(4 / 4.5)


def test_ws_step_moves_it_eta_lambda_of_the_way_to_theta() -> None:
    # w <- w - eta lambda (w - theta) = 0 - 0.1 * 3 (0 - 0.92224) = 0.276672
    w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    theta = torch.tensor([0.92224], dtype=torch.float64)
    outer_step([w], [theta], torch.optim.SGD([w], lr=0.1), lam=3.0)
    assert float(w.detach()) == pytest.approx(0.276672)
    outer_step([w], [theta], torch.optim.SGD([w], lr=0.1), lam=3.0)  # 0.7 of the gap left
    assert float(w.detach()) == pytest.approx(0.92224 - 0.7 * 0.7 * 0.92224)


def test_a_one_batch_round_sends_w_moved_towards_the_kept_theta() -> None:
    # one batch, plain SGD: the upload y = w0 + eta lambda (theta - w0), theta as kept
    keys = {"batch-size": 10_000, "local-epochs": 1, "momentum": 0.0, "weight-decay": 0.0}
    cfg = config(method="pfedme", lr=0.02, **keys)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    w0 = {k: v.clone() for k, v in client.model.global_model.state_dict().items()}
    upload, _, _ = client.fit(payload, {"server-round": 1})
    theta = client.personal_state()
    eta_lam = 0.02 * 15.0
    for (name, start), sent in zip(w0.items(), upload, strict=True):
        mine = theta[f"personal_model.{name}"]
        assert not np.allclose(mine, start.numpy())  # theta moved off w0
        want = start.numpy() + eta_lam * (mine - start.numpy())
        np.testing.assert_allclose(sent, want, rtol=1e-5, atol=1e-6)


def test_each_round_starts_theta_at_the_received_w() -> None:
    # personal-lr 1e-7: theta ends each round (practically) where it started
    cfg = config(method="pfedme", **{"pfedme.personal-lr": 1e-7})
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    moved = [(a + 0.5).astype(a.dtype) if a.dtype.kind == "f" else a for a in payload]
    client.fit(moved, {"server-round": 2})
    theta = client.model.personal_model.state_dict()
    for name, received in zip(client.model.global_model.state_dict(), moved, strict=True):
        if name in dict(client.model.personal_model.named_parameters()):
            np.testing.assert_allclose(theta[name].numpy(), received, atol=1e-4)


def test_the_server_moves_the_mean_by_beta() -> None:
    # beta = 2: x + 2 (mean - x). Replies x + 1 and x + 3: by equal weights (the card's
    # mean) mean - x = 2, so x + 4; by sample counts 10 and 30, (10 + 90) / 40 = 2.5, so x + 5
    for rule, counts, want in (("mean", (10, 30), 4.0), ("weighted", (10, 30), 5.0)):
        cfg = config(method="pfedme", aggregation=rule, **{"pfedme.beta": 2.0})
        strategy = make_strategy(cfg)
        before = [a.copy() for a in strategy.global_arrays]
        ups = [[(a + d).astype(a.dtype) for a in before] for d in (1.0, 3.0)]
        replies = [Reply(f"client-{i}", ups[i], counts[i], {}) for i in range(2)]
        strategy.aggregate_held(1, replies, {})
        for x, got in zip(before, strategy.global_arrays, strict=True):
            if x.dtype.kind == "f":
                np.testing.assert_allclose(got, x + want, rtol=1e-6, atol=1e-5)
    # beta = 1 (the default): the mean itself, x + 2
    strategy = make_strategy(config(method="pfedme"))
    before = [a.copy() for a in strategy.global_arrays]
    ups = [[(a + d).astype(a.dtype) for a in before] for d in (1.0, 3.0)]
    strategy.aggregate_held(1, [Reply(f"c{i}", u, 5, {}) for i, u in enumerate(ups)], {})
    for x, got in zip(before, strategy.global_arrays, strict=True):
        np.testing.assert_allclose(got, x + 2.0, rtol=1e-6, atol=1e-5)


def test_only_w_travels_and_theta_stays() -> None:
    client, personal = assert_only_the_global_copy_travels(config(method="pfedme"))
    assert personal == {f"personal_model.{k}" for k in client.model.personal_model.state_dict()}


def test_theta_survives_a_restart_and_is_what_is_scored() -> None:
    cfg = config(method="pfedme", local_epochs=2)
    client, context = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    trained = client.personal_state()
    # a new client process on the same node's store, from a fresh model
    again, _ = make_client(cfg, context=context)
    fresh = again.personal_state()
    assert any(not np.array_equal(fresh[k], v) for k, v in trained.items())
    _, _, scores = again.evaluate(payload, {"server-round": 1})  # restores theta, receives w
    for name, value in trained.items():
        np.testing.assert_array_equal(again.personal_state()[name], value)
    with torch.no_grad():
        hits = again.model.personal_model(again.x_test).argmax(1) == again.y_test
    assert scores["accuracy"] == pytest.approx(float(hits.float().mean()))
    with torch.no_grad():  # the received w differs from theta: theta, not w, was scored
        x = again.x_test[:16]
        assert not torch.allclose(again.model(x), again.model.global_model(x))


def test_evaluate_global_scores_w_with_thetas_buffers() -> None:
    backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    from methods.pfedme.model import PFedMeModel

    model = PFedMeModel(backbone, personal=False)
    with torch.no_grad():
        model.personal_model[1].running_mean.fill_(2.0)
        for p in model.personal_model.parameters():
            p.add_(1.0)
    model.eval()
    x = torch.randn(5, 3)
    reference = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()
    state = dict(model.global_model.state_dict())
    state["1.running_mean"] = torch.full((4,), 2.0)
    reference.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))
    cfg = config(method="pfedme", evaluate="global")
    client, _ = make_client(cfg)
    client.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 1})
    with torch.no_grad():
        x = client.x_test[:16]
        torch.testing.assert_close(client.model(x), client.model.global_model(x))  # no BN


def test_its_keys_defaults_profile_and_refusals() -> None:
    params = PFedMeParams.of(parse_run_config({"method": "pfedme"}))
    assert (params.k, params.lam, params.personal_lr, params.beta, params.mu) == (
        5,
        15.0,
        0.09,
        1.0,
        0.0,
    )
    assert params.evaluate == "personal"
    raw = {"method": "pfedme", "profile": "pfllib", "model": "cnn4"}
    pfl = PFedMeParams.of(parse_run_config(raw))
    assert (pfl.lam, pfl.personal_lr, pfl.beta, pfl.mu, pfl.k) == (1.0, 0.01, 1.0, 0.001, 5)
    for bad in (
        {"pfedme.k": 0},
        {"pfedme.lambda": 0},
        {"pfedme.beta": 0},
        {"pfedme.mu": -1},
        {"pfedme.personal-lr": 0},
        {"pfedme.evaluate": "both"},
        {"pfedme.personal-lr": 0.2},  # 0.2 * (15 + 0) >= 2: the inner steps diverge
    ):
        key = next(iter(bad))
        with pytest.raises(ConfigError, match=f"'{key}'"):
            parse_run_config({"method": "pfedme", **bad})
    with pytest.raises(ConfigError, match="'pfedme.lambda'"):  # lr 0.2 * 15 >= 2 (no momentum)
        parse_run_config(raw_config(method="pfedme", lr=0.2, momentum=0.0))


def test_secure_aggregation_and_dp_apply() -> None:
    parse_run_config(raw_config(method="pfedme", **{"secure-aggregation": True}))
    parse_run_config(raw_config(method="pfedme", **{"dp-mode": "client"}))


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("pfedme", tmp_path)
    last = res["rounds"][-1]
    assert np.isfinite(res["final_accuracy_mean"]) and not last["rejected"]
