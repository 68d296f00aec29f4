"""A run's outcome (strategies/outcome.py) and a site's error replies
(client_app/errors.py): a run that did not do what it was asked fails, naming why,
and what a failing site sends names no path, column or value of its data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Message, Metadata, RecordDict
from flwr.common import Context

from client_app.errors import PublicError, SiteError, errors_mod
from pflower.engine.inprocess import run_inprocess
from strategies.outcome import NodeFailed, Participation, RunFailed, error_line

RUN = {"method": "fedavg", "dataset": "synthetic", "model": "mlp", "num-server-rounds": 2}
MISSING = "/nowhere/hospital-c/records.csv"


def _run(tmp_path: Path, clients: int = 3, nodes: list[dict] | None = None, **extra: object):
    cfg = {**RUN, "output-dir": str(tmp_path), "run-name": "r", **extra}
    return run_inprocess(cfg, clients, node_configs=nodes)


def _results(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "r" / "results.json").read_text())


def test_a_run_where_every_site_contributed_completes_with_its_participants(tmp_path) -> None:
    res = _run(tmp_path)
    assert res["outcome"]["status"] == "completed" and res["outcome"]["problems"] == []
    everyone = ["client-0", "client-1", "client-2"]
    assert res["outcome"]["participants"] == {"1": everyone, "2": everyone}


def test_a_site_that_fails_every_round_fails_the_run_naming_it(tmp_path, caplog) -> None:
    nodes = [{}, {}, {"site": "hospital-c", "data-path": MISSING}]
    with pytest.raises(RunFailed, match="site 'hospital-c' .*never contributed") as failed:
        _run(tmp_path, nodes=nodes)
    out = _results(tmp_path)["outcome"]  # written before the run raised
    assert out["status"] == "failed" and len(out["problems"]) == 1
    (problem,) = out["problems"]
    assert "asked in 2 rounds" in problem and "FileNotFoundError" in problem
    assert out["participants"] == {"1": ["client-0", "client-1"], "2": ["client-0", "client-1"]}
    # what the site sent names no path: the full text stayed in its own log
    assert MISSING not in problem and MISSING not in str(failed.value)
    server_lines = [r.getMessage() for r in caplog.records if r.name == "flwr.pflower"]
    said = [ln for ln in server_lines if "a client failed" in ln]
    assert said and not any(MISSING in ln for ln in said)


def test_a_round_that_aggregates_no_reply_fails_the_run(tmp_path) -> None:
    with pytest.raises(RunFailed, match="round 1: no reply was aggregated"):
        _run(tmp_path, clients=2, **{"min-replies": 3, "min-available-clients": 2})
    assert _results(tmp_path)["outcome"]["problems"][:2] == [
        "round 1: no reply was aggregated",
        "round 2: no reply was aggregated",
    ]


def test_a_simulated_dropout_or_a_refusal_is_named_but_does_not_fail_the_run() -> None:
    part = Participation()
    part.asked = {1: [1, 2, 3], 2: [1, 2, 3]}
    part.add(1, ["a"], [1], [NodeFailed(2, "client b dropped out (dropout-rate=0.5)")])
    part.add(2, ["a"], [1], [NodeFailed(3, "site 'c' refuses this run by its policy: x")])
    out = part.outcome([], 2, {})
    assert out["status"] == "completed"
    assert [n.split(" never")[0] for n in out["notes"]] == [
        "node 2 (asked in 2 rounds)",
        "site 'c' (asked in 2 rounds)",
    ]
    part.add(2, ["a"], [1], [NodeFailed(2, "site 'b' failed in train: OSError; ...")])
    assert part.outcome([], 2, {})["problems"] == [
        "node 2 (asked in 2 rounds) never contributed: client b dropped out (dropout-rate=0.5)"
    ]


def test_flowers_error_texts_come_down_to_the_sites_line() -> None:
    line = "site 'x' failed in train: ValueError; the details stay in its log"
    deployed = ValueError(
        f"Message contains an Error (reason: <class 'client_app.errors.SiteError'>:<'{line}'>)."
        " It originated during client-side execution of a message."
    )
    simulated = Exception(
        "<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException "
        f"ClientAppException occurred. Message: {line}'>"
    )
    assert error_line(deployed) == error_line(simulated) == line


def _call(err: Exception, node: dict) -> Exception:
    meta = Metadata(1, "", 1, 0, "", "3", 0.0, 60.0, "train")
    msg = Message(RecordDict(), metadata=meta)

    def raising(m: Message, c: Context) -> Message:
        raise err

    with pytest.raises(Exception) as raised:
        errors_mod(msg, Context(1, 1, node, RecordDict(), {}), raising)
    return raised.value


def test_an_error_reply_names_the_site_and_the_class_of_error_only(caplog) -> None:
    columns = KeyError("['age', 'cholesterol', 'thal'] not in index (/data/site/heart.csv)")
    sent = _call(columns, {"site": "hospital-a"})
    assert isinstance(sent, SiteError)
    assert str(sent) == ("site 'hospital-a' failed in train: KeyError; the details stay in its log")
    assert "cholesterol" in caplog.text  # the full text, in the site's own log
    public = PublicError("site 'hospital-a' refuses this run by its policy: DP off")
    assert _call(public, {"site": "hospital-a"}) is public  # written to be sent: as it is


def test_a_node_silent_without_a_failure_of_its_own_fails_unless_all_were_dropouts() -> None:
    """SecAgg+'s stages give failures without their node: a silent node is excused
    only when every such failure was a simulated dropout or a refusal."""
    part = Participation()
    part.asked = {1: [1, 2]}
    part.add(1, ["a"], [1], [])
    assert part.outcome([], 1, {})["problems"] == [
        "node 2 (asked in 1 round) never contributed: never replied"
    ]
    part.add(1, ["a"], [1], [RuntimeError("client 1 dropped out (dropout-rate=0.3)")])
    assert part.outcome([], 1, {})["status"] == "completed"
    part.add(1, ["a"], [1], [RuntimeError("CUDA out of memory")])
    assert part.outcome([], 1, {})["status"] == "failed"


def test_a_benchmark_cell_whose_run_failed_fails(tmp_path) -> None:
    """A simulated run's ServerApp fails inside Flower: the cell reads the outcome."""
    from benchmarks.runner import failed_run

    path = tmp_path / "results.json"
    failed_run(path)  # no results: the engine's own error says so
    path.write_text(json.dumps({"outcome": {"status": "completed", "problems": []}}))
    failed_run(path)
    path.write_text(json.dumps({"outcome": {"status": "failed", "problems": ["round 1: x"]}}))
    with pytest.raises(RunFailed, match="round 1: x"):
        failed_run(path)
