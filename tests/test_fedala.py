"""FedALA (methods/fedala/): W's gradient step, its clip to [0, 1] and the mix against
hand-computed values on a one-layer linear model, the lower layers taken from the
received model, the start phase run until settled and one pass after, only the
network on the wire, W and the previous local model kept across rounds and a
restart, the evaluation of the mix, its keys, and a short federation with
``method='fedala'`` alone."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays
from torch import nn

from client_app.base import PFLClient
from client_app.train import evaluate
from methods import get_method, parse_run_config
from methods.fedala import FedAlaParams
from methods.fedala.client import learn_weights, local_aggregation, settled, weight_step
from methods.fedala.model import NO_LOCAL, SETTLED, START, FedAlaModel, mix
from pflower.config.schema import ConfigError
from pflower.data import data_info
from tests.helpers import config, make_client, make_strategy, short_federation

ROOT = Path(__file__).resolve().parents[1]
X, Y = torch.tensor([[1.0, 0.0]]), torch.tensor([0])
PREVIOUS = torch.tensor([[1.0, 0.0], [1.0, 0.0]])


def linear_ala(phase: int = START) -> FedAlaModel:
    """A 2x2 linear layer without bias, all of it mixed: received theta_g = 0, the
    previous local model [[1, 0], [1, 0]], W = 1 (so the first mix is theta_g)."""
    model = FedAlaModel(nn.Linear(2, 2, bias=False), layers=1)
    with torch.no_grad():
        model.net.weight.zero_()
        model.previous.weight.copy_(PREVIOUS)
        model.phase.fill_(phase)
    return model


def test_the_mix_is_previous_plus_the_gap_times_w() -> None:
    # 1 + (3 - 1) * 0.25 = 1.5; 2 + (-2 - 2) * 0.5 = 0; 5 + (7 - 5) * 0 = 5; w = 1: 4
    prev, got = torch.tensor([1.0, 2.0, 5.0, 0.0]), torch.tensor([3.0, -2.0, 7.0, 4.0])
    w = torch.tensor([0.25, 0.5, 0.0, 1.0])
    torch.testing.assert_close(mix(prev, got, w), torch.tensor([1.5, 0.0, 5.0, 4.0]))


def test_one_w_step_by_hand() -> None:
    # W = 1: the mix is theta_g = 0, logits (0, 0), p = (1/2, 1/2); the logits'
    # gradient p - e_0 = (-1/2, 1/2), the weight's its outer product with x = (1, 0):
    # [[-1/2, 0], [1/2, 0]]. theta_g - theta_prev = [[-1, 0], [-1, 0]], so
    # dL/dW = [[1/2, 0], [-1/2, 0]] and W - 1 * dL/dW = [[1/2, 1], [3/2, 1]] -> clip
    model = linear_ala()
    params = FedAlaParams(eta=1.0)
    losses = learn_weights(model, [(X, Y)], params, converge=False)
    assert losses == [pytest.approx(math.log(2))]
    want = torch.tensor([[0.5, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(model.weights.weight, want)
    # the mix with the new W: [[1 - 1/2, 0], [1 - 1, 0]]
    torch.testing.assert_close(model.mixed_top()[0], torch.tensor([[0.5, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(model.net.weight.detach(), torch.zeros(2, 2))  # W only


def test_w_is_clipped_to_zero_and_one() -> None:
    # eta = 3: W - 3 dL/dW = [[1 - 3/2, 1], [1 + 3/2, 1]] = [[-1/2, 1], [5/2, 1]]
    w = torch.ones(2, 2)
    grad = torch.tensor([[-0.5, 0.0], [0.5, 0.0]])
    weight_step(w, grad, PREVIOUS, torch.zeros(2, 2), eta=3.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0], [1.0, 1.0]]))


def test_the_start_phase_runs_until_settled_and_later_fits_one_pass() -> None:
    # the population std of the last 3 losses: [2, 1, 2] -> sqrt(2/9) = 0.471
    params = FedAlaParams(num_pre_loss=3, threshold=0.5)
    assert not settled([1.0, 2.0, 1.0], params)  # 3 losses: not more than the window
    assert settled([1.0, 2.0, 1.0, 2.0], params)
    assert not settled([1.0, 2.0, 1.0, 2.0], FedAlaParams(num_pre_loss=3, threshold=0.4))
    # eta = 0: W holds, every pass's loss is log 2, the std 0: settled after 3 + 1
    still = FedAlaParams(eta=0.0, num_pre_loss=3)
    assert len(learn_weights(linear_ala(), [(X, Y)], still, converge=True)) == 4
    capped = FedAlaParams(eta=0.0, num_pre_loss=3, max_start_epochs=2)
    assert len(learn_weights(linear_ala(), [(X, Y)], capped, converge=True)) == 2
    assert len(learn_weights(linear_ala(), [(X, Y)], still, converge=False)) == 1
    model = linear_ala(START)
    assert local_aggregation(model, [(X, Y)], still) == 4 and int(model.phase) == SETTLED
    assert local_aggregation(model, [(X, Y)], still) == 1


def untrained(monkeypatch: pytest.MonkeyPatch, starts: list[dict]) -> None:
    """Local training replaced by a note of the model it would start from."""

    def note_start(self, config, generator):  # noqa: ANN001, ANN202
        starts.append({k: v.clone() for k, v in self.model.net.state_dict().items()})
        return {"train-loss": 0.0}

    monkeypatch.setattr(PFLClient, "local_train", note_start)


def shifted(payload: list[np.ndarray], by: float) -> list[np.ndarray]:
    return [a + np.float32(by) for a in payload]


def test_lower_layers_are_the_received_and_the_top_the_mix(monkeypatch) -> None:
    starts: list[dict] = []
    untrained(monkeypatch, starts)
    cfg = config(method="fedala", **{"fedala.threshold": 1e9, "fedala.num-pre-loss": 3})
    client, _ = make_client(cfg)
    first = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    _, _, m1 = client.fit(first, {"server-round": 1})
    assert m1["ala-epochs"] == 0  # no local model yet: the received model as it is
    names = list(client.model.net.state_dict())
    for name, got in zip(names, first):
        np.testing.assert_array_equal(starts[0][name].numpy(), got)
    second = shifted(first, 0.5)
    _, _, m2 = client.fit(second, {"server-round": 2})
    assert m2["ala-epochs"] == 4  # the start phase: settled after num-pre-loss + 1
    model, top = client.model, client.model.top
    assert top == tuple(names[-2:])  # the head's weight and bias
    w = dict(zip(top, model.weights.of(top)))
    assert any(not torch.equal(v, torch.ones_like(v)) for v in w.values())  # W was learned
    for name, got, prev in zip(names, second, first):
        start = starts[1][name]
        if name in top:  # previous (the first start, untrained) + (received - previous) W
            want = torch.from_numpy(prev) + torch.from_numpy(got - prev) * w[name]
            torch.testing.assert_close(start, want)
        else:
            np.testing.assert_array_equal(start.numpy(), got)
    _, _, m3 = client.fit(shifted(first, 1.0), {"server-round": 3})
    assert m3["ala-epochs"] == 1  # later fits: one pass


def test_only_the_network_travels() -> None:
    cfg = config(method="fedala")
    client, _ = make_client(cfg)
    strategy = make_strategy(cfg)
    assert all(s.name.startswith("net.") for s in strategy.spec)
    top = client.model.top
    own = {f"previous.{n.replace('.', '__')}" for n in top}
    own |= {f"weights.{n.replace('.', '__')}" for n in top} | {"phase"}
    assert set(client.roles.personal) == own
    payload = parameters_to_ndarrays(strategy.global_payload())
    upload, n, _ = client.fit(payload, {"server-round": 1})
    net = client.model.net.state_dict()
    assert len(upload) == len(net) == len(client.roles.shared)
    for sent, mine in zip(upload, net.values()):
        np.testing.assert_array_equal(sent, mine.numpy())
    assert strategy.check_reply(client.client_key, upload, n) is None
    # the previous local model is the top of that upload: not counted as a secret
    assert set(client.personal_tensors()) == {n for n in own if not n.startswith("previous.")}


def test_w_and_the_previous_model_survive_rounds_and_a_restart() -> None:
    cfg = config(method="fedala", local_epochs=2, lr=0.2)
    client, context = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    client.fit(payload, {"server-round": 2})
    kept = client.personal_state()
    assert int(kept["phase"][0]) == SETTLED
    assert any((v != 1).any() for k, v in kept.items() if k.startswith("weights."))
    again, _ = make_client(cfg, context=context)  # a new process on the node's store
    assert int(again.model.phase) == NO_LOCAL
    assert all(torch.equal(w, torch.ones_like(w)) for w in again.model.weights.of(again.model.top))
    again.restore_personal()
    assert set(again.personal_state()) == set(kept)
    for name, value in kept.items():
        np.testing.assert_array_equal(again.personal_state()[name], value)
    _, _, metrics = again.fit(payload, {"server-round": 3})
    assert metrics["ala-epochs"] == 1  # past the start phase: one pass


def test_the_evaluation_mixes_the_received_top_with_the_kept_w() -> None:
    cfg = config(method="fedala", lr=0.2)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    client.fit(payload, {"server-round": 2})
    received = shifted(payload, 0.1)
    model = client.model
    client.restore_personal()
    client.receive(received, {})
    reference = copy.deepcopy(model.net)
    with torch.no_grad():
        for name, value in zip(model.top, model.mixed_top()):
            reference.get_parameter(name).copy_(value)
    want_loss, want = evaluate(reference, client.x_test, client.y_test)
    plain_loss, _ = evaluate(model.net, client.x_test, client.y_test)
    assert abs(plain_loss - want_loss) > 1e-4  # the mix is not the received model
    loss, _, scores = client.evaluate(received, {"server-round": 2})
    assert (loss, scores["accuracy"]) == (pytest.approx(want_loss), pytest.approx(want))
    for name, got in zip(model.net.state_dict(), received):  # put back as received
        np.testing.assert_array_equal(model.net.state_dict()[name].numpy(), got)


def test_its_keys_defaults_and_checks() -> None:
    params = FedAlaParams.of(parse_run_config({"method": "fedala"}))
    assert (params.layers, params.eta, params.rand_percent) == (2, 1.0, 80)
    assert (params.threshold, params.num_pre_loss, params.max_start_epochs) == (0.1, 10, 100)
    images = {"model": "cnn4", "dataset": "images.parquet", "profile": "pfllib"}
    assert FedAlaParams.of(parse_run_config({"method": "fedala", **images})) == params
    bad = [
        {"fedala.layers": -1},
        {"fedala.eta": -0.5},
        {"fedala.rand-percent": 0},
        {"fedala.rand-percent": 101},
        {"fedala.threshold": 0},
        {"fedala.num-pre-loss": 0},
        {"fedala.max-start-epochs": 0},
    ]
    for keys in bad:
        with pytest.raises(ConfigError, match=f"'{next(iter(keys))}'"):
            parse_run_config({"method": "fedala", **keys})
    cfg = config(method="fedala", **{"fedala.layers": 99})
    with pytest.raises(ConfigError, match="'fedala.layers'"):
        get_method("fedala").build_model(cfg, data_info(cfg))
    every = get_method("fedala").build_model(config(method="fedala", layers=0), data_info(cfg))
    assert isinstance(every, FedAlaModel)
    assert every.top == tuple(n for n, _ in every.net.named_parameters())


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("fedala", tmp_path)
    last = res["rounds"][-1]
    assert np.isfinite(res["final_accuracy_mean"]) and not last["rejected"]
