"""FedProx (methods/fedprox): the proximal term's gradient against a hand-computed
step, mu = 0 as FedAvg's step, the client's schedule against the same steps taken by
hand, its key, and a short federation with ``method='fedprox'`` alone."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays
from torch import nn

from client_app.method_client import client_class
from client_app.train import cross_entropy, train_epochs
from methods import ConfigError, get_method, method_names, parse_run_config
from methods.fedprox.client import with_proximal_term
from tests.helpers import config, make_client, make_strategy, short_federation

ROOT = Path(__file__).resolve().parents[1]


def test_fedprox_is_found_by_the_registry_and_names_only_its_own_package() -> None:
    assert "fedprox" in method_names()
    method = get_method("fedprox")
    assert client_class(method).__module__ == "methods.fedprox.client"
    assert method.aggregation == "weighted" and not method.per_client  # FedAvg's mean
    for path in (ROOT / "methods" / "fedprox").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("methods."):
                assert node.module.startswith(("methods.fedprox", "methods.baselines")), path


def _tiny() -> tuple[nn.Linear, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """A 3 -> 2 linear model at w, an anchor w_g away from it, a batch of 4."""
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.75, -0.5]]))
        model.bias.copy_(torch.tensor([0.1, -0.2]))
    anchor = [torch.tensor([[0.0, -0.5, 0.5], [0.25, 0.25, 0.0]]), torch.tensor([0.0, 0.3])]
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0], [1.0, 1.0, 1.0], [-2.0, 0.5, 0.0]])
    return model, anchor, x, torch.tensor([0, 1, 1, 0])


def _hand_ce_gradient(model: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """d mean-CE / d (W, b) of a linear softmax model, without autograd:
    (softmax(x W^T + b) - onehot(y))^T x / n and its column mean."""
    with torch.no_grad():
        logits = x @ model.weight.T + model.bias
        p = logits.exp() / logits.exp().sum(1, keepdim=True)
        residual = p - F.one_hot(y, 2).float()
        return [residual.T @ x / len(y), residual.mean(0)]


def _sgd_step(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
    """One full-batch step of the project's training loop with plain SGD."""
    cfg = config(method="fedprox", lr=lr, momentum=0.0, batch_size=len(y), local_epochs=1)
    assert cfg.optimizer == "sgd" and cfg.weight_decay == 0.0
    train_epochs(
        model, list(model.parameters()), x, y, 1, cfg, torch.Generator().manual_seed(0), loss_fn
    )


def test_the_proximal_term_adds_mu_times_the_distance_to_the_gradient() -> None:
    model, anchor, x, y = _tiny()
    mu, lr = 0.5, 0.1
    w = [p.detach().clone() for p in model.parameters()]
    ce = _hand_ce_gradient(model, x, y)
    # the loss: cross-entropy plus mu/2 ||w - w_g||^2, summed over every tensor
    pull = sum(float(((a - b) ** 2).sum()) for a, b in zip(w, anchor))
    loss = with_proximal_term(anchor, mu)(model, x, y)
    expected = float(F.cross_entropy(model(x), y).detach()) + mu / 2 * pull
    assert float(loss.detach()) == pytest.approx(expected)
    loss.backward()
    for p, g, a, b in zip(model.parameters(), ce, w, anchor):
        torch.testing.assert_close(p.grad, g + mu * (a - b))
    # one SGD step: w - lr (grad_ce + mu (w - w_g)), hand-computed
    model.zero_grad()
    _sgd_step(model, with_proximal_term(anchor, mu), x, y, lr)
    for p, g, a, b in zip(model.parameters(), ce, w, anchor):
        torch.testing.assert_close(p.detach(), a - lr * (g + mu * (a - b)))
        assert not torch.allclose(p.detach(), a - lr * g)  # the term moved it


def test_with_mu_zero_the_step_is_fedavgs() -> None:
    model, anchor, x, y = _tiny()
    plain = copy.deepcopy(model)
    _sgd_step(model, with_proximal_term(anchor, 0.0), x, y, 0.1)
    _sgd_step(plain, cross_entropy, x, y, 0.1)
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_with_mu_zero_the_client_uploads_what_fedavg_uploads() -> None:
    uploads = []
    for method, extra in (("fedprox", {"mu": 0.0}), ("fedavg", {})):
        cfg = config(method=method, local_epochs=2, **extra)
        client, _ = make_client(cfg)
        payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
        uploads.append(client.fit(payload, {"server-round": 1})[0])
    for a, b in zip(*uploads, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_client_takes_the_proximal_steps_from_the_received_model() -> None:
    # two full-batch steps: the first at w = w_g (the term is 0 there), the second
    # pulled back by mu (w1 - w_g); replayed by hand from the received model
    mu, lr = 10.0, 0.05
    cfg = config(method="fedprox", mu=mu, lr=lr, momentum=0.0, batch_size=10_000, local_steps=2)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    upload, _, _ = client.fit(payload, {"server-round": 1})
    x, y = client.x_train, client.y_train
    replay = copy.deepcopy(client.model)
    names = list(replay.state_dict())
    assert [n for n, _ in replay.named_parameters()] == names  # the MLP has no buffers
    with torch.no_grad():
        for p, a in zip(replay.parameters(), payload, strict=True):
            p.copy_(torch.as_tensor(a))
    w0 = [p.detach().clone() for p in replay.parameters()]
    free = None
    for step in range(2):
        replay.zero_grad()
        F.cross_entropy(replay(x), y).backward()
        with torch.no_grad():
            if step == 1:
                free = [p - lr * p.grad for p in replay.parameters()]
            for p, g in zip(replay.parameters(), w0):
                p -= lr * (p.grad + mu * (p - g))
    state = replay.state_dict()
    for name, sent in zip(names, upload, strict=True):
        np.testing.assert_allclose(sent, state[name].numpy(), rtol=1e-5, atol=1e-6)
    # without the pull the second step lands elsewhere: the check can tell them apart
    moved = max(float((s.detach() - f).abs().max()) for s, f in zip(replay.parameters(), free))
    assert moved > 1e-3


def _distance(mu: float) -> float:
    cfg = config(method="fedprox", mu=mu, local_epochs=3)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    upload, _, _ = client.fit(payload, {"server-round": 1})
    return float(np.sqrt(sum(((u - p) ** 2).sum() for u, p in zip(upload, payload))))


def test_mu_holds_the_local_model_nearer_the_received_one() -> None:
    assert _distance(0.0) > _distance(1.0) > _distance(20.0) > 0


def test_its_key_is_namespaced_validated_and_defaults_to_the_chosen_value() -> None:
    cfg = parse_run_config({"method": "fedprox"})
    assert cfg.params.mu == 0.01 and cfg.as_dict()["fedprox.mu"] == 0.01
    assert parse_run_config({"method": "fedprox", "fedprox.mu": 1}).params.mu == 1.0
    with pytest.raises(ConfigError, match="'fedprox.mu'"):
        parse_run_config({"method": "fedprox", "fedprox.mu": -1})
    with pytest.raises(ConfigError, match="unknown config key 'fedprox.mew'"):
        parse_run_config({"method": "fedprox", "fedprox.mew": 1})
    # lr 0.05 without momentum (mlp): plain SGD diverges on the term from mu = 2 / 0.05
    with pytest.raises(ConfigError, match="'fedprox.mu'"):
        config(method="fedprox", mu=40.0)
    assert config(method="fedprox", mu=39.0).params.mu == 39.0
    assert config(method="fedprox", mu=40.0, optimizer="adam").params.mu == 40.0


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    last = short_federation("fedprox", tmp_path)["rounds"][-1]
    assert last["bytes_up"] > 0 and not last["rejected"]
    assert np.isfinite(last["accuracy_mean"])
