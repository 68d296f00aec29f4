"""FedRoD (methods/fedrod): its split, its two losses, and a short federation with
``method='fedrod'`` alone (the seventh method, added in three files: #47)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import parameters_to_ndarrays

from methods.fedrod.client import balanced_softmax
from tests.helpers import config, make_client, make_strategy, short_federation


def test_only_the_personal_head_stays_home() -> None:
    cfg = config(method="fedrod")
    client, _ = make_client(cfg)
    assert set(client.roles.personal) == {"personal_head.weight", "personal_head.bias"}
    upload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    assert len(upload) == len(client.roles.shared)  # body and generic head only


def test_the_balanced_softmax_shifts_the_logits_by_the_label_prior() -> None:
    logits, y = torch.zeros(4, 3), torch.tensor([0, 0, 0, 1])
    prior = torch.log(torch.tensor([0.75, 0.25, 0.0]) + 1e-8)
    assert torch.isclose(balanced_softmax(logits, y, prior), F.cross_entropy(prior.expand(4, 3), y))
    # copying the site's prior helps plain cross-entropy and costs under the balanced loss
    matched = prior.expand(4, 3).clone()
    assert balanced_softmax(logits, y, prior) < balanced_softmax(matched, y, prior)
    assert F.cross_entropy(matched, y) < F.cross_entropy(logits, y)


def test_local_training_moves_the_personal_head_and_keeps_the_generic_prediction_apart() -> None:
    cfg = config(method="fedrod", **{"local-epochs": 2})
    client, _ = make_client(cfg)
    model = client.model
    assert torch.count_nonzero(model.personal_head.weight) == 0  # starts as the generic model
    client.fit(parameters_to_ndarrays(make_strategy(cfg).global_payload()), {"server-round": 1})
    assert torch.count_nonzero(model.personal_head.weight) > 0
    x = client.x_test[:16]
    generic, personal = model.both(x)
    assert not torch.allclose(model(x), generic)
    assert torch.allclose(model(x), generic + personal, atol=1e-6)


def test_a_short_federation_runs_with_the_method_name_alone(tmp_path) -> None:
    res = short_federation("fedrod", tmp_path)
    assert np.isfinite(res["final_accuracy_mean"])
