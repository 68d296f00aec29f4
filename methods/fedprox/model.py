"""FedProx's model: the backbone, every tensor shared (FedAvg's split)."""

from __future__ import annotations

from methods import ModelSide
from models.roles import nothing_personal

MODEL_SIDES = {"fedprox": ModelSide(nothing_personal)}
