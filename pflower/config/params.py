"""What a method's package gives the config: its own keys (a ``MethodParams``), the
``auto`` values of its keys and of the common schedule keys, and why it cannot
take a mean-only feature (secure aggregation, DP, robust rules).

A method's keys are namespaced in the run config, ``<namespace>.<key>`` (the
flattened form of a ``[tool.flwr.app.config.<namespace>]`` table, as Flower
flattens nested tables), and validated by the method's ``MethodParams``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from pflower.config.schema import RunConfig

AUTO = "auto"


class MethodParams(BaseModel):
    """A method's own run-config keys. Aliases are the keys without the namespace."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    # the keys' prefix in the run config (``<namespace>.<key>``); '' for no keys
    namespace: ClassVar[str] = ""
    # the keys whose default is ``auto`` (resolved by ``auto``)
    auto_keys: ClassVar[tuple[str, ...]] = ()
    # the values of the common key ``profile`` this method has: ``ours`` (our reading
    # of its paper) and, where its authors' code ran otherwise, ``authors``
    profiles: ClassVar[tuple[str, ...]] = ("ours",)
    authors_model: ClassVar[str] = ""  # the backbone the ``authors`` profile runs
    # each profile's values of this method's keys where they differ from its own
    # defaults (profile -> key -> value); each such key is one of ``auto_keys``
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        """Values of this method's pending ``auto`` keys (un-namespaced), from the raw
        config (hyphenated common keys, the schedule keys already resolved)."""
        return {}

    def check(self, cfg: RunConfig) -> None:
        """Checks across this method's keys and the common ones: ValueError naming the
        keys (the namespaced ones as ``<namespace>.<key>``)."""

    def federation_problem(self, cfg: RunConfig, clients: int) -> str | None:
        """What of this method's keys cannot work with ``clients`` clients (the
        pre-flight knows the federation's size; the config alone does not): one line
        naming the key, or None."""
        return None

    @classmethod
    def of(cls, cfg: RunConfig) -> Self:
        """This method's keys in a run config, typed as the method's own class
        (``FedFacParams.of(cfg).fa_quantile``); another method's config is an error."""
        if not isinstance(cfg.params, cls):
            raise TypeError(
                f"run config of method '{cfg.method}' holds {type(cfg.params).__name__}, "
                f"not {cls.__name__}"
            )
        return cfg.params

    @classmethod
    def default(cls, key: str) -> Any:
        """The field default of the key ``key`` (its alias): an auto key's value where
        neither ``auto`` nor the profile gives one."""
        return cls.model_fields[cls.keys()[key]].default

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Key (alias) -> field name."""
        return {(f.alias or name): name for name, f in cls.model_fields.items()}


class NoParams(MethodParams):
    """A method with no keys of its own."""


class MethodSpec(Protocol):
    """The part of a method that the config needs (methods/ implements it)."""

    name: str
    params: type[MethodParams]
    per_client: str  # why it has no mean of one global state to protect ("": it has)
    pfllib: str  # its name in PFLlib d832e76 ("": PFLlib has none, so no 'pfllib' profile)
    aggregation: str  # its rule unless the config sets one: weighted | mean
    means: tuple[Any, ...]  # its mean's parts (pflower.config.weighting.MeanPart)
    attacks: tuple[str, ...]  # the attacks on its own machinery it may be run with

    def defaults(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The method's values for the common ``auto`` keys (its paper's local
        schedule, ...) given the raw config."""
        ...


def check_proximal_pull(key: str, strength: float, cfg: RunConfig) -> None:
    """A pull ``strength``/2 ||w - anchor||^2 alone is a quadratic of that curvature; SGD
    with momentum beta converges on it only while lr * strength < 2 (1 + beta)
    (heavy-ball's stability bound): past it the pulled model diverges from the first
    epoch. ValueError naming ``key`` (a method's namespaced key) if it would."""
    if cfg.optimizer == "sgd" and cfg.lr * strength >= 2 * (1 + cfg.momentum):
        raise ValueError(
            f"config key '{key}' ({strength}) with lr {cfg.lr} and momentum "
            f"{cfg.momentum}: SGD diverges on the proximal term when lr * {key.split('.')[-1]} "
            f">= 2 * (1 + momentum) = {2 * (1 + cfg.momentum):g}; lower '{key}' or 'lr'"
        )
