"""APFL (methods/apfl/): alpha's gradient and the three steps against hand-computed
values on a one-layer linear model, alpha held in [0, 1], the prediction as the mix
of the parameters, only w on the wire, v and alpha surviving a restart, its keys, and
a short federation with ``method='apfl'`` alone."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays
from torch import nn

from methods import parse_run_config
from methods.apfl import ApflParams
from methods.apfl.client import mix_into_local, paper_step, pfllib_alpha_grad, step_alpha
from methods.apfl.model import ApflModel
from pflower.config.schema import ConfigError
from tests.helpers import (
    assert_only_the_global_copy_travels,
    config,
    make_client,
    make_strategy,
    short_federation,
)

ROOT = Path(__file__).resolve().parents[1]


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def linear_apfl(alpha: float) -> ApflModel:
    """w = 0; v = [[1, 0], [0, 0]], no bias: on x = (1, 0) the mix's logits are
    (alpha, 0) and w's are (0, 0)."""
    model = ApflModel(nn.Linear(2, 2, bias=False), alpha)
    with torch.no_grad():
        model.global_model.weight.zero_()
        model.local_model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    return model


X = torch.tensor([[1.0, 0.0]])


def test_alphas_gradient_is_v_minus_w_against_the_gradient_at_the_mix() -> None:
    # label 0, alpha 0.5: the logits' gradient is p - e_0 = (-s, s), s = sigmoid(-0.5);
    # the weight's gradient is its outer product with x, and v - w has a 1 only at
    # [0, 0]: d f / d alpha = <v - w, grad f(mix)> = -s
    model, y = linear_apfl(0.5), torch.tensor([0])
    alpha = model.alpha.clone().requires_grad_(True)
    F.cross_entropy(model.mixed(X, alpha), y).backward()
    assert alpha.grad is not None
    assert alpha.grad.item() == pytest.approx(-sigmoid(-0.5), rel=1e-6)


def test_one_batch_steps_w_v_and_alpha_from_the_same_point() -> None:
    model, y = linear_apfl(0.5), torch.tensor([0])
    params = ApflParams(alpha_lr=0.2)
    lr, s = 0.1, sigmoid(-0.5)
    opt = torch.optim.SGD([*model.global_model.parameters(), *model.local_model.parameters()], lr)
    losses = paper_step(model, opt, X, y, params)
    assert losses[0].item() == pytest.approx(math.log(2))  # w's logits (0, 0)
    assert losses[1].item() == pytest.approx(math.log(1 + math.exp(-0.5)))  # the mix's (0.5, 0)
    # w on its own loss: p = (1/2, 1/2), gradient (-1/2, 1/2) x (1, 0)
    want_w = torch.tensor([[0.05, 0.0], [-0.05, 0.0]])
    torch.testing.assert_close(model.global_model.weight.detach(), want_w)
    # v on the mix's loss: alpha times the gradient at the mix, (-s, s) x (1, 0)
    want_v = torch.tensor([[1 + lr * 0.5 * s, 0.0], [-lr * 0.5 * s, 0.0]])
    torch.testing.assert_close(model.local_model.weight.detach(), want_v)
    # alpha down its gradient -s, from the pre-step v and w
    assert model.alpha.item() == pytest.approx(0.5 + 0.2 * s, rel=1e-6)


def test_alpha_is_clipped_to_the_unit_interval() -> None:
    big = ApflParams(alpha_lr=100.0)
    up = linear_apfl(0.9)  # label 0: the gradient is negative, alpha would pass 1
    opt = torch.optim.SGD(up.parameters(), 0.0)
    paper_step(up, opt, X, torch.tensor([0]), big)
    assert up.alpha.item() == 1.0
    down = linear_apfl(0.1)  # label 1: d f / d alpha = sigmoid(0.1) > 0, alpha would pass 0
    paper_step(down, torch.optim.SGD(down.parameters(), 0.0), X, torch.tensor([1]), big)
    assert down.alpha.item() == 0.0
    held = linear_apfl(0.3)
    paper_step(held, torch.optim.SGD(held.parameters(), 0.0), X, torch.tensor([0]), ApflParams())
    assert 0.0 <= held.alpha.item() <= 1.0


def test_pfllibs_alpha_gradient_and_decay() -> None:
    # <v - w, alpha grad f(v) + (1 - alpha) grad f(w)> + decay alpha, on set gradients
    model = linear_apfl(0.25)
    model.local_model.weight.grad = torch.tensor([[2.0, 5.0], [1.0, 1.0]])
    model.global_model.weight.grad = torch.tensor([[-4.0, 7.0], [3.0, 3.0]])
    grad = pfllib_alpha_grad(model)  # v - w is 1 at [0, 0] only
    assert grad.item() == pytest.approx(0.25 * 2.0 + 0.75 * -4.0)
    step_alpha(model, grad, ApflParams(alpha_lr=0.1, alpha_decay=0.02))
    assert model.alpha.item() == pytest.approx(0.25 - 0.1 * (-2.5 + 0.02 * 0.25))
    mix_into_local(model)  # the round's end: v is the mix
    torch.testing.assert_close(model.local_model.weight.detach()[0, 0], model.alpha[0])


def test_the_prediction_mixes_the_parameters_not_the_outputs() -> None:
    client, _ = make_client(config(method="apfl", alpha=0.3))
    model, a = client.model, 0.3
    with torch.no_grad():
        for p in model.local_model.parameters():
            p.add_(torch.randn_like(p))
    glob = model.global_model.state_dict()
    mix = {n: a * v + (1 - a) * glob[n] for n, v in model.local_model.state_dict().items()}
    reference = copy.deepcopy(model.local_model)
    reference.load_state_dict(mix)
    x = client.x_test[:16]
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))
        by_outputs = a * model.local_model(x) + (1 - a) * model.global_model(x)
        assert not torch.allclose(model(x), by_outputs, atol=1e-4)  # the MLP is not linear
    _, _, scores = client.evaluate([], {"server-round": 1})  # scored with the mix
    with torch.no_grad():
        hits = (reference(client.x_test).argmax(1) == client.y_test).float().mean()
    assert scores["accuracy"] == pytest.approx(float(hits))


def test_only_w_travels_and_v_and_alpha_stay() -> None:
    client, personal = assert_only_the_global_copy_travels(config(method="apfl"))
    assert personal == {f"local_model.{k}" for k in client.model.local_model.state_dict()} | {
        "alpha"
    }


def test_v_and_alpha_survive_a_restart() -> None:
    cfg = config(method="apfl", local_epochs=2, lr=0.2)
    client, context = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    trained = client.personal_state()
    assert trained["alpha"].shape == (1,) and trained["alpha"][0] != 0.5  # alpha was learned
    assert 0.0 <= trained["alpha"][0] <= 1.0
    # a new client process on the same node's store, from a fresh model
    again, _ = make_client(cfg, context=context)
    assert again.model.alpha.item() == 0.5
    again.restore_personal()
    assert set(again.personal_state()) == set(trained)
    for name, value in trained.items():
        np.testing.assert_array_equal(again.personal_state()[name], value)
    assert again.model.alpha.item() == pytest.approx(float(trained["alpha"][0]))


def test_a_held_alpha_stays_where_it_starts() -> None:
    cfg = config(method="apfl", alpha=0.25, adaptive_alpha=False)
    client, _ = make_client(cfg)
    client.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 1})
    assert client.model.alpha.item() == 0.25
    assert not torch.equal(
        client.model.local_model.head.weight, client.model.global_model.head.weight
    )


def test_the_mix_trains_the_local_copys_batchnorm_statistics() -> None:
    backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model = ApflModel(backbone, 0.5)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    x, y = torch.randn(8, 3) + 2.0, torch.randint(0, 2, (8,))
    paper_step(model, opt, x, y, ApflParams())
    local, glob = model.local_model[1], model.global_model[1]
    assert int(local.num_batches_tracked) == int(glob.num_batches_tracked) == 1
    assert not torch.equal(local.running_mean, torch.zeros(4))
    model.eval()
    with torch.no_grad():
        reference = copy.deepcopy(model.local_model)
        reference.load_state_dict({**reference.state_dict(), **model.mixed_parameters()})
        torch.testing.assert_close(model(x), reference(x))


def test_pfllibs_variant_predicts_with_v_holding_the_mix() -> None:
    cfg = config(method="apfl", variant="pfllib")
    assert cfg.params.alpha_decay == 0.02 and "apfl.alpha-decay" in cfg.auto_resolved
    client, _ = make_client(cfg)
    client.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 1})
    x = client.x_test[:16]
    with torch.no_grad():
        torch.testing.assert_close(client.model(x), client.model.local_model(x))
    assert 0.0 <= client.model.alpha.item() <= 1.0


def test_its_keys_are_namespaced_validated_and_follow_the_lr() -> None:
    cfg = parse_run_config({"method": "apfl", "lr": 0.2})
    params = ApflParams.of(cfg)
    assert (params.alpha, params.adaptive_alpha, params.variant) == (0.5, True, "paper")
    assert params.alpha_lr == 0.2 and "apfl.alpha-lr" in cfg.auto_resolved
    assert params.alpha_decay == 0.0
    assert cfg.as_dict()["apfl.alpha"] == 0.5
    given = parse_run_config({"method": "apfl", "apfl.alpha-lr": 0.01})
    assert ApflParams.of(given).alpha_lr == 0.01 and "apfl.alpha-lr" not in given.auto_resolved
    for bad in ({"apfl.alpha": 2}, {"apfl.alpha": -0.1}, {"apfl.alpha-lr": -1}):
        key = next(iter(bad))
        with pytest.raises(ConfigError, match=f"'{key}'"):
            parse_run_config({"method": "apfl", **bad})
    with pytest.raises(ConfigError, match="'apfl.variant'"):
        parse_run_config({"method": "apfl", "apfl.variant": "fedtorch"})


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("apfl", tmp_path)
    last = res["rounds"][-1]
    assert np.isfinite(res["final_accuracy_mean"]) and not last["rejected"]
