"""FedBABU (methods/fedbabu): the head never travels and never trains during the
federation (bit for bit its seeded initialisation after rounds of it), the body
does; each evaluation scores a fine-tuned copy of body and head that is never
uploaded; its key's bounds; a short federation with ``method='fedbabu'`` alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays

import methods.fedbabu.client as fedbabu_client
from client_app.base import fine_tuned_copy
from client_app.state import ContextStore
from client_app.train import evaluate
from methods import ConfigError, get_method, parse_run_config
from pflower.data import data_info
from pflower.engine.inprocess import build_inprocess
from tests.helpers import config, make_client, make_strategy, short_federation

HEAD = ("head.weight", "head.bias")


def _received(cfg) -> list[np.ndarray]:
    return parameters_to_ndarrays(make_strategy(cfg).global_payload())


def _init_head(cfg) -> dict[str, np.ndarray]:
    """The head every node builds from the run's seed."""
    model = get_method("fedbabu").build_model(cfg, data_info(cfg))
    return {n: model.state_dict()[n].numpy().copy() for n in HEAD}


def test_the_head_stays_home_and_the_payload_is_the_body() -> None:
    cfg = config(method="fedbabu")
    client, _ = make_client(cfg)
    assert client.roles.personal == HEAD
    state = client.model.state_dict()
    body = [n for n in state if not n.startswith("head.")]
    assert list(client.roles.shared) == body and body
    payload = _received(cfg)
    assert [a.shape for a in payload] == [tuple(state[n].shape) for n in body]


def test_local_training_steps_the_body_only_and_leaves_the_head_bit_for_bit(
    monkeypatch,
) -> None:
    cfg = config(method="fedbabu", local_epochs=2)
    client, _ = make_client(cfg)
    head = {n: a.copy() for n, a in _init_head(cfg).items()}
    trained: list[list[torch.nn.Parameter]] = []  # what each train_epochs call may step
    real = fedbabu_client.train_epochs

    def spy(model, params, *args, **kwargs):  # noqa: ANN001, ANN202
        trained.append(list(params))
        return real(model, params, *args, **kwargs)

    monkeypatch.setattr(fedbabu_client, "train_epochs", spy)
    received = _received(cfg)
    upload, _, _ = client.fit(received, {"server-round": 1})
    (params,) = trained  # one phase, no fine-tuning in a fit without eval-first
    head_ids = {id(p) for p in client.model.head.parameters()}
    assert head_ids.isdisjoint(id(p) for p in params)
    assert {id(p) for p in client.model.features.parameters()} == {id(p) for p in params}
    for name in HEAD:
        got = client.model.state_dict()[name].numpy()
        assert got.tobytes() == head[name].tobytes()
    assert len(upload) == len(received)  # the body only ...
    assert any(not np.array_equal(u, r) for u, r in zip(upload, received))  # ... and it moved


def test_a_federation_leaves_every_head_at_its_initialisation(tmp_path) -> None:
    raw = {
        "method": "fedbabu",
        "num-server-rounds": 2,
        "sim-samples": 60,
        "hidden-dim": 16,
        "personal-state": "memory",  # in each node's Context, where the test reads it
        "output-dir": str(tmp_path),
        "run-name": "babu",
    }
    cfg = parse_run_config(raw)
    head = _init_head(cfg)
    body_shapes = [a.shape for a in _received(cfg)]
    replies: list[list[np.ndarray]] = []

    def record(kind: str, cid: str, instruction, reply) -> None:  # noqa: ANN001
        if kind == "fit":
            replies.append(parameters_to_ndarrays(reply.parameters))
            assert [a.shape for a in parameters_to_ndarrays(instruction.parameters)] == body_shapes

    server, rounds = build_inprocess(raw, 3, record)
    server.fit(rounds, timeout=None)
    assert len(replies) == 6 and all([a.shape for a in r] == body_shapes for r in replies)
    nodes = server.client_manager().all().values()
    stored = [ContextStore(p.context).load() for p in nodes]
    assert len(stored) == 3
    for state in stored:
        assert state is not None and sorted(state) == sorted(HEAD)
        for name in HEAD:  # bit for bit, after two rounds of training and fine-tuning
            assert state[name].dtype == head[name].dtype
            assert state[name].tobytes() == head[name].tobytes()
    final = parameters_to_ndarrays(server.strategy.global_payload())
    assert any(not np.array_equal(a, b) for a, b in zip(final, _received(cfg)))


def test_evaluation_scores_a_fine_tuned_copy_that_is_never_uploaded() -> None:
    cfg = config(method="fedbabu", finetune_epochs=3)
    client, _ = make_client(cfg)
    received = _received(cfg)
    client.receive(received, {})
    before = {n: t.clone() for n, t in client.model.state_dict().items()}
    tuned = fine_tuned_copy(client, 3)
    assert tuned is not client.model
    after = tuned.state_dict()
    # the whole model was fine-tuned: the head and the body both moved in the copy
    assert not torch.equal(after["head.weight"], before["head.weight"])
    assert any(not torch.equal(after[n], before[n]) for n in client.roles.shared)
    # the model itself is as received, and what it would upload is the received body
    assert all(torch.equal(client.model.state_dict()[n], t) for n, t in before.items())
    loss, metrics = client.score()
    assert (loss, metrics["accuracy"]) == evaluate(tuned, client.x_test, client.y_test)
    assert metrics["accuracy-global"] == evaluate(client.model, client.x_test, client.y_test)[1]
    upload = client.upload({})
    assert len(upload) == len(received)
    assert all(np.array_equal(u, r) for u, r in zip(upload, received))


def test_no_fine_tuning_scores_the_received_body_with_the_random_head() -> None:
    cfg = config(method="fedbabu", finetune_epochs=0)
    client, _ = make_client(cfg)
    client.receive(_received(cfg), {})
    same = fine_tuned_copy(client, 0).state_dict()
    assert all(torch.equal(same[n], t) for n, t in client.model.state_dict().items())
    loss, metrics = client.score()
    assert (loss, metrics["accuracy"]) == evaluate(client.model, client.x_test, client.y_test)


def test_bad_values_are_config_errors_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="'fedbabu.finetune-epochs'"):
        parse_run_config({"method": "fedbabu", "fedbabu.finetune-epochs": -1})
    assert parse_run_config({"method": "fedbabu"}).params.finetune_epochs == 5  # tau_f
    cfg = config(method="fedbabu", model="logreg")  # no body: nothing would train
    with pytest.raises(ConfigError, match="'model'"):
        get_method("fedbabu").build_model(cfg, data_info(cfg))


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("fedbabu", tmp_path)
    assert np.isfinite(res["final_accuracy_mean"])
