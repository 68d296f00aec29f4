"""DualFed: the SupCon loss, the stage-wise schedule, what travels, end to end."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client_app.method_client import build_method_client
from methods import get_method, parse_run_config
from methods.dualfed.client import DualFedClient, labels_skewed, supcon_loss
from methods.dualfed.model import DualFedModel
from models.roles import get_arrays, set_arrays
from pflower.data import ClientData, DataInfo
from tests.helpers import MemoryStore


def eq7(u: torch.Tensor, labels: torch.Tensor, tau: float) -> float:
    """DualFed eq. 7 written out as loops (every anchor has a positive here)."""
    u = F.normalize(u.double(), dim=1)
    n, total = len(labels), 0.0
    for i in range(n):
        denom = sum(math.exp(float(u[i] @ u[a]) / tau) for a in range(n) if a != i)
        pos = [j for j in range(n) if j != i and labels[j] == labels[i]]
        total += -sum(float(u[i] @ u[j]) / tau - math.log(denom) for j in pos) / len(pos)
    return total / n


def test_supcon_matches_a_hand_computed_case():
    # two classes on two orthogonal directions (lengths differ: u is L2-normalised);
    # each anchor: one positive at cosine 1, two negatives at cosine 0, so the loss is
    # -(1/tau - log(e^(1/tau) + 2)) for every anchor
    u = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 3.0], [0.0, 1.0]])
    y = torch.tensor([0, 0, 1, 1])
    for tau in (1.0, 0.5, 0.2):
        want = math.log(math.exp(1 / tau) + 2) - 1 / tau
        assert float(supcon_loss(tau)(u, y)) == pytest.approx(want, rel=1e-5)


def test_supcon_matches_equation_7_on_random_features():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(12, 5, generator=g)
    y = torch.tensor([0, 1, 2] * 4)
    assert float(supcon_loss(0.2)(u, y)) == pytest.approx(eq7(u, y, 0.2), rel=1e-4)


def test_supcon_lower_for_clustered_than_shuffled_features():
    g = torch.Generator().manual_seed(1)
    y = torch.arange(4).repeat_interleave(16)
    centres = torch.randn(4, 32, generator=g) * 3
    u = centres[y] + 0.3 * torch.randn(64, 32, generator=g)
    shuffled = y[torch.randperm(64, generator=g)]
    loss = supcon_loss(0.2)
    assert float(loss(u, y)) < 0.5 * float(loss(u, shuffled))


# ---- the client ------------------------------------------------------------------------------


def make_client(
    schedule: str = "stagewise", y_train: torch.Tensor | None = None, **overrides: Any
) -> tuple[DualFedClient, DualFedModel]:
    """A DualFed client on resnet8 (has BN in the encoder) over small random images."""
    cfg = parse_run_config(
        {
            "method": "dualfed",
            "model": "resnet8",
            "dualfed.schedule": schedule,
            "lr": 0.05,
            "momentum": 0.5,
            "batch-size": 16,
            "dualfed.projector-hidden": 32,
            "dualfed.supcon-lambda": 1.0,
            **overrides,
        }
    )
    method = get_method("dualfed")
    model = method.build_model(cfg, DataInfo((3, 16, 16), 4))
    g = torch.Generator().manual_seed(3)
    data = ClientData(
        torch.randn(48, 3, 16, 16, generator=g),
        torch.arange(4).repeat(12) if y_train is None else y_train,
        torch.randn(16, 3, 16, 16, generator=g),
        torch.arange(4).repeat(4),
    )
    client = build_method_client(method, model, data, cfg, MemoryStore(), torch.device("cpu"), "c0")
    assert isinstance(client, DualFedClient)
    return client, model


def snapshot(model: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith(prefix)}


def changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> set[str]:
    after = model.state_dict()
    return {k for k, v in before.items() if not torch.equal(v, after[k])}


def test_stage1_trains_main_branch_and_leaves_global_head_untouched():
    client, model = make_client()
    before = snapshot(model)
    client.stage1(torch.Generator().manual_seed(0))
    moved = changed(before, model)
    assert not {k for k in moved if k.startswith("head.")}
    for prefix in ("features.", "projector.", "personal_head."):
        assert any(k.startswith(prefix) for k in moved), prefix


@pytest.mark.parametrize("combine", ["probabilities", "logits"])
def test_stage1_can_train_the_personal_branch_on_the_combined_prediction(combine):
    """dualfed.personal-loss=combined: stage 1's CE is the combined prediction's (h_s frozen
    but in the loss), not h_p's alone; the paper's default stays h_p's alone."""
    for target in ("personal", "combined"):
        client, model = make_client(**{"dualfed.personal-loss": target, "dualfed.combine": combine})
        model.train()
        x, y = client.x_train[:16], client.y_train[:16]
        with torch.no_grad():
            model.head.weight.mul_(20)  # a confident global head: the two CEs differ
            z = model.features(x)
            u = model.projector(z)
            supcon = client.supcon(u, y)
            personal_ce = F.cross_entropy(model.personal_head(u), y)
            combined = client._combine(model.personal_head(u), model.head(z))
            combined_ce = F.cross_entropy(combined, y)
            loss = float(client._main_loss(model, x, y))
        assert float(personal_ce) != pytest.approx(float(combined_ce), rel=1e-3)
        expected = combined_ce if target == "combined" else personal_ce
        assert loss == pytest.approx(float(expected + supcon), rel=1e-5)
    # h_s is still frozen in stage 1
    client, model = make_client(**{"dualfed.personal-loss": "combined", "dualfed.combine": combine})
    before = snapshot(model, "head.")
    client.stage1(torch.Generator().manual_seed(0))
    assert changed(before, model) == set()


@pytest.mark.parametrize("combine", ["probabilities", "logits"])
def test_the_global_prior_moves_the_global_head_to_the_clients_labels(combine):
    """dualfed.global-prior=client: the combination uses h_s(z) + log(this client's training
    label frequencies, add-one smoothed); the paper's default uses h_s(z) as is."""
    skewed = torch.tensor([0] * 30 + [1] * 10 + [2] * 8)  # class 3 never seen
    client, _ = make_client(
        y_train=skewed, **{"dualfed.global-prior": "client", "dualfed.combine": combine}
    )
    paper, _ = make_client(y_train=skewed, **{"dualfed.combine": combine})
    log_prior = torch.tensor([31.0, 11.0, 9.0, 1.0]).div(52.0).log()
    personal, glob = torch.randn(5, 4), torch.randn(5, 4)

    def combined(g: torch.Tensor) -> torch.Tensor:
        if combine == "logits":
            return personal + g
        return torch.log((F.softmax(personal, 1) + F.softmax(g, 1)) / 2)

    torch.testing.assert_close(client._combine(personal, glob), combined(glob + log_prior))
    torch.testing.assert_close(paper._combine(personal, glob), combined(glob))
    with torch.no_grad():  # a global head that always says 3: the prior outvotes it
        client.model.head.weight.zero_()
        client.model.head.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 2.0]))
        client.model.personal_head.weight.zero_()
        client.model.personal_head.bias.zero_()
        z = torch.randn(6, client.model.feature_dim)
        assert (paper._combine(torch.zeros(6, 4), client.model.head(z)).argmax(1) == 3).all()
        m = client.model
        assert (client._combine(m.personal_logits(z), m.head(z)).argmax(1) == 0).all()


def test_labels_skewed_passes_sampling_noise_and_flags_a_label_skew():
    iid = torch.tensor([120.0, 118, 131, 109, 125, 117, 122, 114, 126, 118])  # chi2 = 3.0
    assert not labels_skewed(iid)
    assert labels_skewed(torch.tensor([300.0, 40, 0, 0, 5, 1, 0, 0, 0, 2]))  # Dirichlet-like
    # chi2 = 18.75 on 9 degrees of freedom: p = 0.027 flags at 5%, not at 1%
    mild = torch.tensor([150.0, 90, 135, 105, 120, 120, 120, 120, 120, 120])
    assert labels_skewed(mild) and not labels_skewed(mild, level=0.01)
    assert not labels_skewed(torch.zeros(10))  # a client without training labels


def test_the_default_prior_applies_only_to_a_client_whose_labels_are_skewed():
    """dualfed.global-prior=client-if-skewed: a skewed client moves h_s to its prior, a
    balanced one combines h_s as is; client applies it to both."""
    skewed = torch.tensor([0] * 30 + [1] * 10 + [2] * 8)
    balanced = torch.tensor([0] * 13 + [1] * 12 + [2] * 12 + [3] * 11)  # sampling noise
    personal, glob = torch.randn(5, 4), torch.randn(5, 4)
    for y, mode, moved in (
        (skewed, "client-if-skewed", True),
        (balanced, "client-if-skewed", False),
        (balanced, "client", True),
        (skewed, "none", False),
    ):
        client, _ = make_client(y_train=y, **{"dualfed.global-prior": mode})
        as_is = torch.log((F.softmax(personal, 1) + F.softmax(glob, 1)) / 2)
        got = client._combine(personal, glob)
        assert (not torch.allclose(got, as_is)) is moved, (mode, y.bincount())


def test_stage2_trains_only_the_global_head():
    client, model = make_client()
    client.stage1(torch.Generator().manual_seed(0))
    before = snapshot(model)
    client.stage2(torch.Generator().manual_seed(1))
    # encoder weights and BN statistics, projector and personal head: all unchanged
    assert changed(before, model) == {"head.weight", "head.bias"}


def test_stage2_runs_its_own_epochs_and_step(monkeypatch):
    """Stage 2 trains h_s for dualfed.global-head-epochs at dualfed.global-head-lr (not the run's lr)."""
    import methods.dualfed.client as dualfed

    seen = {}

    def spy(model, params, x, y, epochs, cfg, generator, *rest):
        seen.update(epochs=epochs, lr=cfg.lr, batch=cfg.batch_size, dim=x.dim())
        return 0.0

    client, _ = make_client()
    params = client.cfg.params.model_copy(update={"global_head_epochs": 7, "global_head_lr": 0.3})
    client.cfg = client.cfg.model_copy(update={"params": params})
    monkeypatch.setattr(dualfed, "train_epochs", spy)
    client.stage2(torch.Generator().manual_seed(1))
    assert seen == {"epochs": 7, "lr": 0.3, "batch": 16, "dim": 2}  # on z, not on images


def test_simultaneous_schedule_trains_everything():
    client, model = make_client("simultaneous")
    before = snapshot(model)
    metrics = client.local_train({}, torch.Generator().manual_seed(0))
    moved = changed(before, model)
    for prefix in ("features.", "projector.", "personal_head.", "head."):
        assert any(k.startswith(prefix) for k in moved), prefix
    assert "global-head-loss" not in metrics


def test_projector_personal_head_and_bn_stats_never_travel_but_survive():
    client, model = make_client()
    roles = client.roles
    stats = [k for k in model.state_dict() if k.endswith(("running_mean", "running_var"))]
    encoder_affine = "features.1.weight"  # the stem BatchNorm's scale
    assert stats and encoder_affine in roles.shared
    for name in roles.shared:
        assert not name.startswith(("projector.", "personal_head."))
        assert not name.endswith(("running_mean", "running_var", "num_batches_tracked"))
    assert set(stats) <= set(roles.personal)

    upload, _, _ = client.fit(client.get_parameters({}), {"server-round": 1})
    assert [a.shape for a in upload] == [model.state_dict()[n].shape for n in roles.shared]
    personal_after_fit = {n: client.store.state[n] for n in roles.personal}

    # a new global model arrives; the client's own projector/head/BN stats are restored
    foreign = [np.full_like(a, 0.5) for a in upload]
    set_arrays(model, roles.personal, [np.zeros_like(v) for v in personal_after_fit.values()])
    _, _, metrics = client.evaluate(foreign, {})
    for name, value in zip(roles.personal, get_arrays(model, roles.personal)):
        np.testing.assert_array_equal(value, personal_after_fit[name])
    for name, value in zip(roles.shared, get_arrays(model, roles.shared)):
        assert np.all(value == 0.5), name
    assert {"accuracy", "accuracy-global", "accuracy-personal"} <= set(metrics)


def test_score_reports_the_three_heads():
    client, model = make_client()
    with torch.no_grad():
        model.personal_head.weight.zero_()
        model.personal_head.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 100.0]))
    loss, metrics = client.score()
    assert metrics["accuracy-personal"] == pytest.approx(0.25)  # always predicts class 3
    assert metrics["accuracy"] == pytest.approx(0.25)  # the huge bias dominates the sum
    z = model.features.eval()(client.x_test)
    want_global = float((model.head(z).argmax(1) == client.y_test).float().mean())
    assert metrics["accuracy-global"] == pytest.approx(want_global)
    assert metrics["confidence-personal"] == pytest.approx(1.0)  # softmax of a 100 margin
    want = float(torch.softmax(model.head(z), 1).max(1).values.mean())
    assert metrics["confidence-global"] == pytest.approx(want)
    with torch.no_grad():  # the loss is the combined prediction's cross-entropy
        combined = client._combine(model.personal_logits(z), model.head(z))
    assert loss == pytest.approx(float(F.cross_entropy(combined, client.y_test)), rel=1e-5)


@pytest.mark.slow
def test_end_to_end_on_default_data(tmp_path):
    from pflower.engine.simulate import simulate

    results = simulate(
        {
            "method": "dualfed",
            "num-server-rounds": 2,
            "dualfed.supcon-lambda": 1.0,
            # the pipeline, not the paper's schedule: batch 256 is 2 steps an epoch here
            "lr": 0.05,
            "batch-size": 32,
            "output-dir": str(tmp_path),
            "run-name": "dualfed",
        },
        3,
    )
    rounds = results["rounds"]
    assert len(rounds) == 2
    last = rounds[-1]
    for key in ("accuracy_mean", "accuracy_global_mean", "accuracy_personal_mean"):
        assert 0.0 <= last[key] <= 1.0
    assert last["replies"] == 3 and not last["rejected"]
    # only the encoder and the global head travel: 100*200 + 200 + 200*2 + 2 float32 values
    shared_bytes = 4 * (100 * 200 + 200 + 200 * 2 + 2)
    assert shared_bytes * 3 <= last["bytes_up"] < shared_bytes * 3 * 1.1
    assert last["accuracy_mean"] > 0.6
