"""FedFac: factor analysis, the element-level split on the wire, new clients, e2e."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays

from client_app.method_client import build_method_client
from methods import get_method, parse_run_config
from methods.fedfac.client import FedFacClient
from methods.fedfac.factor_analysis import (
    correlation,
    layer_matrix,
    num_factors,
    principal_factors,
    shared_elements,
)
from methods.fedfac.imposed_split import imposed_split
from methods.fedfac.model import HELD_OUT, element_entries
from methods.fedfac.strategy import FedFacStrategy
from pflower.data import data_info, load_client_data
from server_app.method_strategy import build_method_strategy
from strategies.base import Reply
from tests.helpers import PAPER_STUDY, MemoryStore, raw_config

# ---- factor analysis -----------------------------------------------------------------------


def planted(n: int = 2000, shared: int = 12, noise_cols: int = 12, seed: int = 0) -> np.ndarray:
    """Columns 0..shared-1 load on two common factors; the rest are pure noise."""
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((n, 2))
    loadings = rng.uniform(0.7, 1.0, (2, shared)) * rng.choice([-1, 1], (2, shared))
    common = f @ loadings + 0.3 * rng.standard_normal((n, shared))
    return np.concatenate([common, rng.standard_normal((n, noise_cols))], axis=1) * rng.uniform(
        0.1, 10, shared + noise_cols
    )


def test_fa_recovers_a_planted_shared_block():
    z = planted()
    fit = principal_factors(z, kappa=0.5)
    shared = shared_elements(fit.communalities, 0.5)
    assert shared[:12].all() and not shared[12:].any()
    assert fit.communalities[:12].min() > 0.7 and fit.communalities[12:].mean() < 0.1


def test_communalities_in_unit_interval_and_scale_free():
    z = planted(seed=3)
    for kappa in (0.3, 0.6, 0.9, 0.99):
        nu = principal_factors(z, kappa).communalities
        assert ((nu >= 0) & (nu <= 1)).all()
    # standardisation: rescaling a column changes nothing
    scaled = z * np.arange(1, z.shape[1] + 1)
    a = principal_factors(z, 0.6).communalities
    b = principal_factors(scaled, 0.6).communalities
    np.testing.assert_allclose(a, b, atol=1e-8)


def test_num_factors_follows_kappa_without_off_by_one():
    gamma = np.array([5.0, 3.0, 1.0, 1.0])  # cumulative shares 0.5, 0.8, 0.9, 1.0
    assert num_factors(gamma, 0.5) == 1
    assert num_factors(gamma, 0.51) == 2
    assert num_factors(gamma, 0.8) == 2
    assert num_factors(gamma, 0.85) == 3
    assert num_factors(gamma, 1.0) == 4
    z = planted(seed=1)
    gs = [principal_factors(z, k).num_factors for k in (0.2, 0.5, 0.8, 0.95)]
    assert gs == sorted(gs) and gs[0] < gs[-1]
    assert gs[-1] == num_factors(np.linalg.eigvalsh(correlation(z)), 0.95)


def test_layer_matrix_stacks_clients_per_element():
    w = [np.arange(6.0).reshape(3, 2), 10 + np.arange(6.0).reshape(3, 2)]  # 3 elements, d_in 2
    z = layer_matrix(w)
    assert z.shape == (4, 3)
    np.testing.assert_array_equal(z[:, 1], [2, 3, 12, 13])


# ---- the split on the wire ------------------------------------------------------------------


def make(method: str = "fedfac-dynamic", num: int = 4, **over):
    cfg = parse_run_config(
        {"train-per-client": 50, **PAPER_STUDY, **raw_config(method=method, **over)}
    )
    m = get_method(method)
    info = data_info(cfg)
    model = m.build_model(cfg, info)
    roles = m.roles(model, cfg)
    strategy = build_method_strategy(m, cfg, model)
    assert isinstance(strategy, FedFacStrategy)
    strategy.bystanders.num_clients = num
    return cfg, m, model, roles, strategy


def _imposed(strategy: FedFacStrategy) -> dict[str, np.ndarray]:
    new = strategy.bystanders
    return imposed_split(strategy, new.num_clients, new.held_out)


def client(cfg, m, key: int, num: int = 4) -> FedFacClient:
    model = m.build_model(cfg, data_info(cfg))
    data = load_client_data(cfg, key, num)
    built = build_method_client(
        m, model, data, cfg, MemoryStore(), torch.device("cpu"), f"client-{key}"
    )
    assert isinstance(built, FedFacClient)
    return built


def test_element_entries_cover_weight_bias_and_bn():
    cfg, m, model, *_ = make()
    assert element_entries(model, ["features.1"]) == {
        "features.1": ["features.1.weight", "features.1.bias"]
    }
    from models.backbones import build_backbone

    net = build_backbone("resnet8", (3, 32, 32), 10)
    e = element_entries(net, ["features.0"])["features.0"]
    assert (
        e[0] == "features.0.weight" and "features.1.weight" in e and "features.1.running_var" in e
    )
    with pytest.raises(ValueError, match="fedfac.fa-layers"):
        element_entries(model, ["features.2"])


def noisy_replies(initial: list[np.ndarray], rng: np.random.Generator, sizes: list[int]) -> list:
    """One reply a size: the initial arrays plus standard normal noise."""
    return [
        Reply(
            f"client-{k}",
            [a + rng.standard_normal(a.shape).astype(a.dtype) for a in initial],
            n,
            {},
        )
        for k, n in enumerate(sizes)
    ]


def test_personal_elements_never_aggregated_and_mask_matches_split():
    cfg, m, model, roles, strategy = make()
    rng = np.random.default_rng(0)
    initial = [a.copy() for a in strategy.global_arrays]
    replies = noisy_replies(initial, rng, sizes=[10 * (k + 1) for k in range(4)])
    strategy.rounds[1] = __import__("strategies.base", fromlist=["RoundLog"]).RoundLog()
    strategy.aggregate(1, replies)
    shared = strategy.shared["features.1"]
    assert shared.sum() == 100  # quantile 0.5 of 200 neurons
    i = strategy.wire.position["features.1.weight"]
    g = strategy.global_arrays[i]
    np.testing.assert_array_equal(g[~shared], initial[i][~shared])  # untouched
    w = np.array([10, 20, 30, 40]) / 100
    expect = sum(wk * r.arrays[i][shared].astype(np.float64) for wk, r in zip(w, replies))
    np.testing.assert_allclose(g[shared], expect, rtol=1e-5)
    # the head (outside Lambda) is fully averaged
    h = strategy.wire.position["head.weight"]
    np.testing.assert_allclose(
        g_h := strategy.global_arrays[h],
        sum(wk * r.arrays[h] for wk, r in zip(w, replies)),
        rtol=1e-5,
    )
    assert not np.allclose(g_h, initial[h])
    # the split at the head of every payload is exactly the server's (bits: personal)
    head = parameters_to_ndarrays(strategy.payload_for("client-0", 2))[0]
    np.testing.assert_array_equal(np.unpackbits(head, count=200).astype(bool), ~shared)
    assert "fa-personal:features.1" not in strategy.client_config("client-0", 2)


def test_static_uploads_only_shared_elements_after_fa():
    cfg, m, model, roles, strategy = make("fedfac-static")
    strategy.set_split({"features.1": np.arange(200) % 4 == 0})  # 50 shared
    c = client(cfg, m, 0)
    config = {**strategy.client_config("client-0", 2), "server-round": 2}
    arrays, n, _ = c.fit(parameters_to_ndarrays(strategy.global_payload()), config)
    assert strategy.check_reply("client-0", arrays, n) is None
    i = strategy.wire.position["features.1.weight"]
    assert arrays[i].shape == (50, 100)
    # the personal rows never left: they are exactly the client's kept values
    kept = c.store.state["fedfac.local.features.1.weight"]
    np.testing.assert_array_equal(arrays[i], kept[np.arange(200) % 4 == 0])


def test_personal_values_survive_a_change_of_split():
    cfg, m, model, roles, strategy = make()
    c = client(cfg, m, 1)
    i = roles.shared.index("features.1.weight")
    glob = parameters_to_ndarrays(strategy.global_payload())
    own, _, _ = c.fit(glob, {"server-round": 1})  # trains, keeps its own values
    a = np.zeros(200, dtype=bool)
    a[:100] = True  # split A: first half personal
    b = np.zeros(200, dtype=bool)
    b[50:150] = True  # split B: overlaps A on 50..99
    fresh = [x + 1.0 for x in strategy.global_arrays]  # a new global, unlike anything local
    for personal in (a, b):  # the split changes: newly personal rows are the client's own too
        strategy.set_split({"features.1": ~personal})
        c.restore_personal()
        c.receive(strategy.wire.encode_down(fresh), {})
        w = c.model.state_dict()["features.1.weight"].numpy()
        np.testing.assert_array_equal(w[personal], own[i][personal])
        np.testing.assert_array_equal(w[~personal], fresh[i][~personal])
        assert c.wire.personal("features.1").tolist() == personal.tolist()


def test_new_client_localtrain_keeps_its_personal_rows_between_rounds():
    cfg, m, model, roles, strategy = make(new_clients=1, local_epochs=2, optimizer="adam", lr=0.01)
    strategy.set_split({"features.1": np.arange(200) < 100})
    config = {**strategy.client_config(None, 2), HELD_OUT: "client-3", "server-round": 2}
    glob = parameters_to_ndarrays(strategy.payload_for(None, 2))
    full = strategy.global_arrays
    new = client(cfg, m, 3)
    # a new client never trains with the federation
    arrays, _, metrics = new.fit(glob, config)
    assert arrays == [] and metrics[HELD_OUT] == 1
    # LocalTrain: shared rows as received, personal rows trained, a real accuracy
    loss, n, metrics = new.evaluate(glob, config)
    assert metrics[HELD_OUT] == 1 and 0.0 <= metrics["accuracy"] <= 1.0 and n == new.y_test.shape[0]
    w = new.model.state_dict()["features.1.weight"].numpy().copy()
    i = roles.shared.index("features.1.weight")
    np.testing.assert_array_equal(w[:100], full[i][:100])  # shared: as received
    assert not np.allclose(w[100:], full[i][100:])  # personal: trained
    # kept like any client's personal state: the next round starts from these rows
    np.testing.assert_array_equal(new.store.state["fedfac.local.features.1.weight"], w)
    again = client(cfg, m, 3)
    again.store = new.store
    again.restore_personal()
    again.receive(glob, {**config, "server-round": 3})
    w2 = again.model.state_dict()["features.1.weight"].numpy()
    np.testing.assert_array_equal(w2[100:], w[100:])


def test_ensemble_needs_consent_and_sends_models_not_data():
    from pflower.config.schema import ConfigError

    with pytest.raises(ConfigError, match="'fedfac.ensemble-share-models'"):
        parse_run_config({"method": "fedfac-static", "fedfac.new-client-mode": "ensemble"})
    cfg, m, model, roles, strategy = make(
        new_clients=1, new_client_mode="ensemble", ensemble_share_models=True
    )
    strategy.set_split({"features.1": np.arange(200) < 100})
    config = {**strategy.client_config(None, 2), HELD_OUT: "client-3", "server-round": 2}
    glob = parameters_to_ndarrays(strategy.payload_for(None, 2))
    names = list(model.state_dict())
    models, probs = [], []
    new = client(cfg, m, 3)
    for k in range(3):
        c = client(cfg, m, k)
        c.fit(glob, config)
        shared, _, metrics = c.fit(glob, {**config, "fa-phase": "share-model"})
        assert set(metrics) == {"client-key"}  # the personalised model, nothing else
        assert [a.shape for a in shared] == [tuple(v.shape) for v in c.model.state_dict().values()]
        models += shared
        with torch.no_grad():
            c.model.eval()
            probs.append(torch.softmax(c.model(new.x_test), 1))
    _, n, metrics = new.evaluate(models, {**config, "fa-phase": "ensemble"})
    mean = torch.stack(probs).mean(0)
    assert metrics["accuracy"] == pytest.approx(
        float((mean.argmax(1) == new.y_test).float().mean())
    )
    assert set(metrics) == {"client-key", HELD_OUT, "accuracy"}
    with pytest.raises(ValueError, match="whole models"):
        new.evaluate(models[: len(names) + 1], {**config, "fa-phase": "ensemble"})


def test_downloads_after_the_split_carry_only_shared_rows():
    cfg, m, model, roles, strategy = make("fedfac-dynamic")
    a = client(cfg, m, 0)
    a.fit(parameters_to_ndarrays(strategy.global_payload()), {"server-round": 1})
    own = a.store.state["fedfac.local.features.1.weight"]
    shared = np.arange(200) % 4 == 0
    strategy.set_split({"features.1": shared})
    compact = parameters_to_ndarrays(strategy.payload_for("client-0", 2))
    i = strategy.wire.position["features.1.weight"]
    assert compact[1 + i].shape == (50, 100)  # after the split's one tensor
    np.testing.assert_array_equal(compact[1 + i], strategy.global_arrays[i][shared])
    # the client ends up with the global shared rows beside its own personal rows
    b = client(cfg, m, 0)
    b.store = a.store
    b.restore_personal()
    b.receive(compact, {"server-round": 2})
    w = b.model.state_dict()["features.1.weight"].numpy()
    np.testing.assert_array_equal(w[shared], strategy.global_arrays[i][shared])
    np.testing.assert_array_equal(w[~shared], own[~shared])
    h = strategy.wire.position["head.weight"]
    np.testing.assert_array_equal(b.model.state_dict()["head.weight"].numpy(), compact[1 + h])
    assert strategy.payload_for("client-0", 2) is strategy.payload_for("client-1", 2)  # once


def test_update_based_fa_uses_each_clients_own_start():
    """Round 2 of dynamic FedFac: personal rows started from each client's own
    values, not the global ones; FA must see the change from that start."""
    cfg, m, model, roles, strategy = make("fedfac-dynamic", fa_input="updates", num=3)
    i = strategy.wire.position["features.1.weight"]
    seen = []
    fa = strategy.factor_analysis
    strategy.factor_analysis = lambda per_client: seen.append(per_client) or fa(per_client)
    clients = [client(cfg, m, k, num=3) for k in range(3)]
    for rnd in (1, 2):
        strategy.rounds[rnd] = __import__("strategies.base", fromlist=["RoundLog"]).RoundLog()
        config = {**strategy.client_config(None, rnd), "server-round": rnd}
        glob = parameters_to_ndarrays(strategy.payload_for(None, rnd))
        replies, starts, ends = [], [], []
        for c in clients:
            c.restore_personal()
            c.receive(glob, config)
            starts.append(c.model.state_dict()["features.1.weight"].numpy().copy())
            arrays, n, metrics = c.fit(glob, config)
            ends.append(c.model.state_dict()["features.1.weight"].numpy().copy())
            replies.append(Reply(c.client_key, arrays, n, metrics))
        before = strategy.global_arrays[i].copy()
        strategy.aggregate(rnd, replies)
        for got, start, end in zip(seen[-1], starts, ends):
            np.testing.assert_allclose(got, end - start, atol=1e-6)
        if rnd == 2:  # personal rows really started away from the global values
            personal = ~strategy.shared["features.1"]
            assert not np.allclose(starts[0][personal], before[personal])
    shared = strategy.shared["features.1"]
    w = np.array([r.num_examples for r in replies], dtype=float)
    expect = sum(wk * e[shared] for wk, e in zip(w / w.sum(), ends))
    np.testing.assert_allclose(strategy.global_arrays[i][shared], expect, rtol=1e-4, atol=1e-6)


def test_fixed_splits_true_oracle_random():
    cfg, m, model, roles, strategy = make(fa_split="true", num=10)
    from pflower.data import simulation_study

    truth = simulation_study(cfg, 10).shared_neurons
    np.testing.assert_array_equal(_imposed(strategy)["features.1"], truth)
    cfg, m, model, roles, strategy = make(fa_split="oracle", num=10)
    assert (_imposed(strategy)["features.1"] == truth).mean() > 0.95
    cfg, m, model, roles, strategy = make(fa_split="random", num=10)
    r = _imposed(strategy)["features.1"]
    assert r.sum() == 100 and 0.3 < (r == truth).mean() < 0.7


# ---- end to end --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedfac-static", "fedfac-dynamic"])
def test_end_to_end(tmp_path, method):
    from pflower.engine.simulate import simulate

    mode = "ensemble" if method == "fedfac-static" else "localtrain"
    r = simulate(
        {
            "method": method,
            "num-server-rounds": 3,
            "optimizer": "adam",
            "lr": 0.001,
            "fedfac.new-clients": 1,
            "fedfac.new-client-mode": mode,
            "fedfac.ensemble-share-models": mode == "ensemble",
            "output-dir": str(tmp_path),
            "run-name": method,
        },
        4,
    )
    rounds = r["rounds"]
    assert len(rounds) == 3 and all(not x["rejected"] for x in rounds)
    assert set(rounds[-1]["per_client_accuracy"]) == {"client-0", "client-1", "client-2"}
    assert rounds[-1]["accuracy_mean"] > 0.6
    assert all(x["fa_shared_fraction"] == 0.5 for x in rounds)
    assert 0.0 <= rounds[-1]["accuracy_new_clients"] <= 1.0
    assert rounds[-1]["new_client_mode"] == mode
    if method == "fedfac-static":
        masks = [x["fa_shared_mask"]["features.1"] for x in rounds]
        assert masks[0] == masks[1] == masks[2]
        assert rounds[1]["bytes_up"] < rounds[0]["bytes_up"]  # personal rows stay home
    else:
        assert "fa_changed_fraction" in rounds[1]


def test_fixed_split_is_never_reestimated_and_updates_input_runs(monkeypatch):
    cfg, m, model, roles, strategy = make("fedfac-dynamic", fa_split="random", num=4)
    strategy.set_split(_imposed(strategy))
    assert not strategy.wire.full_upload()  # personal rows never leave under a fixed split
    split = {k: v.copy() for k, v in strategy.shared.items()}

    def no_fa(*args, **kwargs):
        raise AssertionError("factor analysis ran under a fixed split")

    monkeypatch.setattr(strategy, "run_fa", no_fa)
    monkeypatch.setattr(strategy, "factor_analysis", no_fa)
    from strategies.base import RoundLog

    noise = np.random.default_rng(0)
    for rnd in (1, 2):  # two rounds of uploads: the shared rows of the Lambda layer only
        before = [a.copy() for a in strategy.global_arrays]
        compact = strategy.wire.encode_down(strategy.global_arrays)[len(strategy.sizes) :]
        uploads = [
            [a + noise.standard_normal(a.shape).astype(a.dtype) for a in compact] for _ in range(3)
        ]
        assert all(strategy.check_reply("c", u, 5) is None for u in uploads)
        strategy.rounds[rnd] = RoundLog()
        strategy.aggregate(rnd, [Reply(f"client-{k}", u, 5, {}) for k, u in enumerate(uploads)])
        assert all(np.array_equal(split[k], strategy.shared[k]) for k in split)
        i = strategy.wire.position["features.1.weight"]
        personal = ~split["features.1"]
        assert personal.any() and split["features.1"].any()
        assert np.array_equal(strategy.global_arrays[i][personal], before[i][personal])
        assert not np.allclose(
            strategy.global_arrays[i][split["features.1"]], before[i][split["features.1"]]
        )
    monkeypatch.undo()
    cfg, m, model, roles, strategy = make("fedfac-dynamic", fa_input="updates")
    assert strategy.wire.full_upload()
    rng = np.random.default_rng(1)
    replies = [
        Reply(
            f"client-{k}",
            [a + rng.standard_normal(a.shape).astype(a.dtype) for a in strategy.global_arrays],
            5,
            {},
        )
        for k in range(3)
    ]
    from strategies.base import RoundLog

    strategy.rounds[1] = RoundLog()
    strategy.aggregate(1, replies)
    assert strategy.shared["features.1"].sum() == 100
    assert strategy.rounds[1].extra["fa_num_factors"]["features.1"] >= 1


def test_new_client_sites_hold_out_named_deployment_sites():
    from flwr.server.client_manager import SimpleClientManager

    from pflower.config.schema import ConfigError
    from tests.helpers import FakeProxy

    manager = SimpleClientManager()
    for node in (1, 2, 3):
        manager.register(FakeProxy(node))
    *_, strategy = make(new_client_sites="site-b, site-c")
    strategy.bystanders.num_clients = 0  # not started: prepare counts the federation
    strategy.bystanders.prepare(manager)
    assert strategy.bystanders.num_clients == 3
    assert strategy.bystanders.held_out == {"site-b", "site-c"}
    assert strategy.client_config("site-a", 1)[HELD_OUT] == "site-b,site-c"
    # a held-out site is not sent fit instructions once its key is known
    strategy.clients.node_keys = {1: "site-a", 2: "site-b", 3: "site-c"}
    sampled = strategy.configure_fit(1, strategy.global_payload(), manager)
    assert [p.node_id for p, _ in sampled] == [1]
    *_, everyone = make(new_client_sites="site-a,site-b,site-c")
    everyone.bystanders.num_clients = 0
    with pytest.raises(ValueError, match="config key 'fedfac.new-client-sites'"):
        everyone.bystanders.prepare(manager)
    with pytest.raises(ConfigError, match="'fedfac.new-clients' and 'fedfac.new-client-sites'"):
        make(new_clients=1, new_client_sites="site-b")


def test_fa_smoothing_averages_communalities_over_rounds():
    *_, strategy = make("fedfac-dynamic", fa_smoothing=0.75)
    first = strategy.smoothed("features.1", np.ones(200))
    second = strategy.smoothed("features.1", np.zeros(200))
    np.testing.assert_allclose(first, 1.0)
    np.testing.assert_allclose(second, 0.75)  # 0.75 * 1 + 0.25 * 0
    *_, plain = make("fedfac-dynamic")
    plain.smoothed("features.1", np.ones(200))
    np.testing.assert_allclose(plain.smoothed("features.1", np.zeros(200)), 0.0)


def test_fa_in_torch_matches_numpy_to_float64_rounding():
    """The server's GPU path (torch, float64; run here on the CPU): the same
    communalities, G, iterations and split as numpy's. Measured (docs/fedfac.md): on a
    256-channel conv of 5 clients, communalities within 2e-14 of numpy's, G, the 100
    iterations and the split identical; asserted here within 1e-10."""
    from methods.fedfac.factor_analysis import principal_factors_torch

    rng = np.random.default_rng(0)
    layers = [
        planted(),
        layer_matrix([rng.standard_normal((64, 27)) for _ in range(5)]),  # 5 clients' conv rows
    ]
    for z in layers:
        a = principal_factors(z, 0.85, tol=1e-4, max_iter=100)
        b = principal_factors_torch(z, 0.85, tol=1e-4, max_iter=100, device="cpu")
        assert (a.num_factors, a.iterations) == (b.num_factors, b.iterations)
        assert np.max(np.abs(a.communalities - b.communalities)) < 1e-10
        np.testing.assert_array_equal(
            shared_elements(a.communalities, 0.5), shared_elements(b.communalities, 0.5)
        )


def test_the_strategy_runs_fa_on_the_servers_device(monkeypatch):
    cfg, m, model, roles, strategy = make()
    rng = np.random.default_rng(0)
    initial = [a.copy() for a in strategy.global_arrays]
    replies = [
        Reply(
            f"client-{k}",
            [a + rng.standard_normal(a.shape).astype(a.dtype) for a in initial],
            10,
            {},
        )
        for k in range(4)
    ]
    splits = {}
    for device in (None, "cpu"):
        strategy.fa_device = device
        strategy.set_split(None)
        strategy.rounds[1] = __import__("strategies.base", fromlist=["RoundLog"]).RoundLog()
        strategy.aggregate(1, replies)
        splits[device] = strategy.shared["features.1"].copy()
    np.testing.assert_array_equal(splits[None], splits["cpu"])
