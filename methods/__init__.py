"""The method registry. A method is one package under methods/ whose ``__init__``
is its card: ``METHODS``, a tuple of ``Method`` rows, each naming its own run-config
keys (a ``MethodParams``), its paper's local schedule (the ``auto`` values), its
aggregation rule and what its protocol reveals beyond the shared tensors. The card
imports no torch: the pre-flight reads every card in well under a second.

Its code lives beside the card, one module per side, each with a table from the
method's name to that code, imported directly (no code named in a string; the
registry finds a side module by its name, as it finds the cards):

* ``model.py``, ``MODEL_SIDES``: the **split rule** (which of the model's tensors
  are personal), the model transform and check, the wire; built alike on both sides;
* ``client.py``, ``CLIENTS``: the **local schedule** (a ``PFLClient``; default the base's);
* ``strategy.py``, ``STRATEGIES``: the **aggregation** (a ``PFLStrategy``; default the base's).

The registry finds the packages itself: adding a method is adding a package. A
client process imports only the ``client`` and ``model`` sides, the server only the
``strategy`` and ``model`` sides (the import contracts in pyproject.toml hold the
code to that).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from pflower.config.params import MethodParams, NoParams
from pflower.config.schema import ConfigError, RunConfig
from pflower.config.schema import parse_run_config as _parse
from pflower.config.weighting import MeanPart
from pflower.privacy.disclosure import METRICS, Disclosure, DisclosureKind

if TYPE_CHECKING:
    from torch import nn

    from models.roles import Roles, SplitRule
    from models.wire import Wire
    from pflower.data import DataInfo

Disclosures = Callable[[RunConfig], tuple[Disclosure, ...]]

# a method package's side modules and the table in each, by method name
SIDES = {
    "model": "MODEL_SIDES",
    "client": "CLIENTS",
    "strategy": "STRATEGIES",
    "attacks": "ATTACKS",
}


@dataclass(frozen=True)
class ModelSide:
    """A method's model, built alike on the server and on every client."""

    # (model) or (model, run config) -> its personal state_dict entries, or a models.roles.Split
    split: SplitRule
    transform: Callable[[nn.Module, RunConfig], nn.Module] | None = None  # backbone -> model
    check: Callable[[nn.Module, RunConfig], None] | None = None  # ConfigError for unusable keys
    wire: type[Wire] | None = None  # how the shared tensors travel; None: models/wire.py's


def side_table(package: str, side: str) -> dict[str, Any]:
    """The table of ``package``'s ``side`` module (see ``SIDES``); empty without one."""
    module = f"{package}.{side}"
    if importlib.util.find_spec(module) is None:
        return {}
    return getattr(importlib.import_module(module), SIDES[side])


def method_attacks(method: Method) -> dict[str, Any]:
    """The attacks on ``method``'s own machinery, by name: its package's ``ATTACKS``
    entry (``attacks.py``; client_app/attacks.py runs them), empty without one."""
    return side_table(method.package, "attacks").get(method.name, {})


def shared_tensors_only(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """The split's promise, kept: nothing leaves but the shared tensors."""
    return ()


@dataclass(frozen=True)
class Method:
    """A personalised-FL method's card: its keys, schedule, aggregation rule and
    disclosures; its code is in its package's side modules (``SIDES``)."""

    name: str
    aggregation: str = "weighted"  # the strategy's rule unless the config sets one
    params: type[MethodParams] = NoParams  # its own run-config keys
    # its paper's local schedule and other common auto values (raw config -> values)
    schedule: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda raw: {})
    # what the protocol reveals beyond the shared tensors (pflower/privacy/disclosure.py)
    disclosures: Disclosures = shared_tensors_only
    # the kinds of those disclosures, declared here (a site's policy accepts them by name)
    disclosure_kinds: tuple[DisclosureKind, ...] = ()
    # why the method has no mean of one global state (so no SecAgg+, DP or robust rule)
    per_client: str = ""
    # its name in PFLlib d832e76 (system/main.py's -algo): it then has profile='pfllib'
    pfllib: str = ""
    # its mean in parts, each with its own weights and server step (SCAFFOLD's model and
    # control variate); empty: every shared array by ``aggregation``, taken as it is
    means: tuple[MeanPart, ...] = ()
    # False: the shared arrays are statistics averaged afresh each round (FedProto's
    # prototype sums and counts), not a model a reply moves: the update-norm bound and
    # the direction check, which measure a reply against the last global arrays, skip
    # them (strategies/robust.py Bounds.of); the weight cap and value checks stay
    bounds_updates: bool = True
    # the attacks on its own machinery it may be run with (its package's attacks.py, ATTACKS)
    attacks: tuple[str, ...] = ()
    # configs beyond its defaults that change what it discloses (the PRIVACY.md table's rows)
    disclosure_modes: tuple[dict[str, Any], ...] = ()
    package: str = ""  # the package whose card this is (the registry fills it in)

    # ---- the config's view (pflower.config.params.MethodSpec) ------------------------------------

    def defaults(self, raw: dict[str, Any]) -> dict[str, Any]:
        return self.schedule(raw)

    # ---- the runtime's view (imports torch) -------------------------------------------------

    @property
    def model_side(self) -> ModelSide:
        side = side_table(self.package, "model").get(self.name)
        if side is None:
            raise LookupError(f"{self.package}.model has no MODEL_SIDES entry for '{self.name}'")
        return side

    def build_model(self, cfg: RunConfig, info: DataInfo) -> nn.Module:
        """The method's model, identical on server and every client (seeded)."""
        import torch

        from models.backbones import build_backbone

        torch.manual_seed(cfg.seed)
        model: nn.Module = build_backbone(
            cfg.model, info.input_shape, info.num_classes, cfg.hidden_dim, cfg.pretrained_weights
        )
        side = self.model_side
        if side.transform is not None:
            model = side.transform(model, cfg)
        if side.check is not None:
            side.check(model, cfg)
        return model

    def roles(self, model: nn.Module, cfg: RunConfig) -> Roles:
        """The shared and personal entries of ``model`` (``cfg``: the run config, which
        a split rule may read)."""
        from models.roles import Roles

        return Roles.of(model, self.model_side.split, cfg)

    def build_wire(self, model: nn.Module, roles: Roles, cfg: RunConfig) -> Wire:
        """The method's wire, built alike on the server and on every client."""
        from models.wire import Wire

        wire = (self.model_side.wire or Wire)(model, roles, cfg)
        if cfg.attack in self.attacks:  # a simulated attacker of its own machinery may run
            wire.attacks = method_attacks(self)
        return wire


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
            out[method.name] = replace(method, package=card.__name__)
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
    "MeanPart",
    "Method",
    "foreign_keys",
    "get_method",
    "method_names",
    "parse_run_config",
]
