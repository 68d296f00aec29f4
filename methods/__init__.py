"""The method registry: one table from the ``method`` config value to
(split rule, local schedule = client class, aggregation = strategy class and
rule, model transform, disclosures beyond the shared tensors). Method modules are imported lazily, and each names its
client and strategy classes as ``"module:Class"``: a client process never
imports the server's strategies, nor the server the clients' schedules (the
import contracts in pyproject.toml hold the code to that)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from models.backbones import build_backbone
from models.roles import Roles, SplitRule, get_arrays, wire_spec
from pfl_data import DataInfo
from pfl_privacy.disclosure import Disclosure
from run_config.schema import METHODS, RunConfig

if TYPE_CHECKING:
    from client_app.base import PFLClient
    from run_results import RunRecorder
    from strategies.base import PFLStrategy

BASE_CLIENT = "client_app.base:PFLClient"
BASE_STRATEGY = "strategies.base:PFLStrategy"


def resolve(ref: str) -> Any:
    """The object named by ``"package.module:Name"``."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


Transform = Callable[[nn.Module, RunConfig], nn.Module]
ModelCheck = Callable[[nn.Module, RunConfig], None]
Disclosures = Callable[[RunConfig], tuple[Disclosure, ...]]


def shared_tensors_only(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """The split's promise, kept: nothing leaves but the shared tensors."""
    return ()


@dataclass(frozen=True)
class Method:
    """A personalised-FL method: which tensors are personal, how a client
    trains, how the server aggregates."""

    name: str
    split: SplitRule
    client_ref: str = BASE_CLIENT  # the local schedule
    strategy_ref: str = BASE_STRATEGY  # the server side
    aggregation: str = "weighted"  # the strategy's rule unless the config sets one
    transform: Transform | None = None
    check: ModelCheck | None = None  # raises ConfigError for keys the model cannot use
    # what the protocol reveals beyond the shared tensors (pfl_privacy/disclosure.py)
    disclosures: Disclosures = shared_tensors_only

    @property
    def client(self) -> type[PFLClient]:
        return resolve(self.client_ref)

    @property
    def strategy(self) -> type[PFLStrategy]:
        return resolve(self.strategy_ref)

    def build_model(self, cfg: RunConfig, info: DataInfo) -> nn.Module:
        """The method's model, identical on server and every client (seeded)."""
        torch.manual_seed(cfg.seed)
        model: nn.Module = build_backbone(
            cfg.model, info.input_shape, info.num_classes, cfg.hidden_dim, cfg.pretrained_weights
        )
        if self.transform is not None:
            model = self.transform(model, cfg)
        if self.check is not None:
            self.check(model, cfg)
        return model

    def roles(self, model: nn.Module) -> Roles:
        return Roles.of(model, self.split)

    def build_strategy(
        self, cfg: RunConfig, model: nn.Module, recorder: RunRecorder | None = None
    ) -> PFLStrategy:
        """The server side: wire spec and initial shared tensors from ``model``."""
        shared = self.roles(model).shared
        return self.strategy(
            cfg=cfg,
            spec=wire_spec(model, shared),
            initial=get_arrays(model, shared),
            model=model,
            recorder=recorder,
            default_aggregation=self.aggregation,
        )


# method name -> module defining METHODS: dict[str, Method]
_MODULES = {
    "fedavg": "methods.baselines",
    "fedavg-ft": "methods.baselines",
    "local": "methods.baselines",
    "fedper": "methods.baselines",
    "fedrep": "methods.baselines",
    "fedbn": "methods.baselines",
    "feddecomp": "methods.feddecomp",
    "fedcp": "methods.fedcp",
    "factorized-fl-alpha": "methods.factorized_fl",
    "factorized-fl-beta": "methods.factorized_fl",
    "fedfac-static": "methods.fedfac",
    "fedfac-dynamic": "methods.fedfac",
    "dualfed": "methods.dualfed",
}
assert set(_MODULES) == set(METHODS)


def get_method(name: str) -> Method:
    """The registered method called ``name``."""
    if name not in _MODULES:
        raise ValueError(f"unknown method '{name}', expected one of {sorted(_MODULES)}")
    try:
        module = importlib.import_module(_MODULES[name])
    except ModuleNotFoundError as err:
        raise NotImplementedError(f"method '{name}' is not available: {err}") from err
    return module.METHODS[name]
