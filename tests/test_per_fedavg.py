"""Per-FedAvg (methods/per_fedavg): one meta step against the hand-computed formulas
(first-order and hessian-free) on a least-squares linear model, the client's step on
its own batches, the evaluation's one SGD step of alpha against the hand-computed
softmax-regression gradient, the plain mean, the keys' bounds and ``auto`` beta, and a
short federation with ``method='per-fedavg'`` alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays
from torch import nn
from torch.func import functional_call

from client_app.train import evaluate
from methods import ConfigError, get_method, parse_run_config
from methods.per_fedavg.client import batch_stream, meta_gradient, meta_steps
from tests.helpers import FakeProxy, config, fit_res, make_client, make_strategy, short_federation


def _half_square(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """f(w; D) = mean (x.w - y)^2 / 2: grad X^T (X w - y) / n, Hessian X^T X / n."""
    return 0.5 * ((model(x).squeeze(1) - y) ** 2).mean()


def _grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.T @ (x @ w - y) / x.shape[0]


@pytest.mark.parametrize("variant", ["first-order", "hessian-free"])
def test_one_meta_step_is_the_papers_formula(variant: str) -> None:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (5, 4, 6)]
    steps = [(x, torch.randn(x.shape[0], generator=gen, dtype=torch.float64)) for x in xs]
    model = nn.Linear(3, 1, bias=False).double()
    w = model.weight.detach().clone().view(-1)
    alpha, beta = 0.1, 0.3
    hessian_free = variant == "hessian-free"
    used = steps if hessian_free else steps[:2]
    _, g = meta_gradient(model, list(model.parameters()), _half_square, used, alpha)
    assert torch.equal(model.weight.detach().view(-1), w)  # w put back as it was
    model.weight.grad = g[0]
    torch.optim.SGD(model.parameters(), lr=beta).step()
    # by hand: w' = w - alpha grad f(w; D); g = grad f(w'; D') [- alpha H(D'') g]
    (x1, y1), (x2, y2), (x3, _) = steps
    first_order = _grad(w - alpha * _grad(w, x1, y1), x2, y2)
    outer = first_order
    if hessian_free:  # exact on a quadratic up to rounding: H = X''^T X'' / n''
        outer = first_order - alpha * (x3.T @ x3 / x3.shape[0]) @ first_order
        assert not torch.allclose(outer, first_order)  # the correction is no rounding error
    torch.testing.assert_close(model.weight.detach().view(-1), w - beta * outer, rtol=0, atol=1e-10)


def _cross_entropy_grads(
    model: nn.Module, params: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, torch.Tensor]:
    leaves = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    loss = F.cross_entropy(functional_call(model, leaves, (batch[0],)), batch[1])
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def test_the_clients_round_is_one_first_order_step_of_beta_on_its_own_batches() -> None:
    alpha = 0.2
    cfg = config(
        method="per-fedavg", variant="first-order", alpha=alpha, local_steps=1, batch_size=8
    )
    assert cfg.params.beta == cfg.lr == 0.05 and cfg.momentum == 0  # auto: the run's step
    client, _ = make_client(cfg)
    received = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.receive(received, {})
    model = copy.deepcopy(client.model)
    w = {n: p.detach().clone() for n, p in model.named_parameters()}
    # the batches the client draws: its round's stream, two for one first-order step
    stream = batch_stream(
        client.x_train, client.y_train, 8, client.round_generator({"server-round": 1})
    )
    d1, d2 = next(stream), next(stream)
    inner = _cross_entropy_grads(model, w, d1)
    w1 = {n: w[n] - alpha * inner[n] for n in w}
    outer = _cross_entropy_grads(model, w1, d2)
    upload, _, metrics = client.fit(received, {"server-round": 1})
    names = [n for n, _ in model.named_parameters()]
    assert list(client.roles.shared) == names  # nothing personal: the upload is every parameter
    for name, got in zip(names, upload):
        expected = (w[name] - cfg.params.beta * outer[name]).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert metrics["train-loss"] == pytest.approx(
        F.cross_entropy(functional_call(model, w1, (d2[0],)), d2[1]).item(), abs=1e-6
    )


def test_the_hessian_free_client_steps_along_the_corrected_direction() -> None:
    cfg = config(method="per-fedavg", local_steps=1, batch_size=8)
    assert cfg.params.variant == "hessian-free"
    client, _ = make_client(cfg)
    received = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.receive(received, {})
    model = copy.deepcopy(client.model)
    stream = batch_stream(
        client.x_train, client.y_train, 8, client.round_generator({"server-round": 1})
    )
    drawn = [next(stream) for _ in range(3)]
    params = list(model.parameters())
    w = [p.detach().clone() for p in params]
    _, g = meta_gradient(model, params, client.loss, drawn, cfg.params.alpha, cfg.params.delta)
    _, first_order = meta_gradient(model, params, client.loss, drawn[:2], cfg.params.alpha)
    assert any(not torch.allclose(a, b) for a, b in zip(g, first_order))
    upload, _, _ = client.fit(received, {"server-round": 1})
    for got, start, direction in zip(upload, w, g):
        np.testing.assert_allclose(got, (start - cfg.params.beta * direction).numpy(), atol=1e-6)


def test_evaluation_scores_the_model_after_one_sgd_step_of_alpha() -> None:
    alpha = 0.5
    cfg = config(method="per-fedavg", model="logreg", alpha=alpha, batch_size=16)
    client, _ = make_client(cfg)
    received = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.receive(received, {})
    x, y = client.adaptation_batch()
    assert x.shape[0] == 16 and all(
        torch.equal(a, b) for a, b in zip((x, y), client.adaptation_batch())
    )
    weight, bias = (
        client.model.head.weight.detach().clone(),
        client.model.head.bias.detach().clone(),
    )
    # softmax regression by hand: dL/dz = (softmax(z) - onehot(y)) / n
    dz = (torch.softmax(x @ weight.T + bias, dim=1) - F.one_hot(y, weight.shape[0])) / x.shape[0]
    tuned = client.personalised()
    torch.testing.assert_close(tuned.head.weight.detach(), weight - alpha * dz.T @ x)
    torch.testing.assert_close(tuned.head.bias.detach(), bias - alpha * dz.sum(0))
    loss, metrics = client.score()
    assert (loss, metrics["accuracy"]) == evaluate(tuned, client.x_test, client.y_test)
    assert metrics["accuracy-global"] == evaluate(client.model, client.x_test, client.y_test)[1]
    # the adapted copy is not what goes back: the upload is the received model
    assert all(np.array_equal(u, r) for u, r in zip(client.upload({}), received))


def test_a_round_takes_a_pass_over_the_data_in_meta_steps() -> None:
    first = config(method="per-fedavg", variant="first-order", batch_size=10, local_epochs=2)
    free = config(method="per-fedavg", batch_size=10, local_epochs=2)
    assert meta_steps(100, first, 2) == 2 * 5  # two batches a step
    assert meta_steps(100, free, 3) == 2 * 4  # three, the last step's past the data
    assert meta_steps(3, first, 2) == 2  # a tiny client still steps once an epoch
    assert meta_steps(100, config(method="per-fedavg", local_steps=3), 2) == 3


def test_aggregation_is_the_plain_mean() -> None:
    assert get_method("per-fedavg").aggregation == "mean"
    cfg = config(method="per-fedavg", **{"weight-cap": 0.0, "update-norm-bound": 0.0})
    strategy = make_strategy(cfg)
    a = [np.full(s.shape, 1.0, dtype=s.dtype) for s in strategy.spec]
    b = [np.full(s.shape, 4.0, dtype=s.dtype) for s in strategy.spec]
    strategy.aggregate_fit(
        1,
        [(FakeProxy(1), fit_res(a, "client-0", 10)), (FakeProxy(2), fit_res(b, "client-1", 30))],
        [],
    )
    for g in strategy.global_arrays:
        np.testing.assert_allclose(g, 2.5)  # the paper's 1/n sum; weighted would be 3.25


def test_bad_keys_are_config_errors_naming_them_and_beta_follows_lr() -> None:
    for key, value in [("alpha", -1), ("beta", 0), ("delta", 1.0), ("variant", "second-order")]:
        with pytest.raises(ConfigError, match=f"'per-fedavg.{key}'"):
            parse_run_config({"method": "per-fedavg", f"per-fedavg.{key}": value})
    cfg = parse_run_config({"method": "per-fedavg", "lr": 0.2})
    assert cfg.params.beta == 0.2 and "per-fedavg.beta" in cfg.auto_resolved
    cfg = parse_run_config({"method": "per-fedavg", "per-fedavg.beta": 0.001})
    assert cfg.params.beta == 0.001 and "per-fedavg.beta" not in cfg.auto_resolved
    assert cfg.params.alpha == 0.01 and cfg.params.delta == 0.001


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("per-fedavg", tmp_path)
    assert np.isfinite(res["final_accuracy_mean"])
