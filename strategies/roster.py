"""A deployment's roster: which node may present which client key.

    # roster.toml, kept by the server's operator (docs/SITE.md, the roster)
    [sites.hospital-a]
    public-key = "keys/hospital-a.pub"   # the key its SuperNode authenticates with
    node-id = 7384619220473529344        # `flwr supernode register` printed it

With SuperNode authentication on, Flower's SuperLink ties each node id to the
public key that was registered for it, and every request of that node is signed
with the key's private half. The roster (run config key ``roster``) adds the
missing link, key to site: from the run's start the server binds each client key
to the node id the roster gives for it, and to no other. A reply that presents
another site's key is rejected, and nothing of that site (its per-client payload,
a held-out claim) ever goes to another node. ``python -m deploy.roster``
registers each site's key and writes its node id here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pflower.config.schema import ConfigError


def load_roster(path: str) -> dict[str, int]:
    """client key (site) -> its node id; ConfigError naming 'roster' if unusable."""
    file = Path(path).expanduser()
    try:
        sites = tomllib.loads(file.read_text()).get("sites")
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"config key 'roster': cannot read {path!r} ({err})") from err
    if not isinstance(sites, dict) or not sites:
        raise ConfigError(f"config key 'roster': {path!r} has no [sites.<name>] table")
    out: dict[str, int] = {}
    for site, entry in sites.items():
        node = entry.get("node-id") if isinstance(entry, dict) else None
        if not isinstance(node, int) or isinstance(node, bool) or node <= 0:
            raise ConfigError(
                f"config key 'roster': site {site!r} in {path!r} has no node-id (register its "
                "public key: python -m deploy.roster register ROSTER)"
            )
        out[site] = node
    twice = sorted({n for n in out.values() if list(out.values()).count(n) > 1})
    if twice:
        raise ConfigError(f"config key 'roster': node id {twice[0]} is given to two sites")
    return out
