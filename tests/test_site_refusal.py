"""#93: a site whose node config requires SecAgg+ sends nothing in the clear, whatever
process hosts its ClientApp: here Flower's own ``flower-supernode`` (not
``deploy.site``, whose launcher refuses such a site without a roster before it
starts), looked at from the server's side, as an attacker running the server sees it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.loopback import LoopbackFederation
from pflower.privacy.policy import REFUSED

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parent / "apps" / "eavesdrop"


def test_a_stock_supernode_requiring_secagg_without_a_roster_sends_nothing_in_the_clear(
    tmp_path: Path,
) -> None:
    """Two stock SuperNodes (TLS, registered keys), the project's ClientApp at each:
    site-a requires SecAgg+ and has no roster, site-b has the default policy. A
    hostile ServerApp asks both for a plain fit, a legacy get_parameters and a
    SecAgg+ set-up, in a run without SecAgg+ and in one with it, and keeps every
    reply. From site-a it holds refusals only: no array, no value (not even the
    set-up's public keys); in the secure run each names the missing roster. From
    site-b, the control, it holds the plain upload, the shared tensors and the keys:
    what it would have got."""
    sites = ["site-a", "site-b"]
    out = tmp_path / "out"
    out.mkdir()
    with LoopbackFederation(tmp_path / "fed", tls=True, auth=True) as fed:  # flower-supernode
        fed.make_certs(sites)
        fed.start_superlink()
        nodes = {site: fed.register(site) for site in sites}
        policy = {"require-secure-aggregation": "true", "identity-key": str(fed.key("site-a"))}
        procs = {
            site: fed.start_supernode(
                site,
                i,
                2,
                tmp_path / f"state-{site}",
                key=fed.key(site),
                policy=policy if site == "site-a" else None,
            )
            for i, site in enumerate(sites)
        }
        for site, proc in procs.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 120, site, proc)
            assert "flower-supernode" in " ".join(proc.popen.args)  # Flower's own SuperNode
        for secure in (False, True):
            run_id = fed.run({"output-dir": str(out), "secure-aggregation": secure}, app=APP)
            status = fed.wait_run(run_id, 900)
            log = fed.flwr("log", str(run_id), "loopback", "--show").stdout
            assert status == "finished:completed", log[-3000:]
    for secure in (False, True):
        captured = json.loads((out / f"captured-secure-{str(secure).lower()}.json").read_text())
        assert set(captured) == {"plain fit", "get_parameters", "secagg+ set-up"}
        for what, replies in captured.items():
            by_node = {r["node"]: r for r in replies}
            strict, control = by_node[nodes["site-a"]], by_node[nodes["site-b"]]
            # site-a: a refusal naming its policy, and not one array or value
            assert REFUSED in strict["error"], (what, strict)
            assert "'require-secure-aggregation'" in strict["error"], (what, strict)
            assert "arrays" not in strict and "values" not in strict, (what, strict)
            if secure:  # the run asks for SecAgg+: refused for want of a roster
                assert "needs a roster" in strict["error"], (what, strict["error"])
            else:  # refused by the run-level rule
                assert "refuses run key secure-aggregation=false" in strict["error"], strict
            # site-b, the control: the server does hold what a site answers in the clear
            if what == "secagg+ set-up":
                assert not control["error"], control
                assert sum("pk" in k or "public" in k for k in control["values"]) >= 2, control
            elif not secure:
                assert not control["error"] and control["arrays"], (what, control)
