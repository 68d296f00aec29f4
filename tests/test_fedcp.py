"""FedCP: routing, context, MMD, roles on the wire, frozen parts, deterministic
evaluation, and an end-to-end run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import Context, RecordDict
from torch.optim.optimizer import register_optimizer_step_pre_hook

from client_app.method_client import build_method_client
from client_app.state import ContextStore
from methods import get_method, parse_run_config
from methods.fedcp.client import FedCPClient
from methods.fedcp.model import FedCPModel, mmd_rbf
from models.roles import CLIENT_KEY, get_arrays
from pflower.config.schema import RunConfig
from pflower.data import DataInfo, load_client_data

METHOD = get_method("fedcp")


def _cfg(**raw: object) -> RunConfig:
    return parse_run_config({"method": "fedcp", **raw})


def _model(cfg: RunConfig | None = None, model: str = "mlp") -> FedCPModel:
    cfg = cfg or _cfg(model=model)
    shape = (3, 32, 32) if model == "cnn4" else (cfg.sim_dim,)
    return METHOD.build_model(cfg, DataInfo(shape, 10 if model == "cnn4" else 2))


def _client(cfg: RunConfig, pid: int = 0, num: int = 2) -> FedCPClient:
    model = _model(cfg)
    data = load_client_data(cfg, pid, num)
    store = ContextStore(Context(0, 0, {}, RecordDict(), {}))
    client = build_method_client(METHOD, model, data, cfg, store, torch.device("cpu"), f"c{pid}")
    assert isinstance(client, FedCPClient)
    return client


def test_routes_sum_to_one_in_train_and_eval() -> None:
    model = _model(model="cnn4")
    h = torch.randn(7, model.feature_dim)
    for train in (True, False):
        model.train(train)
        pm, gm = model.routes(h)
        assert pm.shape == gm.shape == (7, 512)
        assert torch.allclose(pm + gm, torch.ones_like(pm), atol=1e-6)
        assert (pm > 0).all() and (gm > 0).all()


def test_context_is_normalised_column_sum_of_personal_head() -> None:
    model = _model()
    with torch.no_grad():
        model.head.weight.copy_(torch.randn_like(model.head.weight))
    model.refresh_context()
    want = model.head.weight.sum(dim=0)
    want = want / want.norm()
    assert torch.allclose(model.context, want, atol=1e-6)
    assert not model.context.requires_grad
    # neither the context nor a frozen extractor copy is a state_dict entry
    assert "context" not in model.state_dict()
    assert all(
        n.split(".")[0] in {"features", "head", "global_head", "cpn"} for n in model.state_dict()
    )


def test_mmd_zero_on_itself_and_grows_with_shift() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, generator=g)
    assert float(mmd_rbf(x, x)) == pytest.approx(0.0, abs=1e-5)
    values = [float(mmd_rbf(x, x + s)) for s in (0.5, 1.0, 2.0, 4.0)]
    assert all(b > a for a, b in zip(values, values[1:]))
    assert values[0] > 1e-3
    # matches the reference's formula mean(XX + YY - 2 XY) on a small case
    y = torch.randn(32, 16, generator=g) + 1
    d = lambda a, b: torch.cdist(a, b) ** 2  # noqa: E731
    ref = sum(
        torch.exp(-0.5 * d(x, x) / a)
        + torch.exp(-0.5 * d(y, y) / a)
        - 2 * torch.exp(-0.5 * d(x, y) / a)
        for a in (10, 15, 20, 50)
    ).mean()
    assert float(mmd_rbf(x, y)) == pytest.approx(float(ref), rel=1e-4)


def test_split_personal_head_only() -> None:
    cfg = _cfg(model="cnn4")
    model = _model(cfg, model="cnn4")
    roles = METHOD.roles(model, cfg)
    assert roles.personal == ("head.weight", "head.bias")
    assert {n.split(".")[0] for n in roles.shared} == {"features", "global_head", "cpn"}


def test_eval_is_deterministic_by_default_and_noisy_option_is_not() -> None:
    x = torch.randn(16, 100)
    model = _model()
    model.eval()
    assert torch.equal(model(x), model(x))
    noisy = _model(_cfg(**{"fedcp.noisy-eval": True}))
    noisy.eval()
    assert not torch.equal(noisy(x), noisy(x))


def test_frozen_parts_get_no_gradient_and_global_head_is_blended() -> None:
    cfg = _cfg(lr=0.05, **{"batch-size": 10})
    client = _client(cfg)
    m = client.model
    # make h_p and h_g differ so the blend is observable
    with torch.no_grad():
        m.head.weight.add_(1.0)
    hp0 = m.head.weight.detach().clone()
    hg0 = m.global_head.weight.detach().clone()
    phi_g0 = [p.detach().clone() for p in client.phi_g.parameters()]
    grads: dict[str, bool] = {}

    def record(_: torch.nn.Module) -> None:
        for name, p in m.named_parameters():
            grads[name] = grads.get(name, False) or p.grad is not None
        for p in client.phi_g.parameters():
            assert p.grad is None

    handle = register_optimizer_step_pre_hook(lambda o, a, k: record(m))
    try:
        client.local_train({}, torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    assert not grads["global_head.weight"] and not grads["global_head.bias"]
    assert grads["head.weight"] and grads["features.1.weight"] and grads["cpn.0.weight"]
    assert all(torch.equal(a, b) for a, b in zip(phi_g0, client.phi_g.parameters()))
    # h_g <- 0.5 h_p + 0.5 h_g after training (h_g itself was frozen)
    hp1 = m.head.weight.detach()
    assert not torch.equal(hp1, hp0)
    assert torch.allclose(m.global_head.weight, 0.5 * hp1 + 0.5 * hg0, atol=1e-6)


def test_receive_sets_shared_keeps_personal_and_refreshes_copy_and_context() -> None:
    cfg = _cfg()
    client = _client(cfg)
    m = client.model
    with torch.no_grad():
        m.head.weight.normal_()
    hp = m.head.weight.detach().clone()
    incoming = [a + 0.1 for a in get_arrays(m, client.roles.shared)]
    client.receive(incoming, {})
    for name, a in zip(client.roles.shared, incoming):
        assert np.allclose(m.state_dict()[name].numpy(), a)
    assert torch.equal(m.head.weight, hp)
    for (n, p), q in zip(m.features.named_parameters(), client.phi_g.parameters()):
        assert torch.equal(p, q), n
    assert torch.allclose(m.context, F.normalize(hp.sum(0), dim=0))


def test_personal_head_never_on_wire_and_survives_rounds() -> None:
    cfg = _cfg()
    client = _client(cfg)
    roles = client.roles
    sent = get_arrays(client.model, roles.shared)
    up, n, metrics = client.fit(sent, {"server-round": 1})
    assert len(up) == len(roles.shared)
    assert [a.shape for a in up] == [
        tuple(s) for s in (client.model.state_dict()[k].shape for k in roles.shared)
    ]
    hp = client.model.head.weight.detach().clone()
    # a new round: the server's payload holds no head; the trained h_p comes back from the store
    with torch.no_grad():
        client.model.head.weight.zero_()
    loss, _, ev = client.evaluate(up, {"server-round": 1})
    assert torch.equal(client.model.head.weight, hp)
    assert ev[CLIENT_KEY] == "c0" and 0.0 <= ev["pir"] <= 1.0 and 0.0 <= ev["accuracy"] <= 1.0
    assert n == client.y_train.shape[0]


@pytest.mark.slow
def test_end_to_end_completes_improves_and_records_pir(tmp_path) -> None:  # noqa: ANN001
    from pflower.engine.simulate import simulate

    res = simulate(
        {
            "method": "fedcp",
            "num-server-rounds": 3,
            "output-dir": str(tmp_path),
            "run-name": "fedcp",
        },
        3,
    )
    rounds = res["rounds"]
    assert len(rounds) == 3
    accs = [r["accuracy_mean"] for r in rounds]
    assert accs[-1] > accs[0] or accs[-1] > 0.8
    for r in rounds:
        assert set(r["per_client_pir"]) == {"client-0", "client-1", "client-2"}
        assert all(0.0 < v < 1.0 for v in r["per_client_pir"].values())
        assert r["rejected"] == []
    # what went up each round is exactly the shared part (features, h_g, CPN)
    cfg = _cfg()
    model = _model(cfg)
    roles = METHOD.roles(model, cfg)
    shared_bytes = sum(a.nbytes for a in get_arrays(model, roles.shared))
    assert rounds[0]["bytes_up"] >= 3 * shared_bytes
    assert rounds[0]["bytes_up"] < 3 * shared_bytes + 3 * model.head.weight.numel() * 4


def test_wraps_resnet18_with_its_fc_as_heads() -> None:
    cfg = _cfg(model="resnet18")
    model = METHOD.build_model(cfg, DataInfo((3, 32, 32), 10))
    assert model.feature_dim == 512 and model.global_head.weight.shape == (10, 512)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    assert model(x).shape == (2, 10)
    assert torch.equal(model(x), model(x))
    assert METHOD.roles(model, cfg).personal == ("head.weight", "head.bias")
