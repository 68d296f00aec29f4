"""#93: the soak (harness/soak.py): its seeded fault schedule, its invariants (each must
be able to fail), and a 5-minute soak of a real loopback deployment with a fault of
every kind, whose kept records are then broken on purpose (a reply of a run before a
restart counted after it) and checked again: the soak fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.loopback import REPO
from harness.soak_check import Records, check_replies, check_state_chain, evaluate
from harness.soak_faults import KINDS, SERVER_KINDS, Fault, netns_available, schedule
from strategies.reply_log import arrays_digest, replay

SITES = ["site-a", "site-b", "site-c", "site-d"]


def test_the_schedule_is_seeded_and_holds_every_kind() -> None:
    short = schedule(5, 0, SITES, 20.0, "site-a")
    assert {f.kind for f in short} == set(KINDS)
    assert short == schedule(5, 0, SITES, 20.0, "site-a")  # the seed decides it all
    assert short != schedule(5, 1, SITES, 20.0, "site-a")
    assert [f.at for f in short] == sorted(f.at for f in short)
    assert max(f.at for f in short) < 5 * 60 * 0.85
    kills = [f for f in short if f.kind == "site-kill"]
    assert all(f.target in SITES for f in short if f.kind not in SERVER_KINDS)
    assert all(0 <= f.seconds <= 40 for f in kills)
    # without namespaces the proxy still cuts
    bare = {f.kind for f in schedule(5, 0, SITES, 20.0, None)}
    assert "partition-netns" not in bare and "partition-proxy" in bare
    hour = schedule(60, 0, SITES, 30.0, "site-a")
    assert len(hour) >= 30 and {f.kind for f in hour} == set(KINDS)
    restarts = [f.seconds for f in hour if f.kind == "superlink-restart"]
    assert len(restarts) >= 2 and min(restarts) < 10 and max(restarts) > 60  # both regimes
    assert sum(f.kind == "serverapp-kill" for f in hour) >= 2
    stalls = {f.kind: f.seconds for f in hour if "stall" in f.kind}
    assert stalls["site-stall-long"] > 30 > stalls["site-stall-short"]  # the round timeout


def _line(run: int, rnd: int, sha: str, state: list | None = None) -> dict:
    return {"type": "train", "run": run, "run_name": "soak-fedper", "round": str(rnd),
            "sha256": sha, "state": state or [], "error": "", "arrays": [1]}  # fmt: skip


def test_a_reply_of_a_run_before_a_restart_counted_after_it_breaks_the_invariant() -> None:
    ledgers = {"site-a": [_line(1, 3, "aa"), _line(2, 1, "bb")]}
    log = [
        {"kind": "reply", "run": 1, "round": 3, "client_key": "site-a", "sha256": "aa", "seq": 0},
        {"kind": "aggregate", "run": 1, "round": 3, "done": 3},
        {"kind": "reply", "run": 2, "round": 1, "client_key": "site-a", "sha256": "bb", "seq": 0},
        {"kind": "aggregate", "run": 2, "round": 1, "done": 4},
    ]
    assert check_replies(ledgers, log).holds
    replayed = {**log[0], "run": 2, "round": 1, "seq": 1}  # run 1's reply, folded into run 2
    broken = check_replies(ledgers, [*log[:3], replayed, log[3]])
    assert not broken.holds
    assert any("counted site-a's reply to run 1 round 3" in p for p in broken.problems)
    assert any("counted 2 times" in p for p in broken.problems)


def test_a_state_rolled_back_or_lost_breaks_the_chain() -> None:
    gens = {None: 0, "s1": 1, "s2": 2, "s3": 3, "s5": 5, "s6": 6}

    def fit(restored: str | None, saved: str) -> list:
        got = [{"restored": restored, "generation": gens[restored]}] if restored else []
        return [*got, {"saved": saved, "parent": restored, "generation": gens[restored] + 1}]

    good = {"site-a": [_line(1, 1, "x", fit(None, "s1")), _line(1, 2, "y", fit("s1", "s2"))]}
    assert check_state_chain([], good).holds
    rolled = {"site-a": [*good["site-a"], _line(1, 3, "z", fit("s1", "s2"))]}
    assert "restored s1" in check_state_chain([], rolled).problems[0]
    lost = {"site-a": [*good["site-a"], _line(1, 3, "z", fit(None, "s1"))]}
    assert "started afresh" in check_state_chain([], lost).problems[0]
    # a later generation: fits whose replies never left (their ledger lines missing)
    ahead = {"site-a": [*good["site-a"], _line(1, 6, "z", fit("s5", "s6"))]}
    assert check_state_chain([], ahead).holds
    # a saved state that is not the child of what the fit restored
    forged = {
        "site-a": [
            *good["site-a"],
            _line(1, 3, "z", [{"saved": "s3", "parent": "s1", "generation": 3}]),
        ]
    }
    assert not check_state_chain([], forged).holds
    # the state before the newest, after a corrupt newest: only with a corrupt-state fault
    corrupt = [{"corrupt": "site-a.npz"}, {"restored": "s1", "from": "previous", "generation": 1}]
    after = [*corrupt, {"saved": "s3", "parent": "s1", "generation": 2}]
    fell_back = {"site-a": [*good["site-a"], _line(1, 3, "z", after)]}
    assert not check_state_chain([], fell_back).holds
    fault = Fault(1.0, "corrupt-state", "site-a", 0.0, {"start": 1.0})
    assert check_state_chain([fault], fell_back).holds


def test_a_run_that_stopped_short_breaks_the_rounds_invariant_a_verdict_does_not(
    tmp_path: Path,
) -> None:
    """A run whose supervisor gave up before its last round was lost; one that ran to
    its last round and was judged failed by its ServerApp (a round with no reply,
    named) is recorded, not lost."""
    from harness.soak_check import check_rounds

    (tmp_path / "soak-fedper").mkdir()
    rounds = [{"round": 1, "replies": 4}, {"round": 2, "replies": 0, "failed": ["node 1: timeout"]}]
    (tmp_path / "soak-fedper" / "results.json").write_text(json.dumps({"rounds": rounds}))
    events = tmp_path / "events.jsonl"
    segment = {"name": "soak-fedper", "rounds": 2, "exit": 1, "events": str(events)}
    fields = dict.fromkeys(["t0", "seconds", "seed", "minutes"], 0)
    rec = Records(**fields, out="", runs_dir=str(tmp_path), sites=[], state_dirs={},
                  site_logs={}, exits={}, workload={}, samples=[], rounds_seen=[],
                  segments=[segment], faults=[], errors=[])  # fmt: skip
    ended = {"event": "ended", "file": str(events), "run": 9, "status": "finished:failed"}
    verdict = [{**ended, "checkpoint": 2, "details": "round 2: no reply was aggregated"}]
    held = check_rounds(rec, verdict, [])
    assert held.holds and "judged failed after its last round" in held.line()
    assert not check_rounds(rec, [{**verdict[0], "checkpoint": 1}], []).holds


@pytest.mark.slow
def test_a_five_minute_soak_with_every_fault_holds_and_a_replayed_reply_breaks_it(
    tmp_path: Path,
) -> None:
    """The CI soak: 5 minutes of faults (one of each kind; no namespace where the
    machine has none, the proxy cut then still runs), every invariant holds, the
    report and the plot are written. Then its kept records are broken as a server
    that counts a reply again after a restart would break them, and checked again."""
    out = tmp_path / "out"
    netns = [] if netns_available() else ["--no-netns"]
    cmd = [sys.executable, "-m", "harness.soak", "--minutes", "5", "--seed", "1"]
    cmd += ["--out", str(out), "--keep", "--segment", "25", "--secagg-rounds", "4", *netns]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    records = Records.load(out / "records.json") if (out / "records.json").exists() else None
    try:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert (out / "soak-1-5min.md").exists() and (out / "soak-1-5min.png").exists()
        faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
        kinds = {f["kind"] for f in faults}
        assert kinds == set(KINDS) - ({"partition-netns"} if netns else set())
        assert all({"start", "end", "kind", "target"} <= set(f) for f in faults)
        # break it: the first reply of the first run counted again in the last run's
        # last round, its aggregate made to match (a server that folded it)
        assert records is not None
        run_dir = Path(records.runs_dir) / "soak-fedper"
        index = run_dir / "replies" / "index.jsonl"
        log = [json.loads(line) for line in index.read_text().splitlines()]
        first = next(e for e in log if e["kind"] == "reply")
        last = [e for e in log if e["kind"] == "aggregate"][-1]
        assert last["run"] != first["run"]  # the ServerApp was restarted in between
        own = [
            e
            for e in log
            if e["kind"] == "reply" and (e["run"], e["round"]) == (last["run"], last["round"])
        ]
        again = {**first, "run": last["run"], "round": last["round"], "seq": 10**6}
        last["sha256"] = arrays_digest(replay(run_dir, [*own, again]))
        index.write_text("".join(json.dumps(e) + "\n" for e in [*log[:-1], again, last]))
        records.out = str(tmp_path / "broken")
        Path(records.out).mkdir()
        records.save(tmp_path / "broken.json")
        assert not evaluate(records, ["broken on purpose"])
        text = (tmp_path / "broken" / "soak-1-5min.md").read_text()
        assert "counted 2 times" in text and f"counted {first['client_key']}'s reply to run" in text
        result = subprocess.run(
            [sys.executable, "-m", "harness.soak_check", str(tmp_path / "broken.json")],
            cwd=REPO, capture_output=True, text=True,
        )  # fmt: skip
        assert result.returncode != 0
    finally:
        if records is not None:
            root = Path(records.runs_dir).parent
            assert root.name.startswith("pfsoak-")
            shutil.rmtree(root, ignore_errors=True)


def test_replay_is_the_weighted_mean_the_running_sum_made(tmp_path: Path) -> None:
    from strategies.reply_log import ReplyLog, read_log

    rng = np.random.default_rng(0)
    log = ReplyLog(tmp_path, 7)
    arrays = [[rng.normal(size=(3, 2)).astype(np.float32)] for _ in range(3)]
    for i, a in enumerate(arrays):
        log.reply(1, 1, i, f"c{i}", f"sha{i}", float(i + 1), a)
    from strategies.robust import weighted_mean

    mean = weighted_mean(arrays, [1.0, 2.0, 3.0])
    log.aggregate(1, 1, mean, 3)
    entries = read_log(tmp_path)
    assert arrays_digest(replay(tmp_path, entries[:3])) == entries[3]["sha256"]
    assert arrays_digest(replay(tmp_path, entries[:2])) != entries[3]["sha256"]
    assert os.path.exists(tmp_path / "replies" / entries[0]["file"])


def test_the_soak_submits_a_snapshot_an_edit_to_the_checkout_does_not_change(
    tmp_path: Path,
) -> None:
    """The app every soak run submits and every site approves is a copy taken at the
    start: the same build as the checkout (git's view of it), and an edit made to the
    tree afterwards changes the tree's build, not the copy's (an edit during a soak once
    got every later run refused by hash). A folder without git is copied less its
    venvs and outputs."""
    from deploy.site_guard import installed_app_hash
    from harness.soak import snapshot_app

    checkout, built = snapshot_app(REPO, tmp_path / "checkout")  # through git ls-files
    assert built == installed_app_hash(checkout) == installed_app_hash(REPO)
    assert not (checkout / ".git").exists() and not (checkout / ".venv").exists()
    (checkout / "outputs").mkdir()
    (checkout / "outputs" / "left.py").write_text("x = 1\n")
    copy, before = snapshot_app(checkout, tmp_path / "copy")  # no git there: the fallback
    assert before == installed_app_hash(checkout) and not (copy / "outputs").exists()
    with open(checkout / "harness" / "soak.py", "a") as f:
        f.write("# an edit made while the soak runs\n")
    assert installed_app_hash(checkout) != before
    assert installed_app_hash(copy) == before
