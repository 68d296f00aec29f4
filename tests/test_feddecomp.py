"""FedDecomp: the sigma + low-rank tau transform, its split rule, the alternating
schedule, plain-mean aggregation, and an end-to-end run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import ndarray_to_bytes
from torch import nn

from client_app.base import PFLClient
from client_app.method_client import build_method_client
from methods import get_method, parse_run_config
from methods.feddecomp.model import LowRankTau, tau_entries
from models.backbones import build_backbone
from models.roles import Roles, get_arrays, nothing_personal
from pflower.config.schema import ConfigError, RunConfig
from pflower.data import ClientData, DataInfo, data_info
from pflower.engine.simulate import simulate
from strategies.base import PFLStrategy, Reply
from tests.helpers import MemoryStore

IMAGE = (3, 16, 16)
ORIGINAL = ".parametrizations.weight.original"


def cfg_of(**kw: object) -> RunConfig:
    raw = {"method": "feddecomp", "local-epochs": 3, "feddecomp.lora-epochs": 1, "batch-size": 16}
    raw.update(kw)
    return parse_run_config(raw)


def image_data(n: int = 48, seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *IMAGE, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return ClientData(x, y, x[:16].clone(), y[:16].clone())


def make(cfg: RunConfig, data: ClientData, store: MemoryStore | None = None) -> PFLClient:
    method = get_method(cfg.method)
    model = method.build_model(cfg, DataInfo(IMAGE, 10))
    return build_method_client(
        method, model, data, cfg, store or MemoryStore(), torch.device("cpu"), "c0"
    )


def sigma_name(name: str) -> str:
    """FedDecomp's state_dict name -> the plain backbone's name."""
    return name.replace(ORIGINAL, ".weight")


@pytest.mark.parametrize("model", ["mlp", "cnn4", "resnet8", "resnet10", "resnet18"])
def test_every_conv_and_linear_gets_a_zero_low_rank_tau_of_the_paper_rank(model: str) -> None:
    cfg = cfg_of(model=model)
    shape = (20,) if model == "mlp" else ((3, 32, 32) if model == "resnet18" else IMAGE)
    torch.manual_seed(cfg.seed)
    plain = build_backbone(model, shape, 10, hidden=cfg.hidden_dim)
    net = get_method("feddecomp").build_model(cfg, DataInfo(shape, 10))
    layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert len(layers) == sum(isinstance(m, (nn.Linear, nn.Conv2d)) for m in plain.modules())
    assert isinstance(net.head.parametrizations.weight[0], LowRankTau)  # classifier included
    for layer in layers:
        (tau,) = layer.parametrizations.weight
        sigma = layer.parametrizations.weight.original
        out_dim, in_dim = sigma.shape[:2]
        ratio = (
            cfg.params.linear_rank_ratio
            if isinstance(layer, nn.Linear)
            else cfg.params.conv_rank_ratio
        )
        assert tau.rank == max(1, round(ratio * min(in_dim, out_dim)))
        k = sigma.shape[2] if sigma.dim() == 4 else 1
        assert tau.lora_A.shape == (tau.rank * k, in_dim * k)
        assert tau.lora_B.shape == (out_dim * k, tau.rank * k)
        assert torch.count_nonzero(tau.lora_B) == 0 and torch.count_nonzero(tau.lora_A) > 0
        assert torch.equal(layer.weight, sigma)  # tau starts at exactly 0
        # a nonzero B gives a tau of rank <= r, reshaped to the weight's shape
        with torch.no_grad():
            tau.lora_B.normal_()
        t = tau.tau()
        assert t.shape == sigma.shape
        if max(tau.lora_B.shape[0], tau.lora_A.shape[1]) <= 300:  # SVDs of big ones are slow
            product = tau.lora_B.double() @ tau.lora_A.double()
            assert torch.linalg.matrix_rank(product) <= tau.rank * k
        assert torch.allclose(layer.weight, sigma + t)
        if isinstance(layer, nn.Linear) and max(sigma.shape) <= 300:
            assert torch.linalg.matrix_rank(t, rtol=1e-4) == min(tau.rank, in_dim, out_dim)
    # sigma is the backbone's original weight: same seed, same entries
    plain_state, taus = plain.state_dict(), tau_entries(net)
    for name, value in net.state_dict().items():
        if name not in taus:
            assert torch.equal(value, plain_state[sigma_name(name)]), name


def test_rank_options_reference_basis_and_absolute_linear_rank() -> None:
    cfg = cfg_of(
        model="resnet8", **{"feddecomp.rank-basis": "out", "feddecomp.conv-rank-ratio": 0.5}
    )
    net = get_method("feddecomp").build_model(cfg, DataInfo(IMAGE, 10))
    stem = net.features[0].parametrizations.weight[0]  # 3 -> 64, 7x7
    assert stem.rank == 32  # 0.5 * O, not 0.5 * min(3, 64) = 2
    assert net.head.parametrizations.weight[0].rank == 6  # linear 256 -> 10: 0.6 * O
    cfg = cfg_of(model="resnet8", **{"feddecomp.linear-rank-abs": 40})
    net = get_method("feddecomp").build_model(cfg, DataInfo(IMAGE, 10))
    assert net.head.parametrizations.weight[0].rank == 40
    assert net.features[0].parametrizations.weight[0].rank == 2  # round(0.6 * 3)


def test_split_personal_is_exactly_a_and_b_and_reverse_swaps() -> None:
    for reverse in (False, True):
        cfg = cfg_of(model="resnet8", **{"feddecomp.reverse": reverse})
        method = get_method("feddecomp")
        net = method.build_model(cfg, DataInfo(IMAGE, 10))
        roles = method.roles(net, cfg)
        lora = {n for n in net.state_dict() if ".lora_A" in n or ".lora_B" in n}
        n_layers = sum(isinstance(m, (nn.Linear, nn.Conv2d)) for m in net.modules())
        assert len(lora) == 2 * n_layers
        mine, theirs = (roles.shared, roles.personal) if reverse else (roles.personal, roles.shared)
        assert set(mine) == lora
        assert not lora & set(theirs)
        others = set(theirs)
        assert "head.bias" in others and "features.1.running_mean" in others
        assert "features.1.weight" in others and "head" + ORIGINAL in others
        assert "features.1.num_batches_tracked" in others


def test_reverse_uploads_only_a_and_b_and_keeps_sigma() -> None:
    store = MemoryStore()
    client = make(cfg_of(model="cnn4", **{"feddecomp.reverse": True}), image_data(), store)
    sent, _, _ = client.fit(get_arrays(client.model, client.roles.shared), {"server-round": 1})
    state = client.model.state_dict()
    assert [a.shape for a in sent] == [tuple(state[n].shape) for n in client.roles.shared]
    assert all(".lora_" in n for n in client.roles.shared)
    assert "head" + ORIGINAL in store.state and "head.bias" in store.state


def test_lora_epochs_above_local_epochs_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="feddecomp.lora-epochs"):
        parse_run_config({"method": "feddecomp", "local-epochs": 2, "feddecomp.lora-epochs": 3})
    with pytest.raises(ConfigError, match="feddecomp.lora-epochs"):
        parse_run_config(
            {"method": "feddecomp", "feddecomp.lora-epochs": 6}
        )  # above the auto E = 5
    cfg = parse_run_config({"method": "feddecomp"})  # the paper's E = 5, E_lora = 2 (auto)
    assert (cfg.local_epochs, cfg.params.lora_epochs) == (5, 2)
    # fine where it does not apply, and at the boundary
    parse_run_config({"method": "fedavg", "feddecomp.lora-epochs": 3})
    parse_run_config({"method": "feddecomp", "feddecomp.schedule": "simultaneous"})
    parse_run_config({"method": "feddecomp", "local-epochs": 2, "feddecomp.lora-epochs": 2})
    with pytest.raises(ConfigError, match="feddecomp.conv-rank-ratio"):
        parse_run_config(
            {"method": "feddecomp", "local-epochs": 5, "feddecomp.conv-rank-ratio": 1.5}
        )


def test_with_zero_lora_epochs_one_round_equals_fedavg() -> None:
    """The paper's degenerate case: E_lora = 0 trains sigma (+ biases, BN) for E
    epochs with tau = 0, which is FedAvg's local round on the same data."""
    data = image_data()
    kw = {"model": "resnet8", "local-epochs": 2, "lr": 0.05, "momentum": 0.9}
    dec = make(cfg_of(**kw, **{"feddecomp.lora-epochs": 0}), data)
    avg = make(parse_run_config({"method": "fedavg", "batch-size": 16, **kw}), data)
    # the same tensors under other names (parametrize puts sigma after the bias)
    names = [sigma_name(n) for n in dec.roles.shared]
    assert sorted(names) == sorted(avg.roles.shared)
    init = dict(zip(avg.roles.shared, get_arrays(avg.model, avg.roles.shared)))
    for name, b in zip(names, get_arrays(dec.model, dec.roles.shared)):
        np.testing.assert_array_equal(init[name], b)
    out_avg, n_avg, _ = avg.fit(list(init.values()), {"server-round": 1})
    out_dec, n_dec, _ = dec.fit([init[n] for n in names], {"server-round": 1})
    assert n_dec == n_avg and len(out_dec) == len(out_avg)
    after_avg = dict(zip(avg.roles.shared, out_avg))
    moved = 0
    for name, b in zip(names, out_dec):
        np.testing.assert_allclose(b, after_avg[name], rtol=1e-5, atol=1e-6, err_msg=name)
        moved += not np.array_equal(b, init[name])
    assert moved > len(names) // 2  # training changed most tensors
    # tau stayed exactly zero
    assert all(not np.any(v) for k, v in dec.store.state.items() if k.endswith("lora_B"))


def test_phases_train_what_they_should() -> None:
    data = image_data()
    # E = E_lora: only tau trains; sigma, biases and BN affine are untouched
    client = make(cfg_of(model="resnet8", **{"local-epochs": 1, "feddecomp.lora-epochs": 1}), data)
    before = {k: v.clone() for k, v in client.model.state_dict().items()}
    client.fit(get_arrays(client.model, client.roles.shared), {"server-round": 1})
    after = client.model.state_dict()
    for name in before:
        changed = not torch.equal(before[name], after[name])
        if ".lora_" in name:
            assert changed, name
        elif "running_" in name or "num_batches" in name:
            assert changed, name  # BN stats update in train mode, as the reference
        else:
            assert not changed, name
    # E_lora = 0: tau stays zero, sigma trains
    client = make(cfg_of(model="cnn4", **{"local-epochs": 1, "feddecomp.lora-epochs": 0}), data)
    before = {k: v.clone() for k, v in client.model.state_dict().items()}
    client.fit(get_arrays(client.model, client.roles.shared), {"server-round": 1})
    for name, value in client.model.state_dict().items():
        assert torch.equal(before[name], value) == (".lora_" in name), name
    # simultaneous: everything trains
    client = make(cfg_of(model="cnn4", **{"feddecomp.schedule": "simultaneous"}), data)
    before = {k: v.clone() for k, v in client.model.state_dict().items()}
    client.fit(get_arrays(client.model, client.roles.shared), {"server-round": 1})
    for name, value in client.model.state_dict().items():
        assert not torch.equal(before[name], value), name


def test_a_and_b_never_leave_and_tau_survives_between_rounds() -> None:
    cfg = cfg_of(model="cnn4")
    data = image_data()
    store = MemoryStore()
    client = make(cfg, data, store)
    shared_spec = [tuple(client.model.state_dict()[n].shape) for n in client.roles.shared]
    assert not any("lora" in n for n in client.roles.shared)
    init = get_arrays(client.model, client.roles.shared)
    sent, _, _ = client.fit(init, {"server-round": 1})
    assert [a.shape for a in sent] == shared_spec
    trained = {k: v.copy() for k, v in store.state.items()}
    assert set(trained) == set(client.roles.personal) == tau_entries(client.model)
    assert all(np.any(v) for k, v in trained.items() if k.endswith("lora_B"))
    # next round: Flower builds a fresh client (fresh model, tau = 0) on the same store
    fresh = make(cfg, data, store)
    loss, _, metrics = fresh.evaluate(sent, {"server-round": 2})
    for name in fresh.roles.personal:
        np.testing.assert_array_equal(fresh.model.state_dict()[name].numpy(), trained[name])
    # and it predicts with global sigma + its own tau: same as the trained client
    client.receive(sent, {})
    assert metrics["accuracy"] == client.score()[1]["accuracy"]
    # a client without that state would start from tau = 0
    blank = make(cfg, data)
    blank.receive(sent, {})
    assert not torch.equal(blank.model.head.weight, fresh.model.head.weight)


def test_server_takes_the_plain_mean_by_default_and_weighted_on_request() -> None:
    arrays = [[np.full((2,), 1.0, np.float32)], [np.full((2,), 4.0, np.float32)]]
    replies = [Reply("a", arrays[0], 10, {}), Reply("b", arrays[1], 30, {})]
    spec_model = nn.Linear(2, 1)
    for aggregation, expected in (("default", 2.5), ("mean", 2.5), ("weighted", 3.25)):
        cfg = cfg_of(aggregation=aggregation)
        aggregation_of_feddecomp = get_method("feddecomp").aggregation  # the method's rule
        strategy = PFLStrategy(
            cfg,
            [],
            [np.zeros(2, np.float32)],
            spec_model,
            default_aggregation=aggregation_of_feddecomp,
        )
        strategy.spec = [object()]  # non-empty: aggregate runs
        strategy.aggregate(1, replies)
        np.testing.assert_allclose(strategy.global_arrays[0], expected)


@pytest.mark.slow
def test_end_to_end_on_the_default_data(tmp_path: object) -> None:
    overrides = {
        "method": "feddecomp",
        "num-server-rounds": 3,
        "local-epochs": 2,
        "feddecomp.lora-epochs": 1,
        "output-dir": str(tmp_path),
        "run-name": "feddecomp",
    }
    results = simulate(overrides, 3)
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    accs = [r["accuracy_mean"] for r in rounds]
    assert max(accs[1:]) > accs[0]
    assert all(r["replies"] == 3 and not r["rejected"] for r in rounds)
    # the uplink carries sigma, biases and BN only: exactly FedAvg's bytes
    cfg = parse_run_config(overrides)
    method = get_method("feddecomp")
    net = method.build_model(cfg, data_info(cfg))
    roles = method.roles(net, cfg)
    plain = build_backbone("mlp", (cfg.sim_dim,), 2, hidden=cfg.hidden_dim)
    avg = Roles.of(plain, nothing_personal)
    one = sum(len(ndarray_to_bytes(a)) for a in get_arrays(net, roles.shared))
    assert one == sum(len(ndarray_to_bytes(a)) for a in get_arrays(plain, avg.shared))
    assert all(r["bytes_up"] == 3 * one for r in rounds)
