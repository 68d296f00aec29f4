"""A site's own policy on what may leave it, set in its node config.

The site's operator writes it where only the site can (``flower-supernode
--node-config``, ``python -m deploy.site``, the compose site file), so whoever
submits a run cannot change it. The ClientApp checks every message of a run
against it before any work, and refuses what it does not allow: an error reply
naming the policy key and the run key, a line in the site's log, no tensor sent.

Node config keys:

- ``accept-disclosures``: a comma-separated list of the disclosure kinds beyond
  the shared tensors that the site accepts (each declared on its method's card;
  ``methods.disclosure_kinds()`` lists them;
  ``whole-model`` is FedFac's Ensemble), or ``all``. Default: none.
- ``require-secure-aggregation``: ``true`` refuses every run without SecAgg+ and
  every unmasked fit, and sends no per-site metric beside its masked upload (its
  client key only; no loss, score or device) and no evaluation, unless
  ``accept-disclosures`` names ``metrics``. Default: false.
- ``allowed-methods``: a comma-separated list of methods, or ``all`` (default).
- ``min-secagg-sites``: the fewest distinct roster sites a SecAgg+ round may have
  among this site's neighbours, checked from their signed keys when the site has
  its own roster (node config ``secagg-roster``, pflower/privacy/secagg.py). Default 3.

A site that requires SecAgg+ needs its own roster (``secagg-roster``): without one
a server can play its SecAgg+ neighbours with keys of its own and unmask its upload,
so it refuses every message until it has one (``roster_refusal``; the node config's
``secagg-unverified-keys=true``, development only, waives it). The ClientApp
checks it whatever process hosts it (Flower's own ``flower-supernode`` too), and
``deploy.site`` and ``deploy.fast_supernode`` refuse to start such a site.

In any SecAgg+ run, a site whose ``accept-disclosures`` does not name ``metrics``
sends its masked upload beside its client key only: no loss, score, device or
sample count (the weight travels inside the mask).

A node with a ``site`` (a deployment: ``deploy.site`` always sets one) and no
policy keys gets the defaults: shared tensors only. A simulated node (no
``site``) has no policy unless its node config gives one of these keys.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pflower.config.node import DEFAULT_MIN_SECAGG_SITES as DEFAULT_MIN_SECAGG_SITES
from pflower.config.node import NodeConfig
from pflower.config.schema import ConfigError
from pflower.privacy.disclosure import Disclosure

ACCEPT = "accept-disclosures"
REQUIRE_SECAGG = "require-secure-aggregation"
ALLOWED_METHODS = "allowed-methods"
MIN_SECAGG_SITES = "min-secagg-sites"
ROSTER_KEY = "secagg-roster"  # the site's own copy of the roster (pflower/privacy/secagg.py)
UNVERIFIED_KEYS = "secagg-unverified-keys"  # development only: no roster, keys unchecked
POLICY_KEYS = (ACCEPT, REQUIRE_SECAGG, ALLOWED_METHODS, MIN_SECAGG_SITES)
REFUSED = "refuses this run by its policy"  # in every refusal: the server looks for it


class PolicyError(ValueError):
    """The site's own policy is malformed (the site refuses every run until fixed)."""


def _names(value: Any, known: Collection[str], key: str) -> frozenset[str] | None:
    """A comma-separated list of known names; None for ``all``."""
    text = str(value).strip()
    if text == "all":
        return None
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(known))
    if unknown:
        raise PolicyError(
            f"site policy '{key}' names {unknown}, expected 'all' or some of {sorted(known)}"
        )
    return names


def node_of(node: Mapping[str, Any] | NodeConfig) -> NodeConfig:
    """The parsed node config; a bad key or value is a malformed policy (the site
    refuses every run until it is fixed)."""
    try:
        return NodeConfig.of(node)
    except ConfigError as err:
        raise PolicyError(f"site policy: {err}") from None


def roster_refusal(node: Mapping[str, Any] | NodeConfig) -> str | None:
    """Why a site whose node config requires SecAgg+ must answer nothing: it has no
    roster to check its neighbours' signed keys against; or None."""
    try:
        parsed = node_of(node)
    except PolicyError as err:
        return str(err)
    required, waived = parsed.require_secure_aggregation, parsed.secagg_unverified_keys
    if not required or waived or parsed.secagg_roster.strip():
        return None
    return (
        f"site policy '{REQUIRE_SECAGG}' needs a roster (node config '{ROSTER_KEY}') to "
        "check its SecAgg+ neighbours' keys: without one a server can play them and read "
        "this site's upload, so it answers nothing (deploy.site --roster)"
    )


@dataclass(frozen=True)
class SitePolicy:
    """What a site lets leave it. ``None`` sets mean 'all'."""

    accept: frozenset[str] | None = frozenset()
    require_secure_aggregation: bool = False
    methods: frozenset[str] | None = None
    min_secagg_sites: int = DEFAULT_MIN_SECAGG_SITES

    @classmethod
    def of_node(
        cls,
        node: Mapping[str, Any] | NodeConfig,
        methods: Collection[str],
        kinds: Collection[str],
    ) -> SitePolicy | None:
        """The node's policy; None for a simulated node that gives none. ``methods``
        and ``kinds`` are the names it may list (the registry's methods and the
        disclosure kinds they declare)."""
        parsed = node_of(node)
        if not parsed.has_policy:
            return None
        return cls(
            accept=_names(parsed.accept_disclosures, kinds, ACCEPT),
            require_secure_aggregation=parsed.require_secure_aggregation,
            methods=_names(parsed.allowed_methods, methods, ALLOWED_METHODS),
            min_secagg_sites=parsed.min_secagg_sites,
        )

    def withholds_metrics(self, secure_aggregation: bool) -> bool:
        """Whether the site sends no per-site metric beside its fit (a SecAgg+ run, or
        a site that requires one, and ``metrics`` not accepted)."""
        return (self.require_secure_aggregation or secure_aggregation) and not (
            self.accept is None or "metrics" in self.accept
        )

    def refusal(
        self, method: str, secure_aggregation: bool, disclosures: tuple[Disclosure, ...]
    ) -> str | None:
        """Why this site refuses a run, or None if it allows it."""
        if self.methods is not None and method not in self.methods:
            return (
                f"site policy '{ALLOWED_METHODS}' ({','.join(sorted(self.methods)) or 'none'}) "
                f"does not include run key method='{method}'"
            )
        if self.require_secure_aggregation and not secure_aggregation:
            return (
                f"site policy '{REQUIRE_SECAGG}' refuses run key secure-aggregation=false "
                "(the server would see this site's own upload)"
            )
        for d in disclosures:
            if self.accept is not None and d.kind not in self.accept:
                return (
                    f"site policy '{ACCEPT}' does not include '{d.kind}', which run key "
                    f"{d.run_keys} needs: it sends {d.what}"
                )
        return None
