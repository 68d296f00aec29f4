"""Pretrained encoders: a weight file, torchvision's ImageNet weights (with a clear
offline fallback), ImageNet normalisation, and the config errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from benchmarks.presets import CIFAR10_DEV
from methods import get_method, parse_run_config
from pflower.config.schema import ConfigError
from pflower.data import data_info, load_client_data
from pflower.data.hf import IMAGENET_MEAN, IMAGENET_STD

DEV_PARQUET = str(CIFAR10_DEV)


@pytest.fixture(scope="module")
def weight_file(tmp_path_factory):
    from torchvision.models import resnet18

    torch.manual_seed(123)
    net = resnet18()
    path = tmp_path_factory.mktemp("weights") / "resnet18.pt"
    torch.save(net.state_dict(), path)
    return path, net.state_dict()


def _cfg(**over):
    base = {"dataset": DEV_PARQUET, "model": "resnet18", "partitioner": "iid", "method": "dualfed"}
    return parse_run_config({**base, **over})


def test_a_weight_file_is_loaded_into_the_encoder(weight_file):
    path, state = weight_file
    cfg = _cfg(**{"pretrained-weights": str(path)})
    model = get_method("dualfed").build_model(cfg, data_info(cfg))
    encoder = model.features[0]  # torchvision's ResNet-18, fc replaced by the head
    torch.testing.assert_close(encoder.conv1.weight, state["conv1.weight"])
    torch.testing.assert_close(encoder.layer4[1].bn2.running_var, state["layer4.1.bn2.running_var"])


def test_pretrained_weights_get_imagenet_normalisation(weight_file):
    path, _ = weight_file
    plain = load_client_data(_cfg(**{"test-per-client": 20}), 0, 50)
    pre = load_client_data(_cfg(**{"pretrained-weights": str(path), "test-per-client": 20}), 0, 50)
    np.testing.assert_array_equal(plain.y_train.numpy(), pre.y_train.numpy())
    # the same pixels, standardised with ImageNet's statistics instead of the data set's
    raw = pre.x_train.numpy() * IMAGENET_STD.reshape(1, 3, 1, 1) + IMAGENET_MEAN.reshape(1, 3, 1, 1)
    assert raw.min() >= -1e-4 and raw.max() <= 1 + 1e-4  # back in [0, 1]
    assert not np.allclose(plain.x_train.numpy(), pre.x_train.numpy())


def test_imagenet_offline_logs_one_clear_line_and_trains_from_random_init(monkeypatch, caplog):
    from torchvision.models import ResNet18_Weights

    def offline(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(type(ResNet18_Weights.IMAGENET1K_V1), "get_state_dict", offline)
    cfg = _cfg(**{"pretrained-weights": "imagenet"})
    with caplog.at_level(logging.WARNING, logger="flwr.pflower"):
        model = get_method("dualfed").build_model(cfg, data_info(cfg))
    lines = [r.getMessage() for r in caplog.records if "ImageNet weights unavailable" in r.message]
    assert len(lines) == 1 and "RANDOM INIT" in lines[0] and "Network is unreachable" in lines[0]
    assert torch.isfinite(model(torch.zeros(2, 3, 32, 32))).all()


@pytest.mark.parametrize(
    "over, message",
    [
        ({"model": "cnn4", "pretrained-weights": "imagenet"}, "only model 'resnet18'"),
        ({"pretrained-weights": "/no/such/file.pt"}, "no weight file"),
    ],
)
def test_weights_a_model_cannot_use_are_config_errors(over, message):
    with pytest.raises(ConfigError, match=f"'pretrained-weights'.*{message}"):
        _cfg(**over)


def test_a_file_that_is_not_resnet18_weights_is_a_clear_error(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"conv1.weight": torch.zeros(3)}, path)
    cfg = _cfg(**{"pretrained-weights": str(path)})
    with pytest.raises(ValueError, match="'pretrained-weights'.*not a ResNet-18 state_dict"):
        get_method("dualfed").build_model(cfg, data_info(cfg))
