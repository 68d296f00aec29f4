"""A site's node config: what ``deploy.site`` gives its SuperNode (``--node-config``)
and what the ClientApp then reads; shared by the launcher, its pre-flight check
(deploy/site_check.py) and the loopback harness."""

from __future__ import annotations

import argparse
import os


def node_config(values: dict[str, str | int]) -> str:
    """The ``--node-config`` string: TOML strings in double quotes, ints as they are."""
    parts = []
    for key, value in values.items():
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
    """The node config the SuperNode gets: the site, its data, device and policy."""
    values: dict[str, str | int] = {"site": args.site, "state-dir": args.state_dir}
    if args.data_path:
        values["data-path"] = args.data_path
    if args.device:
        values["device"] = args.device
    if args.data_cache:
        values["data-cache"] = "disk"
    from client_app.site_data import SITE_DATA_KEYS

    for key in SITE_DATA_KEYS:
        if getattr(args, key.replace("-", "_"), None):
            values[key] = getattr(args, key.replace("-", "_"))
    values["accept-disclosures"] = args.accept_disclosures
    values["require-secure-aggregation"] = "true" if args.require_secure_aggregation else "false"
    values["allowed-methods"] = args.allowed_methods
    values["min-secagg-sites"] = args.min_secagg_sites
    if args.roster:
        values["secagg-roster"] = os.path.abspath(args.roster)
    if args.unverified_secagg_keys:  # the SuperNode refuses SecAgg+ without a roster else
        values["secagg-unverified-keys"] = "true"
    if args.auth_key:  # the SuperNode's authentication key signs its SecAgg+ keys too
        values["identity-key"] = os.path.abspath(args.auth_key)
    if args.partition_id is not None:
        values["partition-id"] = args.partition_id
        values["num-partitions"] = args.num_partitions
    return values
