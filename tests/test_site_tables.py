"""Hospitals' own tables, deployed for real: three CSV sites started with
``python -m deploy.site`` against a loopback SuperLink (TLS, SuperNode
authentication), a run config with no ``input-shape``. One hospital names its
label column differently and says so at its site (``--label-column``).

When every site's data are usable the run completes with the input shape the
sites' data give, and results.json says who contributed each round. When one
site's data are unusable (its label column named differently and not declared)
the run ends ``finished:failed``, naming that site and what its error reply said,
which names no column or path of its data. All processes are started here and
stopped by pid.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from deploy.site_guard import read_ledger
from harness.loopback import LoopbackFederation

pytestmark = pytest.mark.slow

ROUNDS = 2
RUN_TIMEOUT = 900
SITES = ("hospital-a", "hospital-b", "hospital-c")


def table(path: Path, seed: int, label: str = "outcome") -> Path:
    """One hospital's records: two numeric features, a categorical one, a label and a
    fixed train/test column."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, size=(40, 2))
    pd.DataFrame(
        {
            "age": x[:, 0] * 10 + 50,
            "dose": x[:, 1],
            "ward": rng.choice(["a", "b", "c"], size=40),
            label: (x[:, 0] + x[:, 1] > 0).astype(int),
            "part": ["test" if i % 4 == 0 else "train" for i in range(40)],
        }
    ).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("hospital_c", ["declares its label column", "does not declare it"])
def test_hospitals_declare_their_own_tables_and_an_unusable_one_fails_the_run(
    tmp_path: Path, hospital_c: str
) -> None:
    declares = hospital_c == "declares its label column"
    (tmp_path / "data").mkdir()
    files = {
        site: table(
            tmp_path / "data" / f"{site}.csv", seed, "target" if site == SITES[2] else "outcome"
        )
        for seed, site in enumerate(SITES)
    }
    own = {SITES[2]: ("--label-column", "target")} if declares else {}
    with LoopbackFederation(tmp_path / "fed", tls=True, auth=True) as fed:
        fed.make_certs(list(SITES))
        fed.start_superlink()
        for site in SITES:
            fed.register(site)
        procs = {site: fed.start_site(site, files[site], extra=own.get(site, ())) for site in SITES}
        for site, proc in procs.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 180, site, proc)
        run_id = fed.run(
            {
                "method": "fedavg",
                "model": "logreg",
                "label-column": "outcome",  # the run's name for it; hospital-c's is its own
                "split-column": "part",
                "categorical-columns": "ward:a/b/c",
                "num-classes": 2,
                "local-steps": 3,
                "batch-size": 8,
                "num-server-rounds": ROUNDS,
                "min-available-clients": 3,
                "output-dir": str(fed.root / "out"),
                "run-name": "tables",
            }
        )
        status = fed.wait_run(run_id, RUN_TIMEOUT)
        server_log = fed.tail(400)
        run_log = fed.flwr("log", str(run_id), "loopback", "--show").stdout  # as an operator
    res = json.loads((fed.root / "out" / "tables" / "results.json").read_text())
    # the model was built from the shape the sites' data give: age, dose, ward b, ward c
    assert res["data_source"]["input-shape"] == "4", res.get("data_source")
    assert res["config"]["input-shape"] == "4"
    assert res["config"]["dataset"] == "each site's own data"  # not the server's default
    outcome = res["outcome"]
    if declares:
        assert status == "finished:completed", server_log
        assert outcome["status"] == "completed" and outcome["problems"] == []
        assert outcome["participants"] == {str(r): list(SITES) for r in range(1, ROUNDS + 1)}
        assert sorted(res["rounds"][-1]["per_client_accuracy"]) == list(SITES)
        return
    assert status == "finished:failed", server_log
    (problem,) = outcome["problems"]
    assert problem.startswith(f"site '{SITES[2]}' (asked in {ROUNDS} rounds) never contributed")
    assert "failed in train" in problem
    assert outcome["participants"] == {str(r): list(SITES[:2]) for r in range(1, ROUNDS + 1)}
    assert f"run FAILED: {problem}" in run_log, run_log[-3000:]
    # what left hospital-c: its error replies, in its ledger, naming no column or path
    errors = [e["error"] for e in read_ledger(fed.state_dir(SITES[2])) if e["error"]]
    assert errors and all("target" not in e and "outcome" not in e for e in errors), errors
    assert all(str(tmp_path) not in e for e in errors), errors
    assert "target" not in problem and str(tmp_path) not in problem


def test_a_hospital_joining_mid_run_trains_from_the_next_round_on_its_own_state(
    tmp_path: Path,
) -> None:
    """Round 1 is held open for the test: hospital-c is frozen (SIGSTOP, by pid) before
    the run starts, so the server waits for its answer to round 1's class-list query
    while hospital-d starts and connects; then hospital-c goes on. Round 1 trains the
    three sites it sampled; from round 2 hospital-d trains too, keeping its own personal
    state, and results.json, the outcome and its own ledger say so."""
    joiner = "hospital-d"
    (tmp_path / "data").mkdir()
    files = {
        site: table(tmp_path / "data" / f"{site}.csv", seed)
        for seed, site in enumerate((*SITES, joiner))
    }
    rounds = 3
    with LoopbackFederation(tmp_path / "fed", tls=True, auth=True) as fed:
        fed.make_certs([*SITES, joiner])
        fed.start_superlink()
        for site in (*SITES, joiner):
            fed.register(site)
        procs = {site: fed.start_site(site, files[site]) for site in SITES}
        for site, proc in procs.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 180, site, proc)
        fed.pause(procs[SITES[2]])
        run_id = fed.run(
            {
                "method": "fedper",
                "model": "mlp",
                "hidden-dim": 8,
                "input-shape": "4",  # no data-info query: round 1's sample is asked first
                "num-classes": 2,
                "label-column": "outcome",
                "split-column": "part",
                "categorical-columns": "ward:a/b/c",
                "local-steps": 3,
                "batch-size": 8,
                "num-server-rounds": rounds,
                "min-available-clients": 3,
                "output-dir": str(fed.root / "out"),
                "run-name": "late",
            }
        )
        # round 1 has sampled a, b and c, and waits for c's class list
        fed.wait_for(lambda: read_ledger(fed.state_dir(SITES[0])), 120, "hospital-a's answer")
        late = fed.start_site(joiner, files[joiner])
        fed.wait_for(lambda: "SuperNode ID" in late.text(), 180, joiner, late)
        fed.resume(procs[SITES[2]])
        status = fed.wait_run(run_id, RUN_TIMEOUT)
        server_log = fed.tail(200)
        ledger = read_ledger(fed.state_dir(joiner))
    assert status == "finished:completed", server_log
    res = json.loads((fed.root / "out" / "late" / "results.json").read_text())
    everyone = sorted((*SITES, joiner))
    assert res["outcome"]["participants"] == {
        "1": list(SITES),
        **{str(r): everyone for r in range(2, rounds + 1)},
    }
    assert [r["replies"] for r in res["rounds"]] == [3] + [4] * (rounds - 1)
    # what left hospital-d: nothing before round 2, a reply to every fit after
    trained = sorted(int(e["round"]) for e in ledger if e["type"] == "train" and not e["error"])
    assert trained == list(range(2, rounds + 1)), ledger
    # it keeps its own personal head from round 2 on, in its own state dir only
    home = fed.state_dir(joiner)
    kept = sorted(p.relative_to(home).as_posix() for p in home.rglob("*.npz"))
    assert kept == [f"late/{joiner}.npz", f"late/{joiner}.previous.npz"]  # and the one before
    assert joiner in res["rounds"][-1]["per_client_accuracy"]
