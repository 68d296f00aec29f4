"""A method's strategy: its package's ``STRATEGIES`` entry (methods/__init__.py),
else the base's, built with the wire and initial shared tensors of ``model``."""

from __future__ import annotations

from torch import nn

from methods import Method, side_table
from models.roles import get_arrays
from pflower.config.schema import RunConfig
from pflower.results import RunRecorder
from strategies.base import PFLStrategy


def strategy_class(method: Method) -> type[PFLStrategy]:
    """The class of ``method``'s server side."""
    return side_table(method.package, "strategy").get(method.name, PFLStrategy)


def build_method_strategy(
    method: Method, cfg: RunConfig, model: nn.Module, recorder: RunRecorder | None = None
) -> PFLStrategy:
    """``method``'s strategy of ``model``, recording to ``recorder``."""
    roles = method.roles(model, cfg)
    wire = method.build_wire(model, roles, cfg)
    return strategy_class(method)(
        cfg=cfg,
        spec=wire.spec,
        initial=get_arrays(model, roles.shared),
        model=model,
        recorder=recorder,
        default_aggregation=method.aggregation,
        wire=wire,
        holds_replies=method.per_client,
        means=method.means,
        bounds_updates=method.bounds_updates,
    )
