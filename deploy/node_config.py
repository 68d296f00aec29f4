"""A site's node config: what ``deploy.site`` gives its SuperNode (``--node-config``)
and what the ClientApp then reads; shared by the launcher, its pre-flight check
(deploy/site_check.py) and the loopback harness."""

from __future__ import annotations

import argparse
import os

from pflower.config.node import SITE_DATA_FIELDS, NodeConfig


def node_config(values: dict[str, str | int]) -> str:
    """The ``--node-config`` string: TOML strings in double quotes, ints as they are."""
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            parts.append(f"{key}={str(value).lower()}")
            continue
        if isinstance(value, int):
            parts.append(f"{key}={value}")
            continue
        # Flower splits the string with a regex that does not honour escapes
        if any(c in value for c in '"\\\n'):
            raise ValueError(
                f"node config value for {key!r} may not contain a quote, \\ or newline"
            )
        parts.append(f'{key}="{value}"')
    return " ".join(parts)


def node_values(args: argparse.Namespace) -> dict[str, str | int]:
    """The node config the SuperNode gets: the site, its data, device and policy;
    checked by ``NodeConfig`` (ConfigError naming a bad key or value)."""
    fields: dict[str, str | int] = {"site": args.site, "state_dir": args.state_dir}
    if args.data_path:
        fields["data_path"] = args.data_path
    if args.device:
        fields["device"] = args.device
    if args.data_cache:
        fields["data_cache"] = "disk"
    for name in SITE_DATA_FIELDS:
        if getattr(args, name, None):
            fields[name] = getattr(args, name)
    fields["accept_disclosures"] = args.accept_disclosures
    fields["require_secure_aggregation"] = "true" if args.require_secure_aggregation else "false"
    fields["allowed_methods"] = args.allowed_methods
    fields["min_secagg_sites"] = args.min_secagg_sites
    if args.roster:
        fields["secagg_roster"] = os.path.abspath(args.roster)
    if args.unverified_secagg_keys:  # the SuperNode refuses SecAgg+ without a roster else
        fields["secagg_unverified_keys"] = "true"
    if args.auth_key:  # the SuperNode's authentication key signs its SecAgg+ keys too
        fields["identity_key"] = os.path.abspath(args.auth_key)
    if args.partition_id is not None:
        fields["partition_id"] = args.partition_id
        fields["num_partitions"] = args.num_partitions
    values = {NodeConfig.key(name): value for name, value in fields.items()}
    NodeConfig.of(values)  # the ClientApp's own parse, here before the SuperNode starts
    return values
