"""Ditto, the method added as one package (methods/ditto/): its split, its schedule
(the proximal pull of the personal model towards the received global one), its
keys, and a short federation."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays

from client_app.method_client import client_class
from methods import get_method, method_names, parse_run_config
from pflower.config.schema import ConfigError
from tests.helpers import config, make_client, make_strategy, short_federation

ROOT = Path(__file__).resolve().parents[1]


def test_ditto_is_found_by_the_registry_and_names_only_its_own_package() -> None:
    assert "ditto" in method_names()
    method = get_method("ditto")
    code = [method.model_side.split, method.model_side.transform, client_class(method)]
    assert all(c.__module__.startswith("methods.ditto.") for c in code)
    # its package imports shared code, never another method's package (baselines' schedule
    # aside: Ditto's local solver is theirs)
    for path in (ROOT / "methods" / "ditto").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("methods."):
                assert node.module.startswith(("methods.ditto", "methods.baselines")), path


def test_only_the_global_copy_leaves_and_the_personal_copy_stays() -> None:
    cfg = config(method="ditto")
    client, context = make_client(cfg)
    strategy = make_strategy(cfg)
    assert all(s.name.startswith("global_model.") for s in strategy.spec)
    assert all(n.startswith("personal.") for n in client.roles.personal)
    payload = parameters_to_ndarrays(strategy.global_payload())
    upload, n, metrics = client.fit(payload, {"server-round": 1})
    glob = client.model.global_model.state_dict()
    assert len(upload) == len(glob)
    for sent, mine in zip(upload, glob.values()):
        np.testing.assert_array_equal(sent, mine.numpy())
    assert strategy.check_reply(client.client_key, upload, n) is None
    # the personal copy trained and was stored; it is what the client is scored with
    stored = client.store.load()
    personal = client.model.personal.state_dict()
    assert set(stored) == {f"personal.{k}" for k in personal}
    assert not all(
        np.array_equal(stored[f"personal.{k}"], payload[i]) for i, k in enumerate(personal)
    )
    _, _, scores = client.evaluate(payload, {"server-round": 2})
    with torch.no_grad():
        own = client.model.personal(client.x_test).argmax(1)
    assert scores["accuracy"] == pytest.approx(float((own == client.y_test).float().mean()))


def _personal_distance(lam: float) -> float:
    cfg = config(method="ditto", lam=lam, local_epochs=3)
    client, _ = make_client(cfg)
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    v = torch.cat([p.detach().flatten() for p in client.model.personal.parameters()])
    w = torch.cat([torch.as_tensor(a).flatten() for a in payload])
    return float((v - w).norm())


def test_lambda_pulls_the_personal_model_towards_the_received_global_one() -> None:
    free, pulled, held = _personal_distance(0.0), _personal_distance(1.0), _personal_distance(20.0)
    assert free > pulled > held > 0


def test_a_lambda_that_makes_sgd_diverge_is_a_config_error() -> None:
    # lr 0.05 without momentum: the proximal step diverges from lambda = 2 / 0.05 = 40
    with pytest.raises(ConfigError, match="'ditto.lambda'"):
        config(method="ditto", lam=40.0)
    assert config(method="ditto", lam=39.0).params.lam == 39.0
    assert config(method="ditto", lam=40.0, optimizer="adam").params.lam == 40.0


def test_its_keys_are_namespaced_validated_and_follow_the_schedule() -> None:
    cfg = parse_run_config({"method": "ditto", "local-epochs": 3})
    assert cfg.params.personal_epochs == 3 and "ditto.personal-epochs" in cfg.auto_resolved
    assert cfg.as_dict()["ditto.lambda"] == 1.0
    with pytest.raises(ConfigError, match="'ditto.lambda'"):
        parse_run_config({"method": "ditto", "ditto.lambda": -1})
    with pytest.raises(ConfigError, match="unknown config key 'ditto.lamda'"):
        parse_run_config({"method": "ditto", "ditto.lamda": 1})


def test_a_short_federation_trains_and_records_every_client(tmp_path) -> None:
    last = short_federation("ditto", tmp_path)["rounds"][-1]
    assert last["bytes_up"] > 0 and not last["rejected"]
