"""FedBABU's model: the backbone as it is. The split keeps the head (``head.*``) home:
it is the seeded random head every client and the server build alike, and it is
never trained during the federation, so it need not travel."""

from __future__ import annotations

from torch import nn

from methods import ModelSide
from models.roles import head_personal
from pflower.config.schema import ConfigError, RunConfig


def check_body(model: nn.Module, cfg: RunConfig) -> None:
    """ConfigError naming 'model' where the backbone has no body to train: FedBABU
    trains nothing but the body, so on such a model the federation would do nothing."""
    head = head_personal(model)
    if not any(name not in head for name, _ in model.named_parameters()):
        raise ConfigError(
            f"config key 'model': '{cfg.model}' has no parameters outside its head, and "
            "FedBABU trains only the body (the head stays at its initialisation); "
            "use a model with a feature extractor (mlp, cnn4, a resnet)"
        )


MODEL_SIDES = {"fedbabu": ModelSide(head_personal, check=check_body)}
