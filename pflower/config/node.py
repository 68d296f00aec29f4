"""The node config: what a site (``flower-supernode --node-config``, ``deploy.site``)
or a simulated node gives its ClientApp, validated in one place.

Every key is a field here, its alias the hyphenated key; nothing else reads the
node config by a string key. ``NodeConfig.of`` parses a mapping once (cached, so a
ClientApp that sees the same node config each message parses it once) and raises
``ConfigError`` naming the key, as the run config does: an unknown key, or a value
of the wrong kind. A deployed site is a node whose config has ``site``
(``deploy.site`` always sets one); Flower's simulation gives ``partition-id`` and
``num-partitions`` only. The policy keys' names are checked against the methods and
disclosure kinds by pflower/privacy/policy.py, which may see the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pflower.config.schema import ConfigError, _problems

# the policy keys (pflower/privacy/policy.py): a simulated node has a policy only
# when it sets one of these
POLICY_FIELDS = (
    "accept_disclosures",
    "require_secure_aggregation",
    "allowed_methods",
    "min_secagg_sites",
)
DEFAULT_MIN_SECAGG_SITES = 3
# the columns a site may name for its own table (client_app/site_data.py)
SITE_DATA_FIELDS = ("label_column", "split_column", "feature_columns", "categorical_columns")
# a site's own backbone over the run's, where the method's shared tensors keep their
# shapes (client_app/build.py checks it): FedProto shares prototypes, not weights
SITE_MODEL_FIELDS = ("own_model", "own_hidden_dim")


def _field(default: Any, alias: str, **kw: Any) -> Any:
    return Field(default, alias=alias, **kw)


class NodeConfig(BaseModel):
    """Every node-config key, its meaning and its default. Site-only keys are those
    a simulated node has no use for (its policy, roster, identity, approved apps);
    a simulated node may still set them, as the tests and the in-process engine do."""

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True, coerce_numbers_to_str=True
    )

    # who the node is: a deployed site names itself (its stable client key); a
    # simulated node is numbered by Flower (partition-id of num-partitions)
    site: str | None = None  # site-only; set: this node is a deployed site
    partition_id: int | None = _field(None, "partition-id", ge=0)
    num_partitions: int | None = _field(None, "num-partitions", ge=1)
    # where its data and its state are
    data_path: str = _field("", "data-path")  # the site's own data; "" the run's data set
    state_dir: str = _field("", "state-dir")  # personal state on disk (restart safety)
    data_cache: str = _field("", "data-cache")  # "disk": a decoded copy under state-dir
    # its own table's columns, over the run's (client_app/site_data.py); site-only
    label_column: str = _field("", "label-column")
    split_column: str = _field("", "split-column")
    feature_columns: str = _field("", "feature-columns")
    categorical_columns: str = _field("", "categorical-columns")
    # its own backbone (and hidden width), over the run's ("" / 0: the run's)
    own_model: str = _field("", "model")
    own_hidden_dim: int = _field(0, "hidden-dim", ge=0)
    # how it computes
    device: str = ""  # e.g. cuda:0; "" picks one (client_app/devices.py)
    torch_threads: int = _field(0, "torch-threads", ge=0)  # 0: torch's own choice
    # its policy (pflower/privacy/policy.py); site-only
    accept_disclosures: str = _field("", "accept-disclosures")  # kinds, or "all"
    require_secure_aggregation: bool = _field(False, "require-secure-aggregation")
    allowed_methods: str = _field("all", "allowed-methods")  # methods, or "all"
    min_secagg_sites: int = _field(DEFAULT_MIN_SECAGG_SITES, "min-secagg-sites", ge=2)
    # SecAgg+ (pflower/privacy/secagg.py); site-only
    secagg_roster: str = _field("", "secagg-roster")  # the site's own copy of the roster
    secagg_unverified_keys: bool = _field(False, "secagg-unverified-keys")  # development only
    identity_key: str = _field("", "identity-key")  # signs its SecAgg+ keys (OpenSSH)
    # the app builds it runs beyond its state directory's list (deploy/site_guard.py)
    approved_apps: str = _field("", "approved-apps")  # site-only; sha256:<hex>, comma-separated

    @field_validator("require_secure_aggregation", "secagg_unverified_keys", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("true", "1", "yes"):
                return True
            if text in ("false", "0", "no", ""):
                return False
            raise ValueError("expected true or false")
        return value

    @field_validator("min_secagg_sites", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("expected a whole number >= 2")
        return value.strip() if isinstance(value, str) else value

    @field_validator("data_cache", mode="before")
    @classmethod
    def _cache(cls, value: Any) -> Any:
        text = str(value).strip().lower()
        if text not in ("", "disk"):
            raise ValueError("expected 'disk' or nothing")
        return text

    @classmethod
    def of(cls, node: Mapping[str, Any] | NodeConfig) -> NodeConfig:
        """The node config of ``node`` (Flower's ``context.node_config``); raise
        ConfigError naming each bad key."""
        if isinstance(node, NodeConfig):
            return node
        try:
            return _parsed(tuple(sorted((str(k), v) for k, v in dict(node).items())))
        except TypeError:  # an unhashable value: not from a node config, parse uncached
            return _parse(dict(node))

    @classmethod
    def key(cls, name: str) -> str:
        """The node-config key of field ``name`` (``state_dir`` -> ``state-dir``)."""
        return cls.model_fields[name].alias or name

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every node-config key, as a node config writes it."""
        return tuple(f.alias or n for n, f in cls.model_fields.items())

    @property
    def deployed_site(self) -> bool:
        """Whether this node is a deployed site (it names itself), not a simulated node."""
        return self.site is not None

    @property
    def simulated(self) -> bool:
        """Whether Flower's simulation numbers this node's partition and it names no site."""
        return self.num_partitions is not None and not self.site

    @property
    def client_key(self) -> str:
        """The site's client key: its ``site``, else its partition's."""
        return self.site or f"client-{self.partition_id or 0}"

    @property
    def has_policy(self) -> bool:
        """Whether the node has a site policy: a deployed site always does (the
        defaults), a simulated node when it sets a policy key."""
        return self.deployed_site or bool(set(POLICY_FIELDS) & self.model_fields_set)

    @property
    def site_data(self) -> dict[str, str]:
        """The data keys this site declares (they override the run's), by key."""
        return {self.key(n): getattr(self, n) for n in SITE_DATA_FIELDS if getattr(self, n)}

    @property
    def site_model(self) -> dict[str, Any]:
        """The backbone keys this node declares (they override the run's), by key."""
        return {self.key(n): getattr(self, n) for n in SITE_MODEL_FIELDS if getattr(self, n)}

    @property
    def cache_dir(self) -> str:
        """Where the site keeps a decoded copy of its data: its state directory when
        it asks (``data-cache="disk"``), else nowhere ("")."""
        return self.state_dir if self.data_cache == "disk" else ""

    def values(self) -> dict[str, Any]:
        """The keys it sets, as a node config writes them."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def name_of(node: Mapping[str, Any]) -> str:
    """The client key of a node config that may not parse (an error reply's name)."""
    try:
        return NodeConfig.of(node).client_key
    except ConfigError:
        return str(dict(node).get("site", "") or "this site")


@lru_cache(maxsize=256)
def _parsed(items: tuple[tuple[str, Any], ...]) -> NodeConfig:
    return _parse(dict(items))


def _parse(data: dict[str, Any]) -> NodeConfig:
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as err:
        problems = _problems(err, NodeConfig, known=NodeConfig.keys())
        text = "; ".join(problems).replace("Value error, ", "")
        raise ConfigError("invalid node config: " + text) from None
