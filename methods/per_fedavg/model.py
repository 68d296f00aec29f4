"""Per-FedAvg's model: the backbone as it is, every entry shared (the personal model is
the global one after one local step, made afresh at each evaluation)."""

from __future__ import annotations

from methods import ModelSide
from models.roles import nothing_personal

MODEL_SIDES = {"per-fedavg": ModelSide(nothing_personal)}
