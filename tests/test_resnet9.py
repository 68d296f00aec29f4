"""The ResNet-9 of Factorized-FL's authors: its layout, its size against the paper's
counts, and that every method builds on it and takes a batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from methods import get_method, method_names, parse_run_config
from methods.factorized_fl.model import MU, U, V, factorized_layers, matching_layer
from models.backbones import build_backbone
from pflower.data import DataInfo
from tests.helpers import raw_config

CIFAR = DataInfo((3, 32, 32), 10)


def test_resnet9_has_batchnorm_after_every_conv_and_the_papers_size() -> None:
    model = build_backbone("resnet9", (3, 32, 32), 10)
    modules = list(model.modules())
    convs = [i for i, m in enumerate(modules) if isinstance(m, nn.Conv2d)]
    assert len(convs) == 8
    assert all(isinstance(modules[i + 1], nn.BatchNorm2d) for i in convs)
    assert all(m.bias is None for m in modules if isinstance(m, nn.Conv2d))
    weights = sum(m.weight.numel() for m in modules if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert round(weights / 1e6, 2) == 2.57  # the paper: "the regular kernel model (2.574M)"
    # 2.574M is every float the model holds: weights, BN affine and running statistics
    floats = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    assert round(floats / 1e6, 3) == 2.574
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_factorized_resnet9_uv_is_the_papers_0_27m_and_matches_on_the_last_conv() -> None:
    cfg = parse_run_config(raw_config(method="factorized-fl-beta", model="resnet9"))
    model = get_method(cfg.method).build_model(cfg, CIFAR)
    state = model.state_dict()
    layers = factorized_layers(model)
    assert len(layers) == 9  # 8 convs and the head
    uv = sum(state[n + s].numel() for n in layers for s in (U, V))
    assert round(uv / 1e6, 2) == 0.27  # "With only U and V ... (0.27M)"
    mu = sum(state[n + MU].numel() for n in layers)
    assert mu == sum(
        m.weight.numel()
        for m in build_backbone("resnet9", (3, 32, 32), 10).modules()
        if isinstance(m, (nn.Conv2d, nn.Linear))
    )
    # the authors match clients by the v of encoder.6, the last conv
    assert matching_layer(model) == "features.6.0"


@pytest.mark.parametrize("method", method_names())
def test_every_method_builds_on_resnet9_and_takes_a_batch(method: str) -> None:
    cfg = parse_run_config(raw_config(method=method, model="resnet9", dataset="images.parquet"))
    m = get_method(method)
    model = m.build_model(cfg, CIFAR)
    roles = m.roles(model, cfg)
    assert roles.shared or method == "local"
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
