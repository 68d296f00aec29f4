"""FedProto (methods/fedproto): its split, the local prototypes, the server's
count-weighted mean per class, the loss and the nearest-prototype prediction against
hand-computed cases, the keys, the site policy's refusal, two backbones of one
feature width exchanging prototypes, and a short federation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays

from methods import ConfigError, parse_run_config
from methods.fedproto import FedProtoParams
from methods.fedproto.client import local_statistics, prototype_penalty
from methods.fedproto.model import global_prototypes, nearest_prototype
from pflower.engine.inprocess import build_inprocess
from pflower.privacy.policy import REFUSED
from strategies.base import RunRefused
from strategies.replies import Reply
from tests.helpers import (
    config,
    image_folder,
    make_client,
    make_strategy,
    raw_config,
    short_federation,
)

f32 = np.float32


def test_only_the_two_prototype_buffers_travel() -> None:
    client, _ = make_client(config(method="fedproto"))
    assert client.roles.shared == ("proto_sums", "proto_counts")
    state = client.model.state_dict()
    assert set(client.roles.personal) == set(state) - {"proto_sums", "proto_counts"}
    assert any(n.startswith("features.") for n in client.roles.personal)
    assert any(n.startswith("head.") for n in client.roles.personal)
    assert [a.shape for a in client.upload({})] == [(2, 32), (2,)]  # classes x hidden-dim


def test_local_statistics_of_a_toy_batch() -> None:
    # embeddings seen: class 0: (1, 2), (3, 4) -> mean (2, 3); class 1: none;
    # class 2: (5, 6); the split holds 2, 0 and 1 samples of them
    z = torch.tensor([[1.0, 2.0], [5.0, 6.0], [3.0, 4.0]])
    y = torch.tensor([0, 2, 0])
    sums = torch.zeros(3, 2).index_add_(0, y, z)
    seen = torch.zeros(3).index_add_(0, y, torch.ones(3))
    counts = torch.tensor([2, 0, 1])
    s, c = local_statistics(sums, seen, counts, "samples")
    assert torch.equal(s, torch.tensor([[4.0, 6.0], [0.0, 0.0], [5.0, 6.0]]))  # 2 x (2, 3)
    assert torch.equal(c, torch.tensor([2.0, 0.0, 1.0]))
    s, c = local_statistics(sums, seen, counts, "clients")
    assert torch.equal(s, torch.tensor([[2.0, 3.0], [0.0, 0.0], [5.0, 6.0]]))
    assert torch.equal(c, torch.tensor([1.0, 0.0, 1.0]))


def _one_batch_client(**keys):
    # one batch holds the whole split: one step, every embedding from the model before it
    cfg = config(method="fedproto", **{"batch-size": 10_000, "local-epochs": 1, **keys})
    client, _ = make_client(cfg)
    return cfg, client


def test_the_upload_is_the_class_sums_of_the_embeddings_and_the_class_counts() -> None:
    _, client = _one_batch_client()
    m, x, y = client.model, client.x_train, client.y_train
    with torch.no_grad():
        z = m.features(x)  # mlp: no BatchNorm or dropout, train mode embeds the same
    client.local_train({}, torch.Generator().manual_seed(0))
    sums, counts = client.upload({})
    for k in range(2):
        assert counts[k] == int((y == k).sum())
        assert np.allclose(sums[k], z[y == k].sum(0).numpy(), atol=1e-4)
    # the audit's truth: exactly what was sent
    truth = client.personal_tensors()
    assert np.array_equal(truth["proto_sums"], sums)
    assert np.array_equal(truth["proto_counts"], counts)


def _three_class_strategy(tmp_path, **keys):
    # three classes (image folder), mlp with a 2-wide embedding: (3, 2) and (3,) buffers
    folder = image_folder(tmp_path / "images", classes=("a", "b", "c"), per_class=4, side=8)
    cfg = config(method="fedproto", model="mlp", dataset=str(folder), **{"hidden-dim": 2, **keys})
    return cfg, make_strategy(cfg)


def test_the_server_averages_each_class_by_its_counts(tmp_path) -> None:
    _, strategy = _three_class_strategy(tmp_path)
    # client A: class 0 prototype (1, 1) from 2 samples; no class 1
    # client B: class 0 prototype (4, 7) from 1 sample, class 1 prototype (2, -2) from 3
    # class 2: at no client
    a = [np.array([[2, 2], [0, 0], [0, 0]], f32), np.array([2, 0, 0], f32)]
    b = [np.array([[4, 7], [6, -6], [0, 0]], f32), np.array([1, 3, 0], f32)]
    replies = [Reply("client-0", a, 50, {}), Reply("client-1", b, 10, {})]
    strategy.aggregate_held(1, replies, {})
    sums, counts = strategy.global_arrays
    # equal weights (the sample counts 50 and 10 play no part): the means of the buffers
    assert np.allclose(sums, [[3, 4.5], [3, -3], [0, 0]])
    assert np.allclose(counts, [1.5, 1.5, 0])
    protos, present = global_prototypes(torch.tensor(sums), torch.tensor(counts))
    # class 0: (2 (1, 1) + 1 (4, 7)) / 3 = (2, 3); class 1: B's alone; class 2: none
    assert torch.allclose(protos, torch.tensor([[2.0, 3.0], [2.0, -2.0], [0.0, 0.0]]))
    assert present.tolist() == [True, True, False]


def test_a_client_receives_the_count_weighted_prototypes(tmp_path) -> None:
    cfg, strategy = _three_class_strategy(tmp_path)
    payload = parameters_to_ndarrays(strategy.global_payload())
    assert [p.shape for p in payload] == [(3, 2), (3,)]
    client, _ = make_client(cfg)
    client.receive([np.array([[3, 4.5], [3, -3], [0, 0]], f32), np.array([1.5, 1.5, 0], f32)], {})
    protos, present = client.model.prototypes()
    assert torch.allclose(protos[:2], torch.tensor([[2.0, 3.0], [2.0, -2.0]]))
    assert present.tolist() == [True, True, False]


def test_pfllib_weighting_averages_the_clients_prototypes_equally(tmp_path) -> None:
    _, strategy = _three_class_strategy(tmp_path, weighting="clients")
    # the same two clients as above, each prototype sent with a count of 1
    a = [np.array([[1, 1], [0, 0], [0, 0]], f32), np.array([1, 0, 0], f32)]
    b = [np.array([[4, 7], [2, -2], [0, 0]], f32), np.array([1, 1, 0], f32)]
    strategy.aggregate_held(1, [Reply("client-0", a, 2, {}), Reply("client-1", b, 4, {})], {})
    protos, present = global_prototypes(*(torch.tensor(t) for t in strategy.global_arrays))
    # class 0: ((1, 1) + (4, 7)) / 2 = (2.5, 4); class 1: (2, -2); class 2: none
    assert torch.allclose(protos, torch.tensor([[2.5, 4.0], [2.0, -2.0], [0.0, 0.0]]))
    assert present.tolist() == [True, True, False]


def test_the_prototype_penalty_by_hand() -> None:
    z = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.5, 0.5]])
    y = torch.tensor([0, 1, 2])
    protos = torch.tensor([[0.0, 0.0], [3.0, 2.0], [9.0, 9.0]])
    present = torch.tensor([True, True, False])  # class 2's row is no prototype
    # squared errors: (1 + 4) + (0 + 4) + 0 (its own target) = 9, over 3 x 2 values
    assert torch.isclose(prototype_penalty(z, y, protos, present), torch.tensor(1.5))


def test_the_local_objective_is_cross_entropy_plus_lambda_times_the_penalty() -> None:
    _, client = _one_batch_client(**{"fedproto.lambda": 2.0})
    m, x, y = client.model, client.x_train, client.y_train
    with torch.no_grad():  # a global prototype for class 0 only
        m.proto_sums.copy_(torch.zeros_like(m.proto_sums))
        m.proto_sums[0] = torch.linspace(-1, 1, m.feature_dim) * 3
        m.proto_counts.copy_(torch.tensor([3.0, 0.0]))
        z = m.features(x)
        ce = F.cross_entropy(m.head(z), y)
        proto0 = torch.linspace(-1, 1, m.feature_dim)  # (3 x ...) / 3
        sq = ((z[y == 0] - proto0) ** 2).sum()  # class-1 samples add nothing
        want = ce + 2.0 * sq / z.numel()
    metrics = client.local_train({}, torch.Generator().manual_seed(0))
    assert metrics["train-loss"] == pytest.approx(float(want), rel=1e-5)
    assert metrics["proto-loss"] == pytest.approx(float(sq / z.numel()), rel=1e-5)


def test_nearest_prototype_prediction_by_hand() -> None:
    z = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    protos = torch.tensor([[0.0, 1.0], [9.0, 9.0], [2.0, 2.0]])
    present = torch.tensor([True, True, False])
    scores = nearest_prototype(z, protos, present)
    # z0: 0.5 to class 0, 81 to class 1; z1: 2.5 to class 0, 49 to class 1 (class 2,
    # at distance 0, has no prototype)
    assert torch.allclose(scores[:, :2], torch.tensor([[-0.5, -81.0], [-2.5, -49.0]]))
    assert scores[:, 2].tolist() == [float("-inf")] * 2
    assert scores.argmax(1).tolist() == [0, 0]


def test_the_score_is_the_nearest_prototypes_accuracy() -> None:
    cfg, client = _one_batch_client()
    m = client.model
    with torch.no_grad():
        z = m.features(client.x_test)
        m.proto_sums.copy_(torch.stack([z[0] * 2, z[1] * 5]))  # prototypes z[0] and z[1]
        m.proto_counts.copy_(torch.tensor([2.0, 5.0]))
        d0, d1 = ((z - z[0]) ** 2).sum(1), ((z - z[1]) ** 2).sum(1)
        want = float(((d1 < d0).long() == client.y_test).float().mean())
        head = float((m(client.x_test).argmax(1) == client.y_test).float().mean())
    _, scores = client.score()
    assert scores["accuracy"] == pytest.approx(want)
    assert scores["accuracy-head"] == pytest.approx(head)
    head_cfg = config(method="fedproto", predict="head")
    head_client, _ = make_client(head_cfg)
    head_client.model.load_state_dict(m.state_dict())
    assert head_client.score()[1]["accuracy"] == pytest.approx(head)


def test_without_global_prototypes_the_head_predicts() -> None:
    _, client = _one_batch_client()
    with torch.no_grad():
        head = float((client.model(client.x_test).argmax(1) == client.y_test).float().mean())
    _, scores = client.score()  # zero counts: no class has a prototype
    assert scores["accuracy"] == pytest.approx(head) and "accuracy-head" not in scores


def test_the_model_stays_home_across_a_fit() -> None:
    cfg = config(method="fedproto", **{"batch-size": 10_000})
    client, context = make_client(cfg)
    before = {k: v.clone() for k, v in client.model.state_dict().items()}
    ups, _, _ = client.fit([np.zeros((2, 32), f32), np.zeros(2, f32)], {"server-round": 1})
    assert [u.shape for u in ups] == [(2, 32), (2,)]
    stored = client.store.load()
    assert set(stored) == set(client.roles.personal)
    assert not np.allclose(stored["head.weight"], before["head.weight"].numpy())
    # a fresh client on the same context restores the trained model, not the initial one
    again, _ = make_client(cfg, context=context)
    again.restore_personal()
    assert np.array_equal(again.model.state_dict()["head.weight"].numpy(), stored["head.weight"])


def test_bad_keys_are_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match="fedproto.lambda"):
        parse_run_config(raw_config(method="fedproto", **{"fedproto.lambda": -1}))
    with pytest.raises(ConfigError, match="fedproto.weighting"):
        parse_run_config(raw_config(method="fedproto", weighting="count"))
    with pytest.raises(ConfigError, match="config key 'aggregation'"):
        parse_run_config(raw_config(method="fedproto", aggregation="weighted"))


def test_the_pfllib_profile_weighs_clients_equally() -> None:
    pfllib = {"method": "fedproto", "profile": "pfllib", "model": "cnn4", "dataset": "cifar10"}
    params = FedProtoParams.of(parse_run_config(pfllib))
    assert (params.lam, params.weighting, params.predict) == (1.0, "clients", "prototype")
    params = FedProtoParams.of(parse_run_config({"method": "fedproto"}))
    assert (params.lam, params.weighting) == (1.0, "samples")


def test_secure_aggregation_carries_the_sums() -> None:
    cfg = parse_run_config(raw_config(method="fedproto", **{"secure-aggregation": True}))
    assert cfg.secure_aggregation


def test_a_site_that_has_not_accepted_class_prototypes_refuses(tmp_path) -> None:
    small = {"num-server-rounds": 2, "sim-samples": 60, "hidden-dim": 16, "run-name": "p"}
    fits: list = []
    nodes = [{"site": f"client-{i}"} for i in range(3)]
    server, rounds = build_inprocess(
        {**small, "method": "fedproto", "output-dir": str(tmp_path)},
        3,
        lambda kind, cid, ins, res: fits.append(res),
        nodes,
    )
    with pytest.raises(RunRefused) as err:
        server.fit(rounds, timeout=None)
    assert fits == []  # nothing reached the server
    message = str(err.value)
    assert REFUSED in message and "'class-prototypes'" in message
    assert "method='fedproto'" in message


def test_two_backbones_of_one_feature_width_exchange_prototypes() -> None:
    # logreg embeds the 20 inputs themselves, mlp a 20-wide hidden layer: no weight
    # travels, so the two share prototypes (the core builds one model per run, so the
    # two clients are built here from two configs)
    width = {"hidden-dim": 20, "sim-dim": 20, "batch-size": 10_000}
    cfg_mlp, cfg_lin = (config(method="fedproto", model=m, **width) for m in ("mlp", "logreg"))
    a, _ = make_client(cfg_mlp, 0)
    b, _ = make_client(cfg_lin, 1)
    assert a.model.feature_dim == b.model.feature_dim == 20
    assert type(a.model.features) is not type(b.model.features)
    strategy = make_strategy(cfg_mlp)
    ups = []
    for i, c in enumerate((a, b)):
        arrays, n, _ = c.fit(strategy.global_arrays, {"server-round": 1})
        ups.append(Reply(f"client-{i}", arrays, n, {}))
    strategy.aggregate_held(1, ups, {})
    sums, counts = strategy.global_arrays
    want = (ups[0].arrays[0] + ups[1].arrays[0]) / (ups[0].arrays[1] + ups[1].arrays[1])[:, None]
    protos, present = global_prototypes(torch.tensor(sums), torch.tensor(counts))
    assert present.all() and np.allclose(protos.numpy(), want, atol=1e-5)
    for c in (a, b):  # each scores by the shared prototypes with its own backbone
        c.receive([sums, counts], {})
        assert 0.0 <= c.score()[1]["accuracy"] <= 1.0 and "accuracy-head" in c.score()[1]


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("fedproto", tmp_path)
    assert np.isfinite(res["final_accuracy_mean"])


def test_the_robust_bounds_leave_prototype_statistics_as_sent() -> None:
    """Sums and counts are not a model a reply moves: the card's ``bounds_updates=False``
    turns off the update-norm bound and the direction check (which would rescale or
    project a reply against the last global buffers and change its sum-to-count ratio),
    in the streamed round as in the held one; the weight cap stays."""
    from strategies.robust import Bounds

    cfg = config(method="fedproto", **{"update-norm-bound": 5.0, "direction-check-from": 4})
    assert Bounds.of(cfg, True, updates=False) == Bounds(
        cfg.weight_cap, 0.0, cfg.update_norm_action, 0, cfg.direction_min_cosine
    )
    for method, bounded in (("fedproto", False), ("fedavg", True)):
        strategy = make_strategy(config(method=method, **{"update-norm-bound": 5.0}))
        streamed = strategy.open_streamed_round(1, [1, 2, 3, 4])
        assert streamed is not None
        assert (streamed.bounds.norm_bound > 0, streamed.bounds.direction_from > 0) == (
            bounded,
            bounded,
        ), method
