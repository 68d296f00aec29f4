"""A client is built once (client_app/build.py): what it reports and how it weighs its
reply are decided before it is constructed and given to its constructor; the
weighting rule is one function both sides call (pflower/config/weighting.py)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from flwr.common import Context, RecordDict

from client_app.base import ClientSetup, PFLClient
from client_app.build import build_numpy_client
from methods import get_method, method_names, parse_run_config
from pflower.config.weighting import aggregation_rule, weighs_by_samples

SMALL = {"sim-samples": 40, "hidden-dim": 8}
BUILD = Path(__file__).resolve().parents[1] / "client_app" / "build.py"


def test_the_rule_is_the_runs_choice_its_methods_default_or_mean_under_dp() -> None:
    for chosen, dp in itertools.product(("default", "mean", "weighted", "median"), (False, True)):
        if dp and chosen != "default":
            continue  # the run config refuses another rule beside DP
        raw = {"method": "fedavg", "aggregation": chosen}
        if dp:
            raw |= {"dp-mode": "client", "dp-noise-multiplier": 0.5}
        cfg = parse_run_config(raw)
        for default in ("weighted", "mean"):
            rule = aggregation_rule(cfg, default)
            assert rule == ("mean" if dp else default if chosen == "default" else chosen)
            assert weighs_by_samples(cfg, default)  # no SecAgg+: always the sample count


def test_under_secure_aggregation_a_plain_mean_is_sent_with_weight_one() -> None:
    for name in method_names():
        method = get_method(name)
        if method.per_client:
            continue  # cannot run under SecAgg+
        cfg = parse_run_config({"method": name, "secure-aggregation": True})
        plain = aggregation_rule(cfg, method.aggregation) == "mean"
        assert weighs_by_samples(cfg, method.aggregation) is not plain, name


def test_a_built_client_has_what_its_node_decides_from_its_constructor() -> None:
    raw = {"method": "fedper", **SMALL}
    simulated = build_numpy_client(
        Context(0, 1, {"partition-id": 0, "num-partitions": 2}, RecordDict(), raw)
    )
    site = build_numpy_client(
        Context(0, 1, {"site": "h", "partition-id": 0, "num-partitions": 2}, RecordDict(), raw)
    )
    assert isinstance(simulated, PFLClient) and isinstance(site, PFLClient)
    assert simulated.report_data_digest and not site.report_data_digest
    assert not simulated.data_info and site.data_info  # a deployed site answers its shape
    assert simulated.weight_by_samples and site.weight_by_samples
    assert simulated.class_fingerprint == site.class_fingerprint  # the run's class list
    bare = ClientSetup()
    assert bare.weight_by_samples and not bare.withhold_metrics and bare.stale is None


def test_the_builder_sets_no_attribute_on_a_built_client() -> None:
    """Everything, the simulation store too (chosen by the personal state's bytes,
    read off the model before the client is built), goes to the constructor."""
    tree = ast.parse(BUILD.read_text())
    set_after = [
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "client"
    ]
    assert set_after == [], set_after


@pytest.mark.parametrize("method", method_names())
def test_the_store_is_sized_by_what_the_built_client_keeps(method: str) -> None:
    """``personal_bytes``, read off the model before the client exists, is what the
    built client's ``personal_state`` holds (the simulation store is chosen by it)."""
    from tests.helpers import config, make_client

    client, _ = make_client(config(method=method))
    held = sum(a.nbytes for a in client.personal_state().values())
    assert type(client).personal_bytes(client.model, client.roles, client.wire) == held
