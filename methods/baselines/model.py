"""The baselines' split rules: which tensors stay personal (models/roles.py)."""

from __future__ import annotations

from methods import ModelSide
from models.roles import bn_personal, everything_personal, head_personal, nothing_personal

MODEL_SIDES = {
    "fedavg": ModelSide(nothing_personal),
    "fedavg-ft": ModelSide(nothing_personal),  # fine-tuned locally before each evaluation
    "local": ModelSide(everything_personal),
    "fedper": ModelSide(head_personal),
    "fedrep": ModelSide(head_personal),
    "fedbn": ModelSide(bn_personal),
}
