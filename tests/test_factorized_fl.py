"""Factorized-FL: factorization, L1 / pruning, wire, similarity-matched per-client
aggregation, upload size against FedAvg, and end-to-end runs of both variants."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import Context, RecordDict, ndarrays_to_parameters, parameters_to_ndarrays

from client_app.base import PFLClient
from client_app.method_client import build_method_client
from client_app.state import ContextStore
from methods import get_method, parse_run_config
from methods.factorized_fl.model import (
    DENSE,
    INDEX,
    MASK,
    MU,
    U,
    V,
    decode_sparse,
    encode_sparse,
    factorized_layers,
    matching_layer,
    mu_l1,
)
from methods.factorized_fl.strategy import FactorizedFLStrategy, cosine_matrix, matching_weights
from models.roles import get_arrays
from pflower.config.schema import RunConfig
from pflower.data import ClientData, DataInfo, data_info, load_client_data
from pflower.engine.simulate import simulate
from server_app.method_strategy import build_method_strategy
from strategies.base import Reply, payload_bytes
from tests.helpers import raw_config

CIFAR = DataInfo((3, 32, 32), 10)
SMALL = {"sim-samples": 120, "hidden-dim": 32, "sim-dim": 20}


def cfg_of(**kw: object) -> RunConfig:
    return parse_run_config({**SMALL, **raw_config(**kw)})


def client_of(
    cfg: RunConfig, info: DataInfo, key: str = "client-0", context: Context | None = None
) -> PFLClient:
    """A method's real client on a few random samples of ``info``'s shape."""
    method = get_method(cfg.method)
    model = method.build_model(cfg, info)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, *info.input_shape, generator=gen)
    y = torch.randint(0, info.num_classes, (8,), generator=gen)
    store = ContextStore(context or Context(0, 0, {}, RecordDict(), {}))
    return build_method_client(
        method, model, ClientData(x, y, x, y), cfg, store, torch.device("cpu"), key
    )


def strategy_of(cfg: RunConfig, info: DataInfo) -> FactorizedFLStrategy:
    method = get_method(cfg.method)
    return build_method_strategy(method, cfg, method.build_model(cfg, info))  # type: ignore[return-value]


# ---- the factorization ----------------------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 2])
def test_factorized_weights_keep_shapes_and_reconstruct(rank: int) -> None:
    plain = get_method("fedavg").build_model(cfg_of(model="cnn4"), CIFAR)
    model = get_method("factorized-fl-alpha").build_model(
        cfg_of(method="factorized-fl-alpha", model="cnn4", rank=rank, init="scaled"), CIFAR
    )
    layers = factorized_layers(model)
    assert len(layers) == 4  # 2 conv + fc + head
    plain_modules = dict(plain.named_modules())
    torch.manual_seed(3)
    with torch.no_grad():
        for name, layer in layers.items():
            p = layer.parametrizations.weight
            assert layer.weight.shape == plain_modules[name].weight.shape
            assert p.original0.shape[1] == rank and p.original1.shape[0] == rank
            assert torch.count_nonzero(p.original2) == 0  # mu starts at zero
            p.original2.normal_()
    model.train()
    conv = layers["features.0"]  # Conv2d(3, 32, 5)
    u, v, mu = (getattr(conv.parametrizations.weight, f"original{i}") for i in range(3))
    assert u.shape == (25, rank) and v.shape == (rank, 32 * 3) and mu.shape == (25, 96)
    w = conv.weight
    for o, i in [(0, 0), (5, 2), (31, 1)]:
        want = (u @ v[:, o * 3 + i] + mu[:, o * 3 + i]).reshape(5, 5)
        torch.testing.assert_close(w[o, i], want)  # u spans the kernel positions
    fc = layers["features.7"]  # Linear(1600, 512)
    u, v, mu = (getattr(fc.parametrizations.weight, f"original{i}") for i in range(3))
    assert u.shape == (1600, rank) and v.shape == (rank, 512)
    torch.testing.assert_close(fc.weight, (u @ v + mu).t())


def test_l1_penalty_has_the_sign_gradient_on_mu() -> None:
    grads = {}
    for l1 in (0.0, 0.01):
        client = client_of(cfg_of(method="factorized-fl-beta", l1=l1), data_info(cfg_of()))
        mu = factorized_layers(client.model)["features.1"].parametrizations.weight.original2
        with torch.no_grad():
            mu.copy_(torch.randn(mu.shape, generator=torch.Generator().manual_seed(0)))
        client.model.train()
        client.loss(client.model, client.x_train, client.y_train).backward()
        grads[l1] = (mu.grad.clone(), torch.sign(mu.detach()))
    diff = grads[0.01][0] - grads[0.0][0]
    torch.testing.assert_close(diff, 0.01 * grads[0.01][1])
    assert mu_l1(client.model).requires_grad


def test_pruning_drops_small_mu_at_eval_and_on_the_wire() -> None:
    cfg = cfg_of(method="factorized-fl-beta", mu_threshold=0.1)
    client = client_of(cfg, data_info(cfg))
    layer = factorized_layers(client.model)["features.1"]
    p = layer.parametrizations.weight
    mu = torch.zeros_like(p.original2)
    mu.view(-1)[:4] = torch.tensor([0.05, -0.09, 0.2, -0.5])
    with torch.no_grad():
        p.original2.copy_(mu)
    kept = mu.masked_fill(mu.abs() < 0.1, 0.0)
    client.model.eval()
    torch.testing.assert_close(layer.weight, (p.original0 @ p.original1 + kept).t())
    client.model.train()
    torch.testing.assert_close(layer.weight, (p.original0 @ p.original1 + mu).t())
    layout, val = encode_sparse(mu.numpy(), 0.1)
    assert layout[0] == INDEX and layout[1:].view("<i4").tolist() == [2, 3]  # 2 of many
    assert val.tolist() == pytest.approx([0.2, -0.5])
    np.testing.assert_array_equal(decode_sparse(layout, val, tuple(mu.shape)), kept.numpy())
    # beta's upload carries exactly the kept entries of every mu
    wire = client.wire
    sent = dict(zip([s.name for s in wire.up_spec()], client.upload({}), strict=True))
    name = "features.1" + MU
    assert sent[name + "#layout"].dtype == np.uint8 and sent[name + "#val"].size == 2
    assert name not in sent


# ---- the wire -------------------------------------------------------------------------------


def test_split_rules_alpha_and_beta() -> None:
    for method, personal_factors in (
        ("factorized-fl-alpha", {V, MU}),
        ("factorized-fl-beta", set()),
    ):
        cfg = cfg_of(method=method, model="resnet8")
        m = get_method(method)
        model = m.build_model(cfg, CIFAR)
        roles = m.roles(model, cfg)
        assert all(
            n.startswith("head.")
            or "running" in n
            or "num_batches" in n
            or any(n.endswith(s) for s in personal_factors)
            for n in roles.personal
        )
        assert not any(n.startswith("head.") for n in roles.shared)
        assert not any("running" in n for n in roles.shared)
        assert all(
            n + U in roles.shared for n in factorized_layers(model) if n.startswith("features.")
        )
        assert "features.1.weight" in roles.shared  # BN affine is shared
        assert matching_layer(model) == "features.6.conv2"
        assert (matching_layer(model) + V in roles.shared) == (method == "factorized-fl-beta")


def test_alpha_upload_is_a_small_fraction_of_fedavg_bytes() -> None:
    """Bytes from the real serialized uploads of each method's client, same backbone."""
    ratios = {}
    for backbone in ("cnn4", "resnet8"):
        sizes = {}
        for method in ("fedavg", "factorized-fl-alpha"):
            client = client_of(cfg_of(method=method, model=backbone), CIFAR)
            sizes[method] = payload_bytes(ndarrays_to_parameters(client.upload({})))
        ratios[backbone] = sizes["factorized-fl-alpha"] / sizes["fedavg"]
    # cnn4: u (25 + 25 + 1600) + biases + the 512-dim matching v ~ 0.3% of 878k floats;
    # resnet8: the matching v of the last 3x3 conv (256*256) dominates, ~5.6%
    assert ratios["cnn4"] < 0.005
    assert ratios["resnet8"] < 0.06
    # alpha's download has no matching vector: smaller still
    strat = strategy_of(cfg_of(method="factorized-fl-alpha", model="cnn4"), CIFAR)
    fedavg = client_of(cfg_of(model="cnn4"), CIFAR)
    down = payload_bytes(strat.payload_for(None, 1))
    assert down / payload_bytes(ndarrays_to_parameters(fedavg.upload({}))) < 0.003


def test_alpha_personal_v_and_mu_survive_and_only_the_matching_v_travels() -> None:
    cfg = cfg_of(method="factorized-fl-alpha")
    info = data_info(cfg)
    context = Context(0, 0, {}, RecordDict(), {})
    client = client_of(cfg, info, context=context)
    strat = strategy_of(cfg, info)
    start = parameters_to_ndarrays(strat.payload_for(None, 1))
    sent, _, _ = client.fit(start, {"server-round": 1})
    personal = dict(zip(client.roles.personal, get_arrays(client.model, client.roles.personal)))
    assert len(sent) == len(client.roles.shared) + 1  # shared tensors + the matching v
    np.testing.assert_array_equal(sent[-1], personal[strat.wire.match].reshape(-1))
    factors = [n for n in personal if n.endswith((V, MU))]
    assert factors and not set(factors) & set(client.roles.shared)
    again = client_of(cfg, info, context=context)  # a fresh client on the same store
    again.evaluate(start, {})
    for name in factors:
        np.testing.assert_array_equal(get_arrays(again.model, [name])[0], personal[name])


def test_beta_reply_roundtrip_and_bad_sparse_rejected() -> None:
    cfg = cfg_of(method="factorized-fl-beta")
    client = client_of(cfg, data_info(cfg))
    strat = strategy_of(cfg, data_info(cfg))
    params, n, _ = client.fit(parameters_to_ndarrays(strat.payload_for(None, 1)), {})
    assert strat.check_reply("client-0", params, n) is None
    dense, match = strat.wire.decode(params)
    for name, arr in zip(strat.wire.shared, dense):
        if name.endswith(MU):
            assert 0 < np.count_nonzero(arr) < arr.size  # trained, and sparse
    np.testing.assert_array_equal(
        match, dict(zip(strat.wire.shared, dense))[strat.wire.match].reshape(-1)
    )
    names = [s.name for s in strat.wire.up_spec()]
    j = names.index("features.1" + MU + "#layout")
    size = int(np.prod(strat.wire.shapes["features.1" + MU]))
    broken = {
        "outside": (np.array([INDEX, *np.array([size], "<i4").view(np.uint8)], np.uint8), [1.0]),
        "repeated": (np.concatenate([[INDEX], np.array([3, 3], "<i4").view(np.uint8)]), [1, 2]),
        "bitmask": (np.array([MASK, 255], np.uint8), [1.0] * 8),  # too short for the tensor
        "unknown layout": (np.array([7], np.uint8), []),
        "dense layout": (np.array([DENSE], np.uint8), [1.0]),
    }
    for problem, (layout, values) in broken.items():
        bad = list(params)
        bad[j], bad[j + 1] = layout.astype(np.uint8), np.asarray(values, np.float32)
        assert problem in strat.check_reply("client-0", bad, n), problem


@pytest.mark.parametrize("density", [0.0, 0.01, 0.2, 0.6, 1.0])
def test_sparse_mu_takes_the_cheapest_layout_and_roundtrips(density: float) -> None:
    rng = np.random.default_rng(0)
    mu = rng.standard_normal((9, 4096)).astype(np.float32)
    mu[rng.random(mu.shape) >= density] = 0.0
    layout, values = encode_sparse(mu, 1e-12)
    np.testing.assert_array_equal(decode_sparse(layout, values, mu.shape), mu)
    n, k = mu.size, int(np.count_nonzero(mu))
    costs = {DENSE: 4 * n, INDEX: 8 * k, MASK: -(-n // 8) + 4 * k}
    assert layout[0] == min(costs, key=costs.get)
    sent = layout.nbytes + values.nbytes
    assert sent <= min(costs.values()) + 1  # + the layout byte
    if density >= 0.6:  # indices alone would cost more than the dense tensor here
        assert sent <= 4 * n + 1 < 8 * k


# ---- similarity matching and per-client aggregation ------------------------------------------


def test_matching_weights_rules() -> None:
    sim = np.array([1.0, 0.9, 0.2, -0.5, 0.95])
    keep, w = matching_weights(sim, 0, tau=0.5, min_aggr=1, epsilon=2.0)
    assert keep.tolist() == [0, 4, 1]  # the threshold: self first, then by similarity
    assert w.sum() == pytest.approx(1.0)
    e = np.exp(2.0 * sim[[0, 4, 1]])
    np.testing.assert_allclose(w, e / e.sum())
    keep, w = matching_weights(sim, 0, tau=0.99, min_aggr=4, epsilon=1.0)
    assert keep.tolist() == [0, 4, 1, 2]  # at least min_aggr of the most similar
    assert w.sum() == pytest.approx(1.0)
    tie = np.array([1.0, 1.0, 1.0])
    keep, _ = matching_weights(tie, 2, tau=1.1, min_aggr=1, epsilon=1.0)
    assert keep.tolist() == [2]  # self is always kept, even on ties and tau > 1
    m = cosine_matrix(np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]))
    np.testing.assert_allclose(np.diag(m), 1.0)
    assert m[0, 1] == pytest.approx(0.0) and m[0, 2] == pytest.approx(2**-0.5)


def _reply(strat: FactorizedFLStrategy, key: str, value: float, match: np.ndarray) -> Reply:
    dense = [np.full(s.shape, value, dtype=np.float32) for s in strat.spec]
    return Reply(key, [*dense, match.astype(np.float32)], 10, {})


def test_each_client_gets_its_own_aggregate_from_the_round_inputs() -> None:
    cfg = cfg_of(method="factorized-fl-alpha", sim_threshold=0.5, min_aggr=1)
    strat = strategy_of(cfg, data_info(cfg))
    dim = strat.wire.up_spec()[-1].shape[0]
    a, b = np.zeros(dim), np.zeros(dim)
    a[0], b[1] = 1.0, 1.0
    initial = parameters_to_ndarrays(strat.payload_for(None, 1))
    replies = [
        _reply(strat, "c0", 0.0, a),
        _reply(strat, "c1", 2.0, a + 0.1 * b),
        _reply(strat, "c2", 10.0, b),
    ]
    strat.aggregate(1, replies)
    s01 = cosine_matrix(np.stack([a, a + 0.1 * b]))[0, 1]
    w = np.exp([1.0, s01]) / np.exp([1.0, s01]).sum()  # softmax(epsilon * s), self first
    # c2 (s = 0.1 with c1, 0 with c0) keeps only itself; c0 and c1 keep each other.
    # Every aggregate comes from the round's inputs: the reference's in-place
    # overwrite would give c1 a mix of c0's *new* aggregate instead of its 0.0.
    expected = {"c0": w[1] * 2.0, "c1": w[0] * 2.0, "c2": 10.0}
    for key, value in expected.items():
        for arr in parameters_to_ndarrays(strat.payload_for(key, 2)):
            np.testing.assert_allclose(arr, value, rtol=1e-5, err_msg=key)
    extra = strat.rounds[1].extra
    assert np.allclose(np.diag(extra["ffl_similarity"]["matrix"]), 1.0)
    # whom each client learns from: row k holds k's mixture weights (results.json)
    mixture = np.array(extra["ffl_mixture"]["matrix"])
    np.testing.assert_allclose(mixture, [[w[0], w[1], 0], [w[1], w[0], 0], [0, 0, 1]], atol=1e-4)
    # round 2: only c0 reports; c1 and c2 keep their aggregates, a new client gets the global
    c1_before = parameters_to_ndarrays(strat.payload_for("c1", 3))[0].copy()
    strat.aggregate(2, [_reply(strat, "c0", 5.0, a)])
    assert parameters_to_ndarrays(strat.payload_for("c0", 3))[0].flat[0] == pytest.approx(5.0)
    np.testing.assert_array_equal(parameters_to_ndarrays(strat.payload_for("c1", 3))[0], c1_before)
    new = parameters_to_ndarrays(strat.payload_for("never-seen", 3))[0]
    assert new.flat[0] == pytest.approx(5.0) and new.shape == initial[0].shape


def test_v_change_matching_compares_moves_away_from_the_shared_initial_v() -> None:
    """factorized-fl.match=v-change: two clients whose v moved in orthogonal directions from the
    initial v (which every client starts from) are dissimilar; compared as v (the
    paper) they look alike, since the common start dominates."""
    for match, expect_similar in (("v", True), ("v-change", False)):
        cfg = cfg_of(method="factorized-fl-alpha", match=match)
        strat = strategy_of(cfg, data_info(cfg))
        client = client_of(cfg, data_info(cfg))
        v0 = client.model.state_dict()[strat.wire.match].numpy().reshape(-1)
        if match == "v-change":  # the origin the server measures moves from: every start
            np.testing.assert_array_equal(v0, strat.match_origin)
        a, b = np.zeros_like(v0), np.zeros_like(v0)
        a[0], b[1] = 0.01, 0.01
        strat.aggregate(1, [_reply(strat, "c0", 0.0, v0 + a), _reply(strat, "c1", 1.0, v0 + b)])
        s01 = strat.rounds[1].extra["ffl_similarity"]["matrix"][0][1]
        assert (s01 > 0.99) if expect_similar else (abs(s01) < 1e-3), (match, s01)


def test_two_clients_with_different_v_get_different_payloads_from_training() -> None:
    """Real clients: after one fit each, their v differ and so do their payloads."""
    cfg = cfg_of(method="factorized-fl-alpha", epsilon=20.0)
    strat = strategy_of(cfg, data_info(cfg))
    start = parameters_to_ndarrays(strat.payload_for(None, 1))
    replies = []
    for pid in range(3):
        client = client_of(cfg, data_info(cfg), key=f"client-{pid}")
        d = load_client_data(cfg, pid, 3)
        client.x_train, client.y_train = d.x_train, d.y_train
        params, n, _ = client.fit(start, {"server-round": 1})
        assert strat.check_reply(client.client_key, params, n) is None
        replies.append(Reply(client.client_key, params, n, {}))
    strat.aggregate(1, replies)
    p0 = parameters_to_ndarrays(strat.payload_for("client-0", 2))
    p1 = parameters_to_ndarrays(strat.payload_for("client-1", 2))
    assert any(not np.array_equal(x, y) for x, y in zip(p0, p1))


# ---- end to end ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["factorized-fl-alpha", "factorized-fl-beta"])
def test_end_to_end(method: str, tmp_path) -> None:
    res = simulate(
        {
            **SMALL,
            "method": method,
            "num-server-rounds": 2,
            "output-dir": str(tmp_path),
            "run-name": "r",
        },
        3,
    )
    assert len(res["rounds"]) == 2
    last = res["rounds"][-1]
    assert last["rejected"] == [] and last["replies"] == 3
    assert 0.0 <= last["accuracy_mean"] <= 1.0 and len(last["per_client_accuracy"]) == 3
    assert last["bytes_up"] > 0 and last["bytes_down"] > 0
    sim = np.array(last["ffl_similarity"]["matrix"])
    assert sim.shape == (3, 3) and np.allclose(np.diag(sim), 1.0)
    if method == "factorized-fl-beta":
        assert 0.0 < last["ffl_mu_density"] <= 1.0


def test_mixing_in_torch_matches_each_clients_weighted_mean() -> None:
    """The server's GPU path (torch, float64 matmul; run here on the CPU) against each
    client's double-double weighted mean. Measured (docs/factorized_fl.md): bit-identical
    float32 on ResNet-9-sized tensors of 10 clients (no entry differs: both sums are
    float64 before the cast); asserted here within 1e-6 relative."""
    from methods.factorized_fl.strategy import mix_all
    from strategies.base import weighted_mean

    rng = np.random.default_rng(0)
    shapes = [(25, 1), (1, 96), (25, 96), (512,)]
    dense = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(6)]
    mixture = rng.random((6, 6)) * (rng.random((6, 6)) < 0.7)
    np.fill_diagonal(mixture, 1.0)
    mixture /= mixture.sum(axis=1, keepdims=True)
    mixed = mix_all(dense, mixture, "cpu")
    worst = 0.0
    for k in range(6):
        keep = np.flatnonzero(mixture[k])
        want = weighted_mean([dense[i] for i in keep], list(mixture[k, keep]))
        for a, b in zip(mixed[k], want, strict=True):
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
            worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))))
    assert worst < 1e-6


def test_the_strategy_mixes_on_the_servers_device() -> None:
    cfg = cfg_of(method="factorized-fl-beta", mu_threshold=0.0)
    info = data_info(cfg)
    payloads = {}
    for device in (None, "cpu"):
        strat = strategy_of(cfg, info)
        strat.mix_device = device
        replies = []
        for k in range(3):
            client = client_of(cfg, info, key=f"client-{k}")
            start = parameters_to_ndarrays(strat.payload_for(None, 1))
            replies.append(Reply(f"client-{k}", client.fit(start, {"server-round": 1})[0], 8, {}))
        strat.rounds[1] = __import__("strategies.base", fromlist=["RoundLog"]).RoundLog()
        strat.aggregate(1, replies)
        payloads[device] = [
            parameters_to_ndarrays(strat.payload_for(f"client-{k}", 2)) for k in range(3)
        ]
    for a, b in zip(payloads[None], payloads["cpu"], strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
