"""Backbones. Every model exposes ``features`` (input -> D-dim vector) and
``head`` (D -> classes); ``forward`` is ``head(features(x))``. Methods rely on
the ``features.`` / ``head.`` name prefixes to split tensors."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger("flwr.pflower")


class Backbone(nn.Module):
    """A feature extractor and a linear head."""

    features: nn.Module
    head: nn.Linear

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class ChannelsLastOnCPU(nn.Sequential):
    """A Sequential that takes an image batch in channels-last memory on a CPU: the
    same layers and numbers up to float rounding, faster where oneDNN's pooling and
    convolutions vectorize over channels. Measured (python -m benchmarks.studies.channels_last,
    one thread, batches of 16): CNN4 1.45x a training step and 2.3x evaluation; the
    ResNets train no faster (0.89x, 0.98x), so only CNN4 uses it. On a GPU the input
    is left as it is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4 and x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        return super().forward(x)


class LogReg(Backbone):
    """Logistic regression: no feature layer (the inputs are the features), a linear
    head (softmax over the classes; with two, the usual logistic model)."""

    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Flatten()
        self.head = nn.Linear(in_dim, num_classes)


class MLP(Backbone):
    """One hidden layer (the FedFac simulation study uses m = 200)."""

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(in_dim, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)


class CNN4(Backbone):
    """FedCP's 4-layer CNN: two conv5x5+ReLU+maxpool blocks, Linear(->512)+ReLU, fc."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, dim: int = 512) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        self.features = ChannelsLastOnCPU(
            nn.Conv2d(in_channels, 32, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * side * side, dim),
            nn.ReLU(),
        )
        self.head = nn.Linear(dim, num_classes)


class SmallResNet(Backbone):
    """FedDecomp's ResNet-8 / ResNet-10: a 7x7 stride-2 stem with max-pool (as the
    reference), then one torchvision BasicBlock per stage."""

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...]) -> None:
        # torchvision is imported where it is used: importing it costs a deployed
        # ClientApp (one process per message) a large share of its start-up
        from torchvision.models.resnet import BasicBlock

        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        prev = widths[0]
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or prev != width:
                down = nn.Sequential(
                    nn.Conv2d(prev, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width)
                )
            layers.append(BasicBlock(prev, width, stride=stride, downsample=down))
            prev = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(prev, num_classes)


class Residual(nn.Module):
    """``x + body(x)``: a residual block whose body keeps the shape."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def conv_bn(
    cin: int, cout: int, kernel: int = 3, stride: int = 1, padding: int = 1
) -> nn.Sequential:
    """A bias-free conv, BatchNorm, ReLU: every conv of the ResNet-9 is one."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class ResNet9(Backbone):
    """Factorized-FL's ResNet-9 as its authors built it (wyjeong/Factorized-FL,
    modules/nets.py:23-62): BatchNorm after every conv, two residual blocks, a
    global max-pool, a 256 -> classes head. ``features`` is laid out as their
    ``encoder`` (``features.6`` is their ``encoder.6``, the conv whose v they match
    clients by). 2.57M weights; u + v 0.27M when factorized at rank 1 (the paper's
    counts; tests/test_resnet9.py)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(in_channels, 64),
            conv_bn(64, 128, kernel=5, stride=2, padding=2),
            Residual(conv_bn(128, 128), conv_bn(128, 128)),
            conv_bn(128, 256),
            nn.MaxPool2d(2),
            Residual(conv_bn(256, 256), conv_bn(256, 256)),
            conv_bn(256, 256, padding=0),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(256, num_classes)


def _load_imagenet(net: nn.Module) -> None:
    """torchvision's ImageNet weights (downloaded, or from torch's hub cache);
    offline, the random init is kept and the log says so."""
    from torchvision.models import ResNet18_Weights

    try:
        net.load_state_dict(ResNet18_Weights.IMAGENET1K_V1.get_state_dict(progress=False))
        log.info("resnet18: loaded torchvision's ImageNet weights")
    except Exception as err:  # noqa: BLE001 - offline or blocked: any failure means the same
        log.warning(
            "resnet18: ImageNet weights unavailable (%s: %s); using RANDOM INIT. Pass a local "
            "weight file as 'pretrained-weights' to use pretrained weights offline.",
            type(err).__name__,
            err,
        )


def imagenet_weights_problem() -> str | None:
    """Why torchvision's ImageNet weights for ResNet-18 cannot be had (not in torch's
    hub cache, and their download host does not resolve), or None."""
    import socket
    from urllib.parse import urlparse

    from torchvision.models import ResNet18_Weights

    url = ResNet18_Weights.IMAGENET1K_V1.url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name
    if cached.is_file():
        return None
    host = urlparse(url).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
        return None
    except OSError:
        return (
            f"'imagenet' needs torchvision's ResNet-18 weights, which are not cached "
            f"({cached}) and {host} cannot be reached: the run would train from random "
            "init. Give a local file (a ResNet-18 state_dict saved with torch.save)"
        )


class ResNet18(Backbone):
    """torchvision's ResNet-18 (so ImageNet weights load), fc as the head."""

    def __init__(self, in_channels: int, num_classes: int, weights_path: str = "") -> None:
        from torchvision.models import resnet18 as tv_resnet18

        super().__init__()
        net = tv_resnet18()
        if weights_path == "imagenet":
            _load_imagenet(net)
        elif weights_path:
            try:
                net.load_state_dict(torch.load(weights_path, map_location="cpu", weights_only=True))
            except (RuntimeError, OSError, ValueError) as err:
                raise ValueError(
                    f"config key 'pretrained-weights': {weights_path} is not a ResNet-18 "
                    f"state_dict ({type(err).__name__}: {str(err).splitlines()[0]})"
                ) from err
            log.info("resnet18: loaded pretrained weights from %s", weights_path)
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        dim = net.fc.in_features
        net.fc = nn.Identity()
        self.features = nn.Sequential(net, nn.Flatten())
        self.head = nn.Linear(dim, num_classes)


MODEL_NAMES = ("logreg", "mlp", "cnn4", "resnet8", "resnet9", "resnet10", "resnet18")


def build_backbone(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: int = 200,
    weights_path: str = "",
) -> Backbone:
    """Build a backbone for inputs of ``input_shape`` (without batch dim)."""
    if name in ("mlp", "logreg"):
        in_dim = 1
        for s in input_shape:
            in_dim *= s
        return MLP(in_dim, num_classes, hidden) if name == "mlp" else LogReg(in_dim, num_classes)
    if len(input_shape) != 3:
        raise ValueError(f"model '{name}' needs image inputs (C, H, W), got shape {input_shape}")
    channels, size = input_shape[0], input_shape[1]
    if name == "cnn4":
        return CNN4(channels, size, num_classes)
    if name == "resnet8":
        return SmallResNet(channels, num_classes, (64, 128, 256))
    if name == "resnet9":
        return ResNet9(channels, num_classes)
    if name == "resnet10":
        return SmallResNet(channels, num_classes, (64, 128, 256, 512))
    if name == "resnet18":
        return ResNet18(channels, num_classes, weights_path)
    raise ValueError(f"unknown model '{name}', expected one of {MODEL_NAMES}")
