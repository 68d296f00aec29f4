"""LG-FedAvg's split: the complement of FedPer's (models/roles.py ``head_personal``),
so that both read the head's names off the same rule for every backbone."""

from __future__ import annotations

from torch import nn

from methods import ModelSide
from models.roles import head_personal
from pflower.config.schema import ConfigError, RunConfig


def body_personal(model: nn.Module) -> set[str]:
    """The split rule: every entry but the head's stays home (BatchNorm's running
    statistics included, as they belong to the local representation)."""
    return set(model.state_dict()) - head_personal(model)


def check_body(model: nn.Module, cfg: RunConfig) -> None:
    """A backbone without a body of its own (logreg: the inputs are the features)
    would leave nothing personal, and LG-FedAvg would be FedAvg under another name."""
    if not body_personal(model):
        raise ConfigError(
            f"config key 'model': '{cfg.model}' has no feature layers, so LG-FedAvg would "
            "keep nothing personal (it would run FedAvg); pick a backbone with a body "
            "(mlp, cnn4, a resnet)"
        )


MODEL_SIDES = {"lg-fedavg": ModelSide(body_personal, check=check_body)}
