"""``evaluate-every``: the model is scored after every Nth round and after the last;
the rounds between keep their records (time, bytes, bounds) without accuracy, and
their clients score nothing. Scoring never changes training, so the rounds that are
scored score exactly what a run that scores every round scores."""

from __future__ import annotations

import json

import pytest

from methods import parse_run_config
from pflower.config.schema import ConfigError
from pflower.engine.inprocess import run_inprocess

SMALL = {"sim-samples": 60, "hidden-dim": 16, "num-server-rounds": 5}


def run(tmp_path, name: str, messages: list, **keys) -> dict:
    config = {**SMALL, "method": "fedper", "output-dir": str(tmp_path), "run-name": name, **keys}

    def record(kind: str, cid: str, instruction, reply) -> None:
        scored = kind == "evaluate" or any(k.startswith("eval-") for k in reply.metrics)
        messages.append((kind, int(instruction.config["server-round"]), scored))

    return run_inprocess(config, 3, record=record)


@pytest.mark.parametrize("eval_in_fit", [True, False])
def test_every_third_round_and_the_last_are_scored_as_when_every_round_is(
    tmp_path, eval_in_fit: bool
) -> None:
    every_msgs: list = []
    all_msgs: list = []
    every = run(tmp_path, f"every-{eval_in_fit}", every_msgs, **{
        "evaluate-every": 3, "eval-in-fit": eval_in_fit,
    })  # fmt: skip
    each = run(tmp_path, f"each-{eval_in_fit}", all_msgs, **{"eval-in-fit": eval_in_fit})
    assert [r["round"] for r in every["rounds"]] == [1, 2, 3, 4, 5]
    scored = [r["round"] for r in every["rounds"] if r["accuracy_mean"] is not None]
    assert scored == [3, 5]
    for a, b in zip(every["rounds"], each["rounds"], strict=True):
        assert a["bytes_up"] == b["bytes_up"] and a["bytes_down"] == b["bytes_down"]
        assert a["per_client_train_loss"] == b["per_client_train_loss"], a["round"]
        if a["round"] in scored:
            assert a["per_client_accuracy"] == b["per_client_accuracy"], a["round"]
            assert a["loss_mean"] == b["loss_mean"]
        else:
            assert a["accuracy_pooled"] is None and a["per_client_accuracy"] == {}
            assert a["seconds"] > 0 and a["replies"] == 3
            assert set(a["per_client_samples"]) == set(b["per_client_samples"])
    assert every["final_accuracy_mean"] == each["final_accuracy_mean"]
    assert every["best_round"] in scored
    # the clients scored only the rounds asked: in fits of the round after (eval-in-fit)
    # or in evaluate messages of the round itself, and the closing evaluation
    scoring = sorted({(kind, r) for kind, r, s in every_msgs if s})
    if eval_in_fit:
        assert scoring == [("evaluate", 5), ("fit", 4)]
    else:
        assert scoring == [("evaluate", 3), ("evaluate", 5)]
    assert sum(1 for _, _, s in all_msgs if s) > sum(1 for _, _, s in every_msgs if s)
    # what a reader of the run sees: rounds.csv has every round, the plot the scored ones
    run_dir = tmp_path / f"every-{eval_in_fit}"
    assert len((run_dir / "rounds.csv").read_text().splitlines()) == 1 + 5
    assert json.loads((run_dir / "results.json").read_text())["rounds"][1]["accuracy_mean"] is None
    assert (run_dir / "accuracy.png").stat().st_size > 0


def test_evaluate_every_is_validated_naming_the_key() -> None:
    assert parse_run_config({"method": "fedavg"}).evaluate_every == 1
    with pytest.raises(ConfigError, match="evaluate-every"):
        parse_run_config({"method": "fedavg", "evaluate-every": 0})
