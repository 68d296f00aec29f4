"""The method registry. A method is one package under methods/ whose ``__init__``
is its card: ``METHODS``, a tuple of ``Method`` rows, each naming

* its **split rule** (which of the model's tensors are personal),
* its **local schedule** (the client class) and its **aggregation** (the strategy
  class and its rule),
* its model transform and model check, its own run-config keys (a
  ``MethodParams``), its paper's local schedule (the ``auto`` values), and what its
  protocol reveals beyond the shared tensors.

The registry finds the packages itself: adding a method is adding a package. A card
names code as ``"package.module:name"`` and imports no torch: the pre-flight reads
every card in well under a second, a client process never imports the server's
strategies, nor the server the clients' schedules (the import contracts in
pyproject.toml hold the code to that).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from pflower.config.params import MethodParams, NoParams
from pflower.config.schema import ConfigError, RunConfig
from pflower.config.schema import parse_run_config as _parse
from pflower.privacy.disclosure import METRICS, Disclosure, DisclosureKind

if TYPE_CHECKING:
    import torch
    from torch import nn

    from client_app.base import PFLClient
    from client_app.state import PersonalStore
    from models.roles import Roles
    from models.wire import Wire
    from pflower.data import ClientData, DataInfo
    from pflower.results import RunRecorder
    from strategies.base import PFLStrategy

BASE_CLIENT = "client_app.base:PFLClient"
BASE_STRATEGY = "strategies.base:PFLStrategy"

Disclosures = Callable[[RunConfig], tuple[Disclosure, ...]]


def resolve(ref: str) -> Any:
    """The object named by ``"package.module:Name"``."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def shared_tensors_only(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """The split's promise, kept: nothing leaves but the shared tensors."""
    return ()


@dataclass(frozen=True)
class Method:
    """A personalised-FL method: which tensors are personal, how a client trains,
    how the server aggregates; code named by reference (``"module:name"``)."""

    name: str
    split: str  # -> models.roles.SplitRule
    client_ref: str = BASE_CLIENT  # the local schedule
    strategy_ref: str = BASE_STRATEGY  # the server side
    aggregation: str = "weighted"  # the strategy's rule unless the config sets one
    transform: str = ""  # -> (model, cfg) -> model
    check: str = ""  # -> (model, cfg) -> None, ConfigError for keys the model cannot use
    wire: str = "models.wire:Wire"  # how the shared tensors travel (models/wire.py)
    params: type[MethodParams] = NoParams  # its own run-config keys
    # its paper's local schedule and other common auto values (raw config -> values)
    schedule: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda raw: {})
    # what the protocol reveals beyond the shared tensors (pflower/privacy/disclosure.py)
    disclosures: Disclosures = shared_tensors_only
    # the kinds of those disclosures, declared here (a site's policy accepts them by name)
    disclosure_kinds: tuple[DisclosureKind, ...] = ()
    # why the method has no mean of one global state (so no SecAgg+, DP or robust rule)
    per_client: str = ""
    # the attacks on its own machinery (pflower.config.schema.METHOD_ATTACKS) it may be run with
    attacks: tuple[str, ...] = ()
    # configs beyond its defaults that change what it discloses (the PRIVACY.md table's rows)
    disclosure_modes: tuple[dict[str, Any], ...] = ()

    # ---- the config's view (pflower.config.params.MethodSpec) ------------------------------------

    def defaults(self, raw: dict[str, Any]) -> dict[str, Any]:
        return self.schedule(raw)

    # ---- the runtime's view (imports torch) -------------------------------------------------

    @property
    def client(self) -> type[PFLClient]:
        return resolve(self.client_ref)

    @property
    def strategy(self) -> type[PFLStrategy]:
        return resolve(self.strategy_ref)

    def build_model(self, cfg: RunConfig, info: DataInfo) -> nn.Module:
        """The method's model, identical on server and every client (seeded)."""
        import torch

        from models.backbones import build_backbone

        torch.manual_seed(cfg.seed)
        model: nn.Module = build_backbone(
            cfg.model, info.input_shape, info.num_classes, cfg.hidden_dim, cfg.pretrained_weights
        )
        if self.transform:
            model = resolve(self.transform)(model, cfg)
        if self.check:
            resolve(self.check)(model, cfg)
        return model

    def roles(self, model: nn.Module) -> Roles:
        from models.roles import Roles

        return Roles.of(model, resolve(self.split))

    def build_wire(self, model: nn.Module, roles: Roles, cfg: RunConfig) -> Wire:
        """The method's wire, built alike on the server and on every client."""
        return resolve(self.wire)(model, roles, cfg)

    def build_client(
        self,
        model: nn.Module,
        data: ClientData,
        cfg: RunConfig,
        store: PersonalStore,
        device: torch.device,
        client_key: str,
    ) -> PFLClient:
        """The client side: ``model`` on ``device``, its roles and its wire built as
        the server builds them."""
        model = model.to(device)
        roles = self.roles(model)
        wire = self.build_wire(model, roles, cfg)
        return self.client(model, roles, data, cfg, store, device, client_key, wire)

    def build_strategy(
        self, cfg: RunConfig, model: nn.Module, recorder: RunRecorder | None = None
    ) -> PFLStrategy:
        """The server side: its wire and initial shared tensors from ``model``."""
        from models.roles import get_arrays

        roles = self.roles(model)
        wire = self.build_wire(model, roles, cfg)
        return self.strategy(
            cfg=cfg,
            spec=wire.spec,
            initial=get_arrays(model, roles.shared),
            model=model,
            recorder=recorder,
            default_aggregation=self.aggregation,
            wire=wire,
        )


@cache
def registry() -> dict[str, Method]:
    """Every method of every package under methods/, by name."""
    out: dict[str, Method] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        card = importlib.import_module(f"{__name__}.{info.name}")
        for method in getattr(card, "METHODS", ()):
            if method.name in out:
                raise ValueError(f"method '{method.name}' is registered twice")
            out[method.name] = method
    return out


def disclosure_kinds() -> dict[str, DisclosureKind]:
    """Every disclosure kind a site's policy can accept, by name: the metadata every
    reply carries, and the kinds the methods declare on their cards."""
    kinds = {METRICS.name: METRICS}
    for method in registry().values():
        for kind in method.disclosure_kinds:
            if kinds.setdefault(kind.name, kind) != kind:
                raise ValueError(f"disclosure kind '{kind.name}' is declared twice, differently")
    return kinds


def method_names() -> tuple[str, ...]:
    """The registered methods, baselines first, in their packages' order."""
    return tuple(registry())


def get_method(name: str) -> Method:
    """The registered method called ``name``."""
    methods = registry()
    if name not in methods:
        raise ValueError(f"unknown method '{name}', expected one of {sorted(methods)}")
    return methods[name]


def foreign_keys(methods: Iterable[str], keys: Iterable[str]) -> list[str]:
    """One message for each namespaced key (``fedcp.mmd-lambda``) that none of
    ``methods`` reads: it would be accepted and do nothing. The message names the
    methods that own it."""
    reg, methods = registry(), list(methods)
    owners: dict[str, list[str]] = {}
    for name, m in reg.items():
        owners.setdefault(m.params.namespace, []).append(name)
    wanted = {reg[m].params.namespace for m in methods if m in reg}
    out = []
    for key in keys:
        ns = key.partition(".")[0] if "." in key else ""
        if ns and ns in owners and ns not in wanted:
            runs = ", ".join(f"'{m}'" for m in methods)
            out.append(
                f"config key '{key}' belongs to {' / '.join(owners[ns])}, not to {runs}: "
                f"it would do nothing (remove it, or set method='{owners[ns][0]}')"
            )
    return out


def parse_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """The validated run config for a registered method (ConfigError naming every bad
    key), parsed once per distinct config in a process: a ClientApp's mods and its
    client read the same object, and ``auto`` resolves once."""
    try:
        key = tuple(sorted(raw.items()))
        hash(key)
    except TypeError:  # an unhashable value: validation will name it
        return _parse(raw, registry())
    return _parse_cached(key)


@lru_cache(maxsize=32)
def _parse_cached(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return _parse(dict(items), registry())


__all__ = [
    "ConfigError",
    "Method",
    "foreign_keys",
    "get_method",
    "method_names",
    "parse_run_config",
]
