"""The one-message protocol (eval-in-fit, the default): round r's fit replies
carry round r-1's evaluation, one evaluate message closes the run. The personalised
model a client scores at the start of its fit is exactly what a separate evaluate
message would have scored, so results.json must be the same, round by round."""

from __future__ import annotations

import pytest

from methods import parse_run_config
from pflower.engine.inprocess import run_inprocess

SMALL = {"sim-samples": 60, "hidden-dim": 16, "num-server-rounds": 3}


def run(method: str, eval_in_fit: bool, tmp_path, messages: list) -> dict:
    config = {
        **SMALL,
        "method": method,
        "eval-in-fit": eval_in_fit,
        "output-dir": str(tmp_path),
        "run-name": f"{method}-{eval_in_fit}",
    }
    return run_inprocess(config, 3, record=lambda kind, *_: messages.append(kind))


@pytest.mark.parametrize(
    "method",
    [
        "fedper",
        "fedbn",
        "feddecomp",
        "fedcp",
        "factorized-fl-beta",
        "fedfac-dynamic",
        "dualfed",
        "fedavg-ft",
    ],
)
def test_one_message_per_round_gives_the_same_results(method: str, tmp_path) -> None:
    one_msgs: list[str] = []
    two_msgs: list[str] = []
    one = run(method, True, tmp_path, one_msgs)
    two = run(method, False, tmp_path, two_msgs)
    assert [r["round"] for r in one["rounds"]] == [1, 2, 3]
    for a, b in zip(one["rounds"], two["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"], a["round"]
        assert a["loss_mean"] == pytest.approx(b["loss_mean"], rel=1e-9)
        assert a["bytes_up"] == b["bytes_up"] and a["bytes_down"] == b["bytes_down"]
    # messages: 3 fits per round, and evaluations only to close the run
    assert one_msgs.count("fit") == two_msgs.count("fit") == 9
    assert one_msgs.count("evaluate") == 3 and two_msgs.count("evaluate") == 9


def test_auto_keeps_two_messages_where_new_clients_are_scored_in_evaluate() -> None:
    assert parse_run_config({"method": "fedper"}).eval_in_fit
    assert parse_run_config({"method": "fedfac-static"}).eval_in_fit
    assert not parse_run_config({"method": "fedfac-static", "fedfac.new-clients": 1}).eval_in_fit
    assert parse_run_config(
        {"method": "fedfac-static", "fedfac.new-clients": 1, "eval-in-fit": True}
    ).eval_in_fit


def test_a_client_that_misses_a_round_has_no_evaluation_for_the_round_before(tmp_path) -> None:
    config = {
        **SMALL,
        "num-server-rounds": 4,
        "method": "fedper",
        "dropout-rate": 0.4,
        "output-dir": str(tmp_path),
        "run-name": "drop",
    }
    trained: dict[int, set[str]] = {}  # round -> the clients whose fit replied
    closing: set[str] = set()

    def record(kind: str, cid: str, instruction, reply) -> None:
        key = f"client-{int(cid) - 1}"  # node i + 1 holds partition i
        if kind == "fit":
            trained.setdefault(int(instruction.config["server-round"]), set()).add(key)
        else:
            closing.add(key)

    res = run_inprocess(config, 3, record=record)
    assert [r["round"] for r in res["rounds"]] == [1, 2, 3, 4]
    scored = {r["round"]: set(r["per_client_accuracy"]) for r in res["rounds"]}
    for r in (1, 2, 3):  # round r's model is scored by exactly the clients of round r + 1
        assert scored[r] == trained[r + 1], r
    assert scored[4] == closing  # the last, by the closing evaluation
    # not vacuous: someone dropped out of a fit, and so has no score for the round before
    assert any(len(trained[r + 1]) < 3 for r in (1, 2, 3))
