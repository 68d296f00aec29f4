"""GPFL (methods/gpfl/): the CoV's gating, the angle- and magnitude-level losses, mu
as weight decay on the CoV and the GCE, and the conditional inputs against hand-computed values; the split (the
extractor, CoV and GCE travel, the head and the conditional inputs stay); C^ the
received GCE; the personal state across a restart; both variants; the keys; the
sample-weighted mean; a short federation with ``method='gpfl'`` alone."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays

from methods import get_method, parse_run_config
from methods.gpfl import GpflParams
from methods.gpfl.client import (
    angle_loss,
    class_proportions,
    gpfl_optimizer,
    magnitude_loss,
)
from methods.gpfl.model import ConditionalValve, GPFLModel
from models.backbones import MLP
from pflower.config.schema import ConfigError
from tests.helpers import FakeProxy, config, fit_res, make_client, make_strategy, short_federation

ROOT = Path(__file__).resolve().parents[1]
LN = 1 / math.sqrt(1 + 1e-5)  # LayerNorm's (x - mean) / sqrt(var + eps) on var 1


def test_the_valve_gates_by_gamma_plus_one_and_shifts_by_beta() -> None:
    cov = ConditionalValve(2)
    with torch.no_grad():
        # gamma's pre-activation W c + b = [[0, 0], [2, 0]] (1, 0) + (1, 1) = (1, 3):
        # ReLU keeps it, LayerNorm (mean 2, var 1) gives (-1, 1)
        cov.gamma[0].weight.copy_(torch.tensor([[0.0, 0.0], [2.0, 0.0]]))
        cov.gamma[0].bias.copy_(torch.tensor([1.0, 1.0]))
        # beta's: W = 0, b = (2, 0) -> LayerNorm (1, -1), then x (0.5, 0.5) + (-1.25, 0)
        cov.beta[0].weight.zero_()
        cov.beta[0].bias.copy_(torch.tensor([2.0, 0.0]))
        cov.beta[2].weight.fill_(0.5)
        cov.beta[2].bias.copy_(torch.tensor([-1.25, 0.0]))
    c = torch.tensor([1.0, 0.0])
    gamma, beta = cov.gamma(c), cov.beta(c)
    torch.testing.assert_close(gamma, torch.tensor([-LN, LN]))
    torch.testing.assert_close(beta, torch.tensor([0.5 * LN - 1.25, -0.5 * LN]))
    # gamma + 1 ~ (0, 2): f's first feature is shut, its second doubled; beta shifts,
    # and the ReLU clips the first to 0: (2, 3) -> (0, 6 - 0.5), (-1, 4) -> (0, 8 - 0.5)
    f = torch.tensor([[2.0, 3.0], [-1.0, 4.0]])
    out = cov(f, c)
    want = F.relu(f * (gamma + 1) + beta)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out, torch.tensor([[0.0, 5.5], [0.0, 7.5]]), atol=1e-4, rtol=0)
    # another conditional input, another gate: W c = 0 for c = (0, 1), gamma = LN(1, 1) = 0
    torch.testing.assert_close(cov(f, torch.tensor([0.0, 1.0]))[:, 1], F.relu(f[:, 1] - 0.5 * LN))


def test_the_angle_level_loss_is_a_softmax_over_cosines() -> None:
    # f_G = (3, 4) has direction (0.6, 0.8); the embeddings (1, 0) and (0, 2) the axes:
    # cosines (0.6, 0.8). Label 0: -log(e^0.6 / (e^0.6 + e^0.8)) = log(1 + e^0.2);
    # label 1: log(1 + e^-0.2); the batch's mean of the two
    f_g = torch.tensor([[3.0, 4.0], [3.0, 4.0]])
    emb = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert angle_loss(f_g[:1], torch.tensor([0]), emb).item() == pytest.approx(
        math.log(1 + math.exp(0.2)), rel=1e-6
    )
    both = angle_loss(f_g, torch.tensor([0, 1]), emb).item()
    assert both == pytest.approx((math.log(1 + math.exp(0.2)) + math.log(1 + math.exp(-0.2))) / 2)
    # scale-free: a longer f_G or embedding leaves the cosines as they are
    assert angle_loss(7 * f_g, torch.tensor([0, 1]), 3 * emb).item() == pytest.approx(both)


def test_the_magnitude_level_loss_per_sample_and_over_the_batch() -> None:
    # differences (3, 4) and (-1, 0): norms 5 and 1
    f_g = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    targets = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    assert magnitude_loss(f_g, targets, per_sample=True).item() == pytest.approx(3.0)  # (5 + 1) / 2
    assert magnitude_loss(f_g, targets, per_sample=False).item() == pytest.approx(math.sqrt(26))


def test_mu_is_weight_decay_on_the_cov_and_the_gce_only() -> None:
    cfg = config(method="gpfl", mu=0.3, lr=0.1, weight_decay=0.01)
    model = GPFLModel(MLP(4, 3, hidden=2))
    opt = gpfl_optimizer(model, cfg, 0.3)
    rest, decayed = opt.param_groups
    assert rest["weight_decay"] == 0.01 and decayed["weight_decay"] == pytest.approx(0.31)
    assert {id(p) for p in decayed["params"]} == {
        id(p) for p in [*model.cov.parameters(), model.gce.weight]
    }
    assert len(rest["params"]) + len(decayed["params"]) == len(list(model.parameters()))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # a zero loss gradient: the step is the decay alone
    opt.step()
    # theta (1 - lr wd): x (1 - 0.1 x 0.31) = 0.969 on the CoV and the GCE, 0.999 elsewhere
    for name, p in model.named_parameters():
        factor = 0.969 if name.split(".")[0] in ("cov", "gce") else 0.999
        torch.testing.assert_close(p.detach(), before[name] * factor)


def test_the_conditional_inputs_are_the_plain_and_the_client_weighted_mean() -> None:
    model = GPFLModel(MLP(4, 3, hidden=2))
    emb = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    shares = class_proportions(torch.tensor([0, 0, 2, 2, 2, 1]), 3)
    torch.testing.assert_close(shares, torch.tensor([2 / 6, 1 / 6, 3 / 6]))
    model.set_conditional_inputs(emb, shares)
    torch.testing.assert_close(model.global_input, torch.tensor([3.0, 4.0]))
    # (1, 2)/3 + (3, 4)/6 + (5, 6)/2 = (1/3 + 1/2 + 5/2, 2/3 + 2/3 + 3)
    torch.testing.assert_close(model.personal_input, torch.tensor([10 / 3, 13 / 3]))
    assert not model.personal_input.requires_grad


def test_the_objective_is_ce_plus_angle_plus_lambda_magnitude() -> None:
    cfg = config(method="gpfl", lam=0.5, mu=0.2)
    client, _ = make_client(cfg)
    m, x, y = client.model, client.x_train[:10], client.y_train[:10]
    with torch.no_grad():
        m.gce.weight.mul_(2.0)  # C differs from C^, the received copy
        f = m.features(x)
        f_p, f_g = m.cov(f, m.personal_input), m.cov(f, m.global_input)
        ce = F.cross_entropy(m.head(f_p), y)
        alg = angle_loss(f_g, y, m.gce.weight)
        mlg = (f_g - client.frozen[y]).norm(dim=1).mean()
        total = client.objective(x, y)
    assert total.item() == pytest.approx((ce + alg + 0.5 * mlg).item(), rel=1e-5)
    torch.testing.assert_close(client.frozen * 2.0, m.gce.weight)


def test_the_extractor_cov_and_gce_travel_and_the_head_and_inputs_stay() -> None:
    cfg = config(method="gpfl")
    client, _ = make_client(cfg)
    strategy = make_strategy(cfg)
    shared = {s.name for s in strategy.spec}
    assert {n.split(".")[0] for n in shared} == {"features", "cov", "gce"}
    assert "gce.weight" in shared and "cov.gamma.0.weight" in shared
    personal = set(client.roles.personal)
    assert personal == {"head.weight", "head.bias", "global_input", "personal_input"}
    payload = parameters_to_ndarrays(strategy.global_payload())
    upload, n, _ = client.fit(payload, {"server-round": 1})
    state = client.model.state_dict()
    assert len(upload) == len(client.roles.shared)
    for name, sent in zip(client.roles.shared, upload):
        np.testing.assert_array_equal(sent, state[name].numpy())
    assert strategy.check_reply(client.client_key, upload, n) is None


def test_paper_inputs_come_from_the_received_gce_and_c_hat_is_it() -> None:
    cfg = config(method="gpfl", local_epochs=2, lr=0.1)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    received = torch.from_numpy(payload[client.roles.shared.index("gce.weight")].copy())
    client.fit(payload, {"server-round": 1})
    m = client.model
    torch.testing.assert_close(client.frozen, received)  # C^: the received GCE, frozen
    assert not torch.allclose(m.gce.weight, received)  # while C trained
    torch.testing.assert_close(m.global_input, received.mean(dim=0))
    torch.testing.assert_close(m.personal_input, client.proportions @ received)


def test_pfllibs_inputs_come_from_the_trained_gce_and_start_at_zero() -> None:
    cfg = config(method="gpfl", variant="pfllib", local_epochs=2, lr=0.1)
    client, context = make_client(cfg)
    assert not client.model.personal_input.any() and not client.model.global_input.any()
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.receive(payload, {"server-round": 1})
    assert not client.model.personal_input.any()  # not from the received GCE
    upload, _, _ = client.fit(payload, {"server-round": 1})
    trained = torch.from_numpy(upload[client.roles.shared.index("gce.weight")].copy())
    torch.testing.assert_close(client.model.global_input, trained.mean(dim=0))
    torch.testing.assert_close(client.model.personal_input, client.proportions @ trained)
    # kept across a restart, and not recomputed from the next received GCE
    again, _ = make_client(cfg, context=context)
    again.restore_personal()
    again.receive(payload, {"server-round": 2})
    torch.testing.assert_close(again.model.personal_input, client.proportions @ trained)


def test_the_head_survives_a_restart() -> None:
    cfg = config(method="gpfl", local_epochs=2, lr=0.1)
    client, context = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    trained = client.personal_state()
    again, _ = make_client(cfg, context=context)
    assert not np.array_equal(again.personal_state()["head.weight"], trained["head.weight"])
    again.restore_personal()
    for name, value in trained.items():
        np.testing.assert_array_equal(again.personal_state()[name], value)
    _, _, scores = again.evaluate(payload, {"server-round": 1})
    with torch.no_grad():
        hits = (again.model(again.x_test).argmax(1) == again.y_test).float().mean()
    assert scores["accuracy"] == pytest.approx(float(hits))  # head(f_P) is what is scored


def test_the_shared_parts_take_the_sample_weighted_mean() -> None:
    assert get_method("gpfl").aggregation == "weighted"
    cfg = config(method="gpfl", **{"weight-cap": 0.0, "update-norm-bound": 0.0})
    strategy = make_strategy(cfg)
    a = [np.full(s.shape, 1.0, dtype=s.dtype) for s in strategy.spec]
    b = [np.full(s.shape, 4.0, dtype=s.dtype) for s in strategy.spec]
    replies = [
        (FakeProxy(1), fit_res(a, "client-0", 10)),
        (FakeProxy(2), fit_res(b, "client-1", 30)),
    ]
    strategy.aggregate_fit(1, replies, [])
    for g in strategy.global_arrays:
        np.testing.assert_allclose(g, 3.25)  # (10 x 1 + 30 x 4) / 40


def test_its_keys_defaults_profile_and_refusals() -> None:
    cfg = parse_run_config({"method": "gpfl"})
    params = GpflParams.of(cfg)
    assert (params.lam, params.mu, params.variant) == (0.01, 0.1, "paper")
    assert (cfg.batch_size, cfg.local_epochs, cfg.lr, cfg.momentum) == (10, 1, 0.005, 0.0)
    assert cfg.as_dict()["gpfl.lambda"] == 0.01
    resnet = parse_run_config({"method": "gpfl", "model": "resnet18", "dataset": "x.parquet"})
    assert (GpflParams.of(resnet).lam, GpflParams.of(resnet).mu, resnet.lr) == (1e-4, 0.0, 0.1)
    small = parse_run_config({"method": "gpfl", "model": "resnet8", "dataset": "x.parquet"})
    assert (GpflParams.of(small).lam, GpflParams.of(small).mu, small.lr) == (0.01, 0.1, 0.005)
    images = {"model": "cnn4", "dataset": "x.parquet"}  # the profile runs PFLlib's CNN
    pfllib = GpflParams.of(parse_run_config({"method": "gpfl", "profile": "pfllib", **images}))
    assert (pfllib.lam, pfllib.mu, pfllib.variant) == (1.0, 0.0, "pfllib")
    given = parse_run_config({"method": "gpfl", "gpfl.lambda": 0.5})
    assert GpflParams.of(given).lam == 0.5 and "gpfl.lambda" not in given.auto_resolved
    for bad in ({"gpfl.lambda": -1}, {"gpfl.mu": -0.1}, {"gpfl.variant": "fedavg"}):
        key = next(iter(bad))
        with pytest.raises(ConfigError, match=f"'{key}'"):
            parse_run_config({"method": "gpfl", **bad})
    # mu/2 ||theta||^2 at lr 0.5: SGD diverges on it from mu = 4
    with pytest.raises(ConfigError, match="'gpfl.mu'"):
        parse_run_config({"method": "gpfl", "gpfl.mu": 5.0, "lr": 0.5})


@pytest.mark.parametrize("variant", ["paper", "pfllib"])
def test_a_short_federation_runs_with_the_method_name_alone(tmp_path, variant) -> None:
    if variant == "paper":
        res = short_federation("gpfl", tmp_path)
    else:  # PFLlib's reading, through the same in-process engine
        from pflower.engine.inprocess import run_inprocess

        raw = {
            "method": "gpfl",
            "gpfl.variant": "pfllib",
            "num-server-rounds": 2,
            "sim-samples": 60,
        }
        res = run_inprocess({**raw, "run-name": "gpfl-pfllib", "output-dir": str(tmp_path)}, 3)
    last = res["rounds"][-1]
    assert np.isfinite(res["final_accuracy_mean"]) and not last["rejected"]
