"""The site's own checks on every ClientApp (deploy/site_guard.py), unit by unit; the
loopback deployment tests (tests/test_deployment.py) run them in a site's SuperExec."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message, Metadata, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.compat.common.recorddict_compat import fitres_to_recorddict

from deploy import site_guard
from deploy.site_guard import (
    SiteGuard,
    fab_hash,
    ledger_line,
    ledger_table,
    parse_approved,
    read_ledger,
)
from pflower.privacy.policy import REFUSED

APP = b"the approved build"
OTHER = b"a modified build"


def test_approved_builds_are_sha256_digests_or_any() -> None:
    digest = fab_hash(APP)
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert parse_approved(f" {digest} ,{fab_hash(OTHER)}") == {digest, fab_hash(OTHER)}
    assert parse_approved("any") is None
    for bad in ("md5:abc", digest.upper(), digest[:-1], "sha256:" + "g" * 64):
        with pytest.raises(ValueError, match="sha256:<64"):
            parse_approved(bad)


def test_a_build_not_approved_is_refused_naming_its_hash() -> None:
    guard = SiteGuard(frozenset({fab_hash(APP)}))
    guard.task = {"node_config": {"site": "h"}}
    assert guard.refusal(APP) is None
    why = guard.refusal(OTHER)
    assert why is not None and fab_hash(OTHER) in why and "'approved-apps'" in why
    # the node config may approve more builds; 'any' there approves every build
    guard.task = {"node_config": {"site": "h", "approved-apps": fab_hash(OTHER)}}
    assert guard.refusal(OTHER) is None
    guard.task = {"node_config": {"site": "h", "approved-apps": "nonsense"}}
    assert "malformed" in (guard.refusal(APP) or "")
    # a node config that does not parse: every app refused, in a line naming the key
    guard.task = {"node_config": {"site": "h", "no-such-key": "1"}}
    assert "'no-such-key'" in (guard.refusal(APP) or "") and guard.site() == "?"
    assert SiteGuard(None).refusal(OTHER) is None  # --approved-apps any
    assert site_guard.REFUSED == REFUSED  # the server recognises the refusal


def test_a_refused_app_is_never_unpacked(monkeypatch) -> None:
    """The check wraps Flower's ClientApp runner: a refused FAB raises before Flower's
    own install step runs."""
    from flwr.supernode.runtime import run_clientapp as runner

    unpacked = []
    for name in ("pull_task_input", "install_from_fab", "push_message"):
        monkeypatch.setattr(runner, name, getattr(runner, name))  # restored after the test
    monkeypatch.setattr(runner, "install_from_fab", lambda content, **kw: unpacked.append(content))
    monkeypatch.setenv("PFLOWER_FLOWER_PATCHES", "0")  # the speed patches' switch: checks stay
    guard = SiteGuard(frozenset({fab_hash(APP)}))
    guard.install()
    guard.task = {"node_config": {"site": "h"}}
    with pytest.raises(PermissionError, match=REFUSED):
        runner.install_from_fab(OTHER, skip_prompt=True)
    runner.install_from_fab(APP, skip_prompt=True)
    assert unpacked == [APP]


def _fit_reply(arrays: list[np.ndarray], metrics: dict) -> Message:
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 12, metrics)
    meta = Metadata(7, "", 1, 0, "m", "3", 0.0, 60.0, "train")  # a fit reply of round 3
    return Message(fitres_to_recorddict(res, keep_input=True), metadata=meta)


def test_a_ledger_line_says_what_a_reply_carried(tmp_path) -> None:
    reply = _fit_reply(
        [np.zeros((4, 5), np.float32), np.ones(5, np.float32)],
        {"client-key": "h", "train-loss": 0.5},
    )
    line = ledger_line(reply, None, {"method": "fedper"}, app=fab_hash(APP))
    assert [(a["shape"], a["dtype"]) for a in line["arrays"]] == [
        ([4, 5], "float32"),
        ([5], "float32"),
    ]
    assert line["bytes"] == sum(a["bytes"] for a in line["arrays"]) > 4 * 25
    # every scalar that left, with its value
    assert line["metrics"]["fitres.metrics.client-key"] == "h"
    assert line["metrics"]["fitres.metrics.train-loss"] == 0.5
    assert line["metrics"]["fitres.num_examples.num_examples"] == 12
    assert line["type"] == "train" and line["round"] == "3" and not line["refused"]
    assert line["disclosures"] == []  # FedPer declares none
    site_guard.append(tmp_path / site_guard.LEDGER_FILE, {**line, "run": 7, "run_name": "trial"})
    (back,) = read_ledger(tmp_path)
    table = ledger_table([back])
    row = table.splitlines()[1]
    assert table.count("\n") == 1 and "fedper" in row and " trial " in row  # the run's name
    assert "2 tensors" in row and "train-loss=0.5" in row and "client-key=h" in row
    assert "(4, 5)" not in row and len(row) < 200  # no tensor list: the JSON has them


def test_an_error_reply_is_listed_with_the_text_that_left(tmp_path) -> None:
    """A failed reply carries its error text off the site: the ledger says so, with
    the text and its bytes."""
    from flwr.app import Error

    meta = Metadata(7, "", 1, 0, "m", "3", 0.0, 60.0, "train")
    text = "site 'h' failed in train: KeyError; the details stay in its log"
    reply = Message(Error(code=0, reason=text), reply_to=Message(RecordDict(), metadata=meta))
    line = ledger_line(reply, None, {"method": "fedper"}, app=fab_hash(APP))
    assert line["error"] == text and line["arrays"] == [] and not line["refused"]
    row = ledger_table([{**line, "run": 7}]).splitlines()[1]
    assert f"error: {text}" in row and f" {len(text.encode())} " in row


def test_a_reply_the_ledger_cannot_record_is_not_sent(tmp_path, monkeypatch) -> None:
    """#93: a full disk under the state directory. The reply the ledger cannot list
    does not leave: an error reply saying why goes in its place. The ledger line of a
    reply that is recorded carries the digest of its arrays as they left and what the
    personal-state store did in the task (the chain)."""
    from flwr.supernode.runtime import run_clientapp as runner

    from pflower.store import STATE_EVENTS

    pushed = []
    for name in ("pull_task_input", "install_from_fab", "push_message"):
        monkeypatch.setattr(runner, name, getattr(runner, name))  # restored after the test
    monkeypatch.setattr(runner, "push_message", lambda client, msg, ctx: pushed.append(msg))
    guard = SiteGuard(None)
    guard.install()
    meta = Metadata(7, "", 1, 0, "m", "3", 0.0, 60.0, "train")
    received = Message(RecordDict(), metadata=meta)
    reply = _fit_reply([np.ones(3, np.float32)], {"client-key": "h"})
    guard.task = {"node_config": {"site": "h", "state-dir": str(tmp_path)}, "received": received}
    STATE_EVENTS.clear()
    STATE_EVENTS.append({"saved": "ab" * 32, "parent": None, "generation": 1})
    runner.push_message(None, reply, None)
    (line,) = read_ledger(tmp_path)
    assert pushed == [reply] and line["state"] == [
        {"saved": "ab" * 32, "parent": None, "generation": 1}
    ]
    import hashlib

    data = b"".join(a.data for r in reply.content.array_records.values() for a in r.values())
    assert line["sha256"] == hashlib.sha256(data).hexdigest()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(site_guard, "append", full)
    runner.push_message(None, reply, None)
    sent = pushed[-1]
    assert sent is not reply and sent.has_error() and not sent.has_content()
    assert "could not record its reply in its ledger" in sent.error.reason
    assert "No space left on device" in sent.error.reason


def test_a_line_the_disk_had_no_room_for_is_not_left_half_written(tmp_path, monkeypatch) -> None:
    """#93 (found by the soak's full disk): a write cut short leaves the log as it was."""
    import os as os_module

    from pflower.store import append_line

    path = tmp_path / "log.jsonl"
    append_line(path, b'{"a": 1}\n')
    write = os_module.write
    monkeypatch.setattr(os_module, "write", lambda fd, data: write(fd, data[:5]))
    with pytest.raises(OSError, match="5 of 9 bytes"):
        append_line(path, b'{"b": 2}\n')
    monkeypatch.undo()
    assert path.read_bytes() == b'{"a": 1}\n'


def test_the_ledger_of_a_folder_without_one_exits_2(tmp_path, capsys) -> None:
    from deploy.site import main

    with pytest.raises(SystemExit) as stop:
        main(["--ledger", "--state-dir", str(tmp_path)])
    assert stop.value.code == 2 and "no ledger in" in capsys.readouterr().err
    site_guard.append(tmp_path / site_guard.LEDGER_FILE, {"run": 1, "x": 1})
    main(["--ledger", "--json", "--state-dir", str(tmp_path)])
    assert capsys.readouterr().out.strip() == '{"run": 1, "x": 1}'
