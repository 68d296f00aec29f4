"""The node config is one typed model (pflower/config/node.py): every key a site or a
simulated node may set parses, a bad key or value is refused in one line naming it,
and nothing else reads the node config by a string key."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from flwr.common import Context, RecordDict

from client_app.app import policy_refusal
from deploy.node_config import node_config, node_values
from methods import parse_run_config
from pflower.config.node import NodeConfig
from pflower.config.schema import ConfigError
from pflower.engine.inprocess import build_inprocess
from pflower.privacy.policy import REFUSED

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("client_app", "pflower", "deploy", "server_app", "strategies", "methods", "models")
# a node config read by a string key: .get("key" / ["key"] on a node config, or
# "key" in node
READS = re.compile(
    r"""node(_config)?\s*(\.get\(\s*|\[\s*)["'][a-z-]+["']"""
    r"""|["'][a-z-]+["']\s+(not\s+)?in\s+(context\.)?node(_config)?\b"""
)


def _site_args(**given: object) -> argparse.Namespace:
    args = {
        "site": "hospital-a",
        "state_dir": "/state",
        "data_path": "/data/a.csv",
        "device": "cpu",
        "data_cache": True,
        "label_column": "target",
        "split_column": "",
        "feature_columns": "age,chol",
        "categorical_columns": "",
        "accept_disclosures": "metrics",
        "require_secure_aggregation": True,
        "allowed_methods": "fedavg,fedper",
        "min_secagg_sites": 4,
        "roster": "roster.toml",
        "unverified_secagg_keys": False,
        "auth_key": "keys/a",
        "partition_id": 1,
        "num_partitions": 3,
    }
    return argparse.Namespace(**{**args, **given})


def test_what_the_launcher_writes_parses_as_the_clientapp_reads_it() -> None:
    from flwr.common.config import parse_config_args

    values = node_values(_site_args())
    parsed = NodeConfig.of(parse_config_args([node_config(values)]))
    assert parsed.deployed_site and parsed.site == "hospital-a"
    assert parsed.cache_dir == "/state" and parsed.device == "cpu"
    assert parsed.site_data == {"label-column": "target", "feature-columns": "age,chol"}
    assert parsed.require_secure_aggregation and parsed.min_secagg_sites == 4
    assert parsed.secagg_roster.endswith("roster.toml") and parsed.identity_key.endswith("a")
    assert (parsed.partition_id, parsed.num_partitions) == (1, 3)
    assert set(values) <= set(NodeConfig.keys())


def test_flowers_simulation_keys_make_a_simulated_node() -> None:
    for node in (
        {"partition-id": 3, "num-partitions": 4},
        {"partition-id": "3", "num-partitions": "4"},
    ):
        parsed = NodeConfig.of(node)
        assert parsed.simulated and not parsed.deployed_site and not parsed.has_policy
        assert parsed.client_key == "client-3"
    assert NodeConfig.of({"site": "h"}).has_policy  # a site: the default policy
    assert NodeConfig.of({"partition-id": 0, "accept-disclosures": "all"}).has_policy
    assert not NodeConfig.of({}).deployed_site


@pytest.mark.parametrize(
    ("node", "says"),
    [
        ({"sitee": "h"}, "unknown config key 'sitee' (did you mean 'site'?)"),
        ({"site": "h", "require-secure-aggregation": "maybe"}, "'require-secure-aggregation'"),
        ({"min-secagg-sites": 1}, "'min-secagg-sites'"),
        ({"torch-threads": "many"}, "'torch-threads'"),
        ({"data-cache": "ram"}, "'data-cache'"),
        ({"partition-id": -1, "num-partitions": 2}, "'partition-id'"),
    ],
)
def test_a_bad_key_or_value_is_refused_in_one_line_naming_it(node: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        NodeConfig.of(node)
    assert "\n" not in str(err.value) and str(err.value).startswith("invalid node config: ")
    # the ClientApp refuses every message of such a node, with that line
    why = policy_refusal(node, parse_run_config({"method": "fedavg"}), "train", masked=False)
    assert why is not None and REFUSED in why and says in why and "\n" not in why


def test_a_bad_node_config_stops_the_in_process_engine_and_the_launcher() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'devise'"):
        build_inprocess({"method": "fedavg"}, 2, node_configs=[{"devise": "cpu"}, {}])
    from deploy.site import parse_args

    with pytest.raises(SystemExit):  # argparse's one line, exit 2
        parse_args(
            [
                "--site",
                "h",
                "--state-dir",
                "/s",
                "--superlink",
                "x:1",
                "--insecure",
                "--device",
                "cpu",
                "--label-column",
                'a"b',
            ]
        )


def test_a_client_of_a_malformed_node_config_is_not_built() -> None:
    from client_app.build import build_numpy_client

    context = Context(
        0, 1, {"partition-id": 0, "num-partitions": 2, "labels": "x"}, RecordDict(), {}
    )
    with pytest.raises(ConfigError, match="unknown config key 'labels'"):
        build_numpy_client(context)


def test_nothing_but_the_model_reads_the_node_config_by_a_string_key() -> None:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "pflower" / "config" / "node.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if READS.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "read the node config through pflower.config.node.NodeConfig:\n" + "\n".join(
        found
    )


def test_the_pattern_finds_a_string_read() -> None:
    for line in (
        'site = node.get("site", "")',
        "x = context.node_config['partition-id']",
        'if "site" in node:',
        'if "num-partitions" not in context.node_config:',
    ):
        assert READS.search(line), line
