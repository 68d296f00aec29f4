"""Client identities from a roster (strategies/roster.py): a client key is bound only
to the node the roster gives for it, and only once its reply was accepted; an
impostor's reply is rejected and it is sent nothing of that site."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.server.client_manager import SimpleClientManager

from models.roles import TensorSpec
from models.wire import Wire
from pflower.config.schema import ConfigError
from strategies.payloads import Payloads
from strategies.replies import ClientKeys, accept_fit_replies, check_arrays
from strategies.roster import load_roster
from tests.helpers import FakeProxy, fit_res

SPEC = [TensorSpec("w", (2, 3), "float32")]


def _accept(results: list[Any], keys: ClientKeys) -> tuple[list[str], list[str]]:
    check = lambda key, arrays, n: check_arrays(SPEC, arrays, n, 100.0)  # noqa: E731
    accepted, rejected, _ = accept_fit_replies(1, results, lambda a: a, check, keys)
    return [r.client_key for r in accepted], rejected


def _upload(value: float = 1.0) -> list[np.ndarray]:
    return [np.full((2, 3), value, np.float32)]


def _roster(tmp_path: Path, text: str) -> str:
    path = tmp_path / "roster.toml"
    path.write_text(text)
    return str(path)


def test_a_roster_names_every_site_with_its_own_node(tmp_path: Path) -> None:
    good = '[sites.site-a]\npublic-key = "a.pub"\nnode-id = 11\n[sites.site-b]\nnode-id = 22\n'
    assert load_roster(_roster(tmp_path, good)) == {"site-a": 11, "site-b": 22}
    for text, says in [
        ("[sites.site-a]\npublic-key = 'a.pub'\n", "site 'site-a'"),
        ("[sites.a]\nnode-id = 5\n[sites.b]\nnode-id = 5\n", "node id 5 is given to two"),
        ("nothing = 1\n", "no [sites.<name>] table"),
        ("[sites.a\n", "cannot read"),
    ]:
        with pytest.raises(ConfigError, match="config key 'roster'") as err:
            load_roster(_roster(tmp_path, text))
        assert says in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_roster(str(tmp_path / "missing.toml"))


def test_an_impostor_presenting_another_sites_key_is_rejected_and_never_bound() -> None:
    keys = ClientKeys({"site-a": 1, "site-b": 2})
    manager = SimpleClientManager()
    keys.manager = manager
    for node in (1, 2, 3):
        manager.register(FakeProxy(node))
    # node 3 (registered, but not site-a's) presents site-a's key, before site-a replies
    accepted, rejected = _accept([(FakeProxy(3), fit_res(_upload(), "site-a"))], keys)
    assert accepted == [] and "belongs to node 1 (roster)" in rejected[0]
    assert keys.key_of(FakeProxy(3)) is None and keys.key_owner["site-a"] == 1
    # a key the roster does not list is no one's
    accepted, rejected = _accept([(FakeProxy(3), fit_res(_upload(), "site-z"))], keys)
    assert accepted == [] and "not in the roster" in rejected[0]
    # site-a drops off: its key still does not move to the impostor ...
    manager.unregister(manager.all()["1"])
    accepted, rejected = _accept([(FakeProxy(3), fit_res(_upload(), "site-a"))], keys)
    assert accepted == [] and keys.key_owner["site-a"] == 1
    # ... and when it comes back (same authenticated node id) it is accepted
    manager.register(FakeProxy(1))
    accepted, _ = _accept([(FakeProxy(1), fit_res(_upload(), "site-a"))], keys)
    assert accepted == ["site-a"]
    # the impostor is sent the global payload, never site-a's own
    payloads = Payloads(Wire.of_spec(SPEC), _upload(0.0), 2**20, None)
    payloads.per_client["site-a"] = payloads.encode(_upload(7.0))
    to_impostor = payloads.payload_for(keys.key_of(FakeProxy(3)))
    to_site_a = payloads.payload_for(keys.key_of(FakeProxy(1)))
    assert to_impostor.tensors != to_site_a.tensors


def test_a_rejected_reply_binds_no_key_without_a_roster() -> None:
    """Simulation keeps first-come keys, but only for an accepted reply: an impostor
    whose reply fails any check (here a NaN metric) is not bound to the key."""
    keys = ClientKeys()
    manager = SimpleClientManager()
    keys.manager = manager
    manager.register(FakeProxy(2))
    nan = fit_res(_upload(), "site-a", metrics={"train-loss": float("nan")})
    accepted, rejected = _accept([(FakeProxy(2), nan)], keys)
    assert accepted == [] and "non-finite metrics" in rejected[0]
    assert "site-a" not in keys.key_owner and keys.key_of(FakeProxy(2)) is None
    manager.register(FakeProxy(1))
    accepted, _ = _accept([(FakeProxy(1), fit_res(_upload(), "site-a"))], keys)
    assert accepted == ["site-a"] and keys.key_owner["site-a"] == 1


# ---- in a loopback deployment: TLS, SuperNode authentication, the sites' own SuperExecs --------


@pytest.mark.slow
def test_an_impostor_node_gets_nothing_of_the_site_whose_key_it_presents(tmp_path: Path) -> None:
    """site-a and site-b are on the roster; a third registered node presents site-a's
    key. Every reply of the impostor is rejected, and each round it is sent the
    global payload, never site-a's own aggregate (the sites' ledgers record a digest
    of what came in), also while site-a is away for a round and after it is back."""
    from deploy.roster import register
    from deploy.site_guard import read_ledger
    from harness.loopback import BIN, LoopbackFederation

    sites = ["site-a", "site-b"]
    with LoopbackFederation(tmp_path, tls=True, auth=True, isolation="process", warm=True) as fed:
        fed.make_certs([*sites, "impostor"])
        fed.start_superlink()
        roster = tmp_path / "roster.toml"
        roster.write_text("".join(f'[sites.{s}]\npublic-key = "pki/keys/{s}.pub"\n' for s in sites))
        # the operator's step: register each site's key, its node id into the roster
        ids = register(roster, ["loopback"], str(BIN / "flwr"), fed.env(fed.cli_home))
        assert sorted(ids) == sites and load_roster(str(roster)) == ids
        fed.register("impostor")  # registered, so it connects; not on the roster
        state = {s: tmp_path / f"state-{s}" for s in [*sites, "impostor"]}
        nodes = {
            s: fed.start_supernode(s, i, 3, state[s], key=fed.key(s)) for i, s in enumerate(sites)
        }
        nodes["impostor"] = fed.start_supernode(
            "site-a", 2, 3, state["impostor"], key=fed.key("impostor"), name="impostor"
        )
        for name, proc in nodes.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 120, name, proc)
        config = {
            "method": "factorized-fl-beta",
            "num-server-rounds": 8,  # slack: a loaded machine may take rounds to restart site-a
            "sim-samples": 60,
            "hidden-dim": 16,
            "round-timeout": 30.0,
            "min-available-clients": 3,  # a round waits for site-a to come back
            "output-dir": str(tmp_path / "out"),
            "run-name": "roster",
            "roster": str(roster),
        }
        run_id = fed.run(config)

        def trained(name: str, rnd: int) -> bool:
            return any(
                e["run"] == run_id and e["type"] == "train" and e["round"] == str(rnd)
                for e in read_ledger(state[name])
            )

        fed.wait_for(lambda: trained("site-a", 1), 600, "site-a's first fit")
        fed.stop(nodes["site-a"])  # site-a drops off ...
        deadline = time.monotonic() + 20  # (the impostor may answer round 2 meanwhile)
        while not trained("impostor", 2) and time.monotonic() < deadline:
            time.sleep(0.5)
        nodes["site-a"] = fed.start_supernode(  # ... and comes back (same key, same node)
            "site-a", 0, 3, state["site-a"], key=fed.key("site-a"), name="site-a-again"
        )
        assert fed.wait_run(run_id, 900) == "finished:completed"
        res = json.loads((tmp_path / "out" / "roster" / "results.json").read_text())
        assert "site-a" in res["rounds"][-1]["per_client_accuracy"]
        for r in res["rounds"]:
            why = {k: r[k] for k in ("round", "rejected", "failures", "per_client_train_loss")}
            assert any("belongs to node" in x and "(roster)" in x for x in r["rejected"]), why
        got = {
            name: {
                e["round"]: e["received"]["sha256"]
                for e in read_ledger(state[name])
                if e["run"] == run_id and e["type"] == "train"
            }
            for name in [*sites, "impostor"]
        }
        trained_in = {r["round"]: set(r["per_client_train_loss"]) for r in res["rounds"]}
        compared, back = [], []
        # site-a has its own aggregate once back; the impostor never. A loaded machine
        # may restart site-a too late for a round: the rounds it was sent count
        for rnd in range(3, 9):
            if str(rnd) not in got["site-a"] or str(rnd) not in got["impostor"]:
                continue
            back.append(rnd)
            assert got["impostor"][str(rnd)] != got["site-a"][str(rnd)]
            if trained_in[rnd - 1] == set(sites):  # else site-b's aggregate is the global one
                assert got["site-a"][str(rnd)] != got["site-b"][str(rnd)]
                assert got["impostor"][str(rnd)] != got["site-b"][str(rnd)]
                compared.append(rnd)
        assert back, got  # site-a and the impostor were both sent a round after site-a's return
        assert compared, trained_in  # site-a trained again before one of them
