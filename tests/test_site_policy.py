"""A site's own policy, enforced by its client before any work (pflower/privacy/policy.py).

In-process runs (the real ClientApp with its mods, one Context per node): a node
with a ``site`` and no policy keys is a deployed site with the default policy,
shared tensors only; a simulated node (no ``site``) has none unless given.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from client_app.app import build_client, policy_refusal
from methods import disclosure_kinds, get_method, method_names, parse_run_config
from methods.fedfac.model import PHASE
from pflower.config.schema import ConfigError
from pflower.engine.inprocess import build_inprocess, run_inprocess
from pflower.privacy.policy import REFUSED, PolicyError, SitePolicy
from strategies.base import RunRefused

SMALL = {"num-server-rounds": 2, "sim-samples": 60, "hidden-dim": 16, "run-name": "policy"}
# every registered method whose default config declares a disclosure (from the
# registry: a new disclosing method joins these tests by itself), and Ensemble's
DISCLOSING = {
    name: ({"method": name}, kinds[0])
    for name in method_names()
    if (kinds := [d.kind for d in get_method(name).disclosures(parse_run_config({"method": name}))])
}
DISCLOSING["ensemble"] = (
    {
        "method": "fedfac-static",
        "fedfac.new-clients": 1,
        "fedfac.new-client-mode": "ensemble",
        "fedfac.ensemble-share-models": True,
    },
    "whole-model",
)
SHARED_ONLY = [name for name in method_names() if name not in DISCLOSING]


def _completed_by_every_site(
    res: dict[str, Any], sites: int, rounds: int = 2, held_out: int = 0
) -> None:
    """The run went through: every round, every training site replied and was scored
    (a site whose policy refused would be a failure, missing from the scores);
    ``held_out`` new clients (FedFac's) train only at the end."""
    assert [r["round"] for r in res["rounds"]] == list(range(1, rounds + 1))
    sites -= held_out
    everyone = [f"client-{i}" for i in range(sites)]
    for record in res["rounds"]:
        assert record["failures"] == 0 and record["replies"] == sites, record["round"]
        assert sorted(record["per_client_accuracy"]) == everyone, record["round"]


def _sites(n: int, **policy: Any) -> list[dict[str, Any]]:
    return [{"site": f"client-{i}", **policy} for i in range(n)]


@pytest.mark.parametrize("name", sorted(DISCLOSING))
def test_the_default_site_policy_refuses_a_disclosing_run_before_anything_leaves(
    name: str, tmp_path
) -> None:
    config, kind = DISCLOSING[name]
    fits: list[Any] = []
    server, rounds = build_inprocess(
        {**SMALL, **config, "output-dir": str(tmp_path)},
        3,
        lambda kind_, cid, ins, res: fits.append(res),
        _sites(3),
    )
    with pytest.raises(RunRefused) as err:
        server.fit(rounds, timeout=None)
    assert fits == []  # no reply with content reached the server
    message = str(err.value)
    assert REFUSED in message and "'accept-disclosures'" in message and f"'{kind}'" in message
    assert (
        f"method='{config['method']}'" in message or "fedfac.ensemble-share-models=true" in message
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DISCLOSING))
def test_a_site_that_accepts_the_disclosure_runs(name: str, tmp_path) -> None:
    config, kind = DISCLOSING[name]
    res = run_inprocess(
        {**SMALL, **config, "output-dir": str(tmp_path)},
        3,
        node_configs=_sites(3, **{"accept-disclosures": kind}),
    )
    held_out = int(config.get("fedfac.new-clients", 0))
    _completed_by_every_site(res, 3, held_out=held_out)
    if held_out:  # the new client got the accepted whole models at the end
        assert res["rounds"][-1]["ensemble_models_from"] == ["client-0", "client-1"]


def test_the_registry_finds_the_disclosing_methods() -> None:
    assert {"fedcp", "factorized-fl-alpha", "fedfac-dynamic"} <= set(DISCLOSING)
    assert {"fedavg", "ditto", "feddecomp", "fedfac-static"} <= set(SHARED_ONLY)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHARED_ONLY)
def test_the_default_policy_lets_a_shared_tensors_only_method_run(name: str, tmp_path) -> None:
    """Every method that declares nothing (Ditto included) runs at sites with the
    default policy, shared tensors only."""
    res = run_inprocess(
        {**SMALL, "method": name, "num-server-rounds": 1, "output-dir": str(tmp_path)},
        2,
        node_configs=_sites(2),
    )
    _completed_by_every_site(res, 2, rounds=1)


def test_a_site_requiring_secure_aggregation_refuses_a_plain_run(tmp_path) -> None:
    with pytest.raises(RunRefused, match="'require-secure-aggregation' refuses run key"):
        run_inprocess(
            {**SMALL, "method": "fedper", "output-dir": str(tmp_path)},
            2,
            node_configs=_sites(2, **{"require-secure-aggregation": True}),
        )


def test_sites_that_refuse_are_left_out_and_the_others_train(tmp_path) -> None:
    nodes = [{"site": "client-0"}, {"site": "client-1", "accept-disclosures": "head-blend"}]
    res = run_inprocess({**SMALL, "method": "fedcp", "output-dir": str(tmp_path)}, 2, None, nodes)
    assert list(res["rounds"][-1]["per_client_accuracy"]) == ["client-1"]
    assert res["rounds"][0]["failures"] == 1
    (why,) = res["rounds"][0]["failed"]  # the failure named in the round's record
    assert why.startswith("node 1: ") and REFUSED in why, why


def test_simulation_without_a_policy_keeps_todays_behaviour(tmp_path) -> None:
    res = run_inprocess({**SMALL, "method": "fedcp", "output-dir": str(tmp_path)}, 2)
    _completed_by_every_site(res, 2)


def test_allowed_methods_and_a_malformed_policy(tmp_path) -> None:
    cfg = parse_run_config({"method": "fedrep"})
    node = {"site": "h", "allowed-methods": "fedper,fedavg"}
    why = policy_refusal(node, cfg, "train", masked=False)
    assert why is not None and "'allowed-methods'" in why and "method='fedrep'" in why
    assert policy_refusal({**node, "allowed-methods": "all"}, cfg, "train", False) is None
    bad = policy_refusal({"site": "h", "accept-disclosures": "everything"}, cfg, "train", False)
    assert bad is not None and "'accept-disclosures' names ['everything']" in bad
    with pytest.raises(PolicyError, match="require-secure-aggregation"):
        SitePolicy.of_node(
            {"require-secure-aggregation": "maybe"}, method_names(), disclosure_kinds()
        )


def test_a_client_asked_for_secure_aggregation_refuses_an_unmasked_fit() -> None:
    cfg = parse_run_config({"method": "fedper", "secure-aggregation": True})
    sim = {"partition-id": 0, "num-partitions": 2}  # no policy at all
    why = policy_refusal(sim, cfg, "train", masked=False)
    assert why is not None and "secure-aggregation=true" in why and "unmasked" in why
    assert policy_refusal(sim, cfg, "train", masked=True) is None
    assert policy_refusal(sim, cfg, "evaluate", masked=False) is None  # no arrays go up
    with pytest.raises(ConfigError, match="'secure-aggregation'"):
        build_inprocess({**SMALL, "method": "fedper", "secure-aggregation": True}, 2)


def test_a_site_requiring_secure_aggregation_sends_no_metric_it_has_not_accepted() -> None:
    """Beside its masked upload such a site sends its client key only (no loss, score
    or device), and refuses evaluate messages (a reply would be its accuracy), unless
    it accepts 'metrics'."""
    from models.roles import EVALUATE_FIRST

    raw = {"method": "fedper", "sim-samples": 40, "hidden-dim": 8, "secure-aggregation": True}
    strict = {"site": "h", "partition-id": 0, "num-partitions": 2}
    strict["require-secure-aggregation"] = "true"
    strict["secagg-unverified-keys"] = "true"  # no roster here (development opt-in)
    cfg = parse_run_config(raw)
    for node, withheld in ((strict, True), ({**strict, "accept-disclosures": "metrics"}, False)):
        client = build_client(Context(0, 1, node, RecordDict(), raw)).numpy_client  # type: ignore[attr-defined]
        _, _, metrics = client.fit([], {"server-round": 2, EVALUATE_FIRST: True})
        if withheld:
            assert set(metrics) == {"client-key"}
        else:
            assert {"train-loss", "eval-accuracy", "device"} <= set(metrics)
        why = policy_refusal(node, cfg, "evaluate", masked=False)
        assert (why is not None and "'metrics'" in why) == withheld
    # sites without that requirement send their metrics as before
    assert (
        policy_refusal({"site": "h"}, parse_run_config({"method": "fedper"}), "evaluate", False)
        is None
    )


def test_a_fedfac_client_never_sends_its_model_without_ensemble_consent() -> None:
    raw = {"method": "fedfac-static", "sim-samples": 60, "hidden-dim": 16}
    node = {"partition-id": 0, "num-partitions": 2}
    client = build_client(Context(0, 1, node, RecordDict(), raw))
    numpy_client = client.numpy_client  # type: ignore[attr-defined]
    with pytest.raises(PermissionError, match="refuses to send its whole model"):
        numpy_client.fit([], {PHASE: "share-model"})  # refused before it reads anything


def test_any_config_that_can_ask_for_whole_models_declares_it() -> None:
    """Ensemble consent without new clients still lets the server ask for models: it
    is a declared disclosure, so a default site policy refuses the run."""
    for extra in ({}, {"fedfac.new-client-sites": "site-z"}, {"fedfac.new-clients": 1}):
        cfg = parse_run_config(
            {
                "method": "fedfac-static",
                "fedfac.new-client-mode": "ensemble",
                "fedfac.ensemble-share-models": True,
                **extra,
            }
        )
        kinds = [d.kind for d in get_method("fedfac-static").disclosures(cfg)]
        assert kinds == ["whole-model"], extra
        why = policy_refusal({"site": "h"}, cfg, "train", masked=False)
        assert why is not None and "'whole-model'" in why
        assert "fedfac.ensemble-share-models=true" in why


def test_a_site_posing_as_a_held_out_client_is_sent_no_model(tmp_path, monkeypatch) -> None:
    """The sites accept whole-model, no client is held out, and client-0 answers the
    last evaluate claiming it is new: its claim is rejected, no site is asked for its
    model and none is sent (before, it received every other site's model)."""
    from methods.fedfac.client import FedFacClient
    from methods.fedfac.model import HELD_OUT

    evaluate = FedFacClient.evaluate

    def hostile(self, parameters, config):  # noqa: ANN001, ANN202
        loss, n, metrics = evaluate(self, parameters, config)
        return loss, n, {**metrics, HELD_OUT: 1} if self.client_key == "client-0" else metrics

    monkeypatch.setattr(FedFacClient, "evaluate", hostile)
    config = {
        **SMALL,
        "method": "fedfac-static",
        "fedfac.new-client-mode": "ensemble",
        "fedfac.ensemble-share-models": True,
        "output-dir": str(tmp_path),
    }
    phases: list[Any] = []
    record = lambda kind, cid, ins, res: phases.append(ins.config.get(PHASE))  # noqa: E731
    nodes = _sites(3, **{"accept-disclosures": "whole-model"})
    server, rounds = build_inprocess(config, 3, record, nodes)
    with pytest.MonkeyPatch.context() as m:
        warnings: list[str] = []
        m.setattr(
            "methods.fedfac.new_clients.log.warning", lambda *a: warnings.append(a[0] % a[1:])
        )
        server.fit(rounds, timeout=None)
    assert "share-model" not in phases and "ensemble" not in phases
    assert any("rejected held-out claim from 'client-0'" in w for w in warnings)
    extra = server.strategy.rounds[rounds].extra
    assert "ensemble_models_from" not in extra and "accuracy_new_clients" not in extra


def test_declared_kinds_are_the_policy_vocabulary() -> None:
    cfg = parse_run_config({"method": "fedcp", "secure-aggregation": True})
    (d,) = get_method("fedcp").disclosures(cfg)
    assert d.kind == "head-sum" and not d.audited  # SecAgg+: only the sum is unmasked
    assert np.all([get_method(m).disclosures(parse_run_config({"method": m})) == () for m in (
        "fedavg", "fedper", "fedrep", "fedbn", "local", "feddecomp", "dualfed",
        "factorized-fl-beta", "fedfac-static", "fedavg-ft",
    )])  # fmt: skip


def test_a_reply_carrying_another_nodes_client_key_is_rejected(tmp_path) -> None:
    """Node 3 presents node 1's key: whichever presented it first keeps it, the other
    is rejected every round and never receives that site's own aggregate."""
    nodes = [{"site": "client-0"}, {"site": "client-1"}, {"site": "client-0"}]
    config = {**SMALL, "method": "factorized-fl-beta", "output-dir": str(tmp_path)}
    config["num-server-rounds"] = 3
    server, rounds = build_inprocess(config, 3, None, nodes)
    server.fit(rounds, timeout=None)
    strategy = server.strategy
    owner = strategy.clients.key_owner["client-0"]
    impostor = ({1, 3} - {owner}).pop()
    assert impostor not in strategy.clients.node_keys  # so it is sent the global payload only
    proxy = server.client_manager().all()[str(impostor)]
    assert strategy.payload_for(strategy.clients.key_of(proxy), 4) is strategy.global_payload()
    assert strategy.payload_for("client-0", 4) is not strategy.global_payload()
    for r in json.loads(strategy.recorder.results_path.read_text())["rounds"]:
        assert any(f"belongs to node {owner}, still connected" in x for x in r["rejected"])
        assert sorted(r["per_client_accuracy"]) == ["client-0", "client-1"]


def test_the_privacy_docs_table_is_generated_from_the_declarations() -> None:
    from pflower.cli import disclosures as table

    text = table.DOC.read_text()
    assert table.replace_in(text) == text, "run: python -m pflower.cli.disclosures --write"


def test_every_disclosure_is_of_a_kind_its_method_declares() -> None:
    """A method's disclosures, in every mode the PRIVACY table shows, are of the kinds
    on its own card, and the policy accepts exactly the declared kinds by name."""
    declared = disclosure_kinds()
    for name in method_names():
        method = get_method(name)
        for mode in ({}, *method.disclosure_modes, {"secure-aggregation": True}):
            if "secure-aggregation" in mode and method.per_client:
                continue  # a method that cannot run under SecAgg+
            cfg = parse_run_config({"method": name, **mode})
            for d in method.disclosures(cfg):
                assert d.of in method.disclosure_kinds, (name, mode, d.kind)
    assert {"metrics", "head-blend", "whole-model"} <= set(declared)
    with pytest.raises(PolicyError, match="names \\['not-a-kind'\\]"):
        SitePolicy.of_node({"accept-disclosures": "not-a-kind"}, method_names(), declared)
