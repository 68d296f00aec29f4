"""What a run leaves behind: results.json (losses, best pooled accuracy,
provenance), rounds.csv, TensorBoard event files on request."""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import platform

import numpy as np
import pytest

from methods import parse_run_config
from pflower.config.schema import ConfigError
from pflower.engine.inprocess import run_inprocess
from pflower.results import CSV_COLUMNS, RunRecorder


def test_results_carry_losses_best_pooled_and_provenance(tmp_path) -> None:
    cfg = {
        "method": "fedper",
        "num-server-rounds": 3,
        "sim-samples": 60,
        "hidden-dim": 16,
        "output-dir": str(tmp_path),
        "run-name": "r",
    }
    res = run_inprocess(cfg, 3)
    for record in res["rounds"]:
        assert record["loss_mean"] > 0 and np.isfinite(record["loss_mean"])
        assert record["train_loss_mean"] > 0 and np.isfinite(record["train_loss_mean"])
    assert res["best_accuracy_pooled"] == max(r["accuracy_pooled"] for r in res["rounds"])
    prov = res["provenance"]
    assert prov["python"] == platform.python_version()
    assert prov["flwr"] == importlib.metadata.version("flwr") and prov["torch"]
    assert set(prov) == {"flwr", "torch", "python", "git_commit", "command"}
    rows = list(csv.DictReader((tmp_path / "r" / "rounds.csv").open()))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 3
    assert [float(r["accuracy_mean"]) for r in rows] == [r["accuracy_mean"] for r in res["rounds"]]
    assert float(rows[-1]["loss_mean"]) == pytest.approx(res["rounds"][-1]["loss_mean"])


def test_train_loss_is_the_mean_of_the_accepted_replies(tmp_path) -> None:
    from tests.helpers import FakeProxy, config, fit_res, make_strategy

    strategy = make_strategy(config(method="fedavg"))
    arrays = [a.copy() for a in strategy.global_arrays]
    strategy.aggregate_fit(
        1,
        [
            (FakeProxy(1), fit_res(arrays, "a", metrics={"train-loss": 1.0})),
            (FakeProxy(2), fit_res(arrays, "b", metrics={"train-loss": 3.0})),
            (FakeProxy(3), fit_res(arrays[:-1], "c", metrics={"train-loss": 99.0})),  # rejected
        ],
        [],
    )
    assert strategy.rounds[1].train_losses == [1.0, 3.0]


def test_tensorboard_writes_event_files_or_names_the_missing_extra(tmp_path) -> None:
    """With the optional extra installed, event files; without it, a config error
    naming the key (CI has no extra, a developer may): one test, never skipped."""
    cfg = parse_run_config({"tensorboard": True, "output-dir": str(tmp_path), "run-name": "tb"})
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match="'tensorboard'"):
            RunRecorder(cfg)
        return
    rec = RunRecorder(cfg)
    record = {"round": 1, "accuracy_mean": 0.5, "accuracy_pooled": 0.5}
    rec.add_round({**record, "bytes_up": 1, "bytes_down": 1, "seconds": 0.1})
    assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))


def test_provenance_never_records_a_secret_from_the_command_line() -> None:
    from pflower.results import redacted_command

    argv = ["/opt/venv/bin/flwr-serverapp", "--runtime-api-address", "superlink:8000"]
    argv += ["--token", "b1a72761", "--superexec-auth-secret-file=certs/superexec.secret"]
    argv += ["--auth-supernode-private-key=keys/site-a", "--root-certificates", "ca.crt"]
    assert redacted_command(argv) == (
        "/opt/venv/bin/flwr-serverapp --runtime-api-address superlink:8000 --token *** "
        "--superexec-auth-secret-file=certs/superexec.secret "
        "--auth-supernode-private-key=*** --root-certificates ca.crt"
    )


@pytest.mark.slow
def test_a_simulation_looks_up_its_commit_before_ray_forks(tmp_path, monkeypatch) -> None:
    """run_simulation builds the ServerApp in a thread while Ray forks its processes with
    a Python preexec_fn; a git child forked from that thread at the same moment hung a CI
    run. The commit is looked up in the calling thread, before the simulation starts,
    and the ServerApp runs only once Ray is up (serverapp-after-ray)."""
    import subprocess
    import threading
    from pathlib import Path

    import pflower.results
    from pflower.engine.simulate import simulate

    in_main_thread: list[bool] = []
    real_run = subprocess.run

    def spy(args, *rest, **kwargs):
        if args and args[0] == "git":
            in_main_thread.append(threading.current_thread() is threading.main_thread())
        return real_run(args, *rest, **kwargs)

    monkeypatch.setattr(pflower.results.subprocess, "run", spy)
    pflower.results.git_commit_once.cache_clear()
    from pflower.patches import start_order

    started: list[tuple[bool, bool]] = []  # (Flower's ServerApp thread, Ray up) at its run
    wait = start_order.serverapp_after_ray

    def recorded() -> float:
        waited = wait()
        started.append((start_order.is_simulation_serverapp_thread(), start_order.ray_is_up()))
        return waited

    monkeypatch.setattr(pflower.patches, "serverapp_after_ray", recorded)
    cfg = {"method": "fedavg", "num-server-rounds": 1, "sim-samples": 60, "hidden-dim": 16}
    res = simulate({**cfg, "output-dir": str(tmp_path), "run-name": "r"}, 2)
    assert in_main_thread and all(in_main_thread)  # looked up, and never from a thread
    assert started == [(True, True)]
    assert res["provenance"]["git_commit"] == pflower.results.git_commit_once(Path.cwd())


def test_results_name_the_federation_its_data_and_each_clients_figures(tmp_path) -> None:
    """results.json: the federation's size, one fingerprint of every client's data
    (the same data give the same fingerprint, other data another), the devices, and
    each client's sample counts, training loss and test loss per round."""
    from pflower.data import load_client_data

    base = {"method": "fedper", "num-server-rounds": 2, "hidden-dim": 16}
    runs = {}
    for name, samples in (("a", 60), ("b", 60), ("c", 80)):
        cfg = {**base, "sim-samples": samples, "output-dir": str(tmp_path), "run-name": name}
        runs[name] = run_inprocess(cfg, 3)
    res = runs["a"]
    assert res["federation_size"] == 3 and res["devices"] == {"cpu": 3}
    assert res["clients_with_data_digest"] == 3
    assert res["data_fingerprint"] == runs["b"]["data_fingerprint"]
    assert res["data_fingerprint"] != runs["c"]["data_fingerprint"]
    last = res["rounds"][-1]
    keys = [f"client-{i}" for i in range(3)]
    assert sorted(last["per_client_loss"]) == keys and sorted(last["per_client_train_loss"]) == keys
    cfg = parse_run_config({**base, "sim-samples": 60})
    for i, key in enumerate(keys):
        data = load_client_data(cfg, i, 3)
        assert last["per_client_samples"][key] == {"train": data.num_train, "test": 12}
        assert last["per_client_loss"][key] > 0
    assert np.mean(list(last["per_client_loss"].values())) == pytest.approx(last["loss_mean"])


def test_a_deployed_site_sends_no_digest_of_its_data(tmp_path) -> None:
    """The data fingerprint is a simulation fact: a node with a ``site`` (a deployed
    site) keeps a digest of its data to itself, which would let the server confirm
    which data it holds."""
    from models.roles import DATA_KEY

    fits: list = []
    cfg = {"method": "fedper", "num-server-rounds": 1, "sim-samples": 60, "hidden-dim": 16}
    sites = [{"site": f"site-{i}", "partition-id": i, "num-partitions": 2} for i in range(2)]
    res = run_inprocess(
        {**cfg, "output-dir": str(tmp_path), "run-name": "d"},
        2,
        lambda kind, cid, ins, reply: fits.append(reply) if kind == "fit" else None,
        sites,
    )
    assert len(fits) == 2 and all(DATA_KEY not in r.metrics for r in fits)
    assert all("device" in r.metrics for r in fits)
    assert res["data_fingerprint"] is None and res["clients_with_data_digest"] == 0


def test_a_main_job_summary_shows_its_seed_beside_the_committed_figures() -> None:
    """On the main job's data, federation and budget the summary adds this run's seed
    and final figure, its method's committed figure over the same seeds, and FedAvg's
    and Local's (pflower/results/reference.json, docs/main_job.md), each saying which it
    is; on other data, another federation size or another round count nothing."""
    from methods import parse_run_config
    from pflower.results import summary_table
    from pflower.results.reference import _settings, reference_rows

    (setting,) = _settings()
    main_job = parse_run_config({"method": "fedfac-static"}).as_dict()  # the defaults
    assert all(main_job[k] == v for k, v in setting["match"].items())  # it is the main job's
    clients, rounds = setting["clients"], setting["rounds"]
    rows = reference_rows(main_job, clients, rounds, "fedfac-static", 0.7)
    fedfac, fedavg = setting["rows"]["fedfac-static"], setting["rows"]["fedavg"]
    assert sorted(fedfac["seeds"]) == sorted(fedavg["seeds"]) == ["0", "1", "2"]  # the same
    assert rows == [
        ("FedFac (static), this run (seed 0)", "0.7000"),
        (
            "FedFac (static), same data (committed, seeds 0, 1, 2)",
            f"{fedfac['mean']:.4f} ± {fedfac['std']:.4f}",
        ),
        (
            "FedAvg, same data (committed, seeds 0, 1, 2)",
            f"{fedavg['mean']:.4f} ± {fedavg['std']:.4f}",
        ),
        ("Local, same data (committed, seeds 0, 1, 2)", rows[3][1]),
    ]
    assert reference_rows({**main_job, "sim-samples": 60}, clients, rounds, "fedavg") == []
    assert reference_rows(main_job, clients - 1, rounds, "fedavg") == []
    assert reference_rows(main_job, clients, rounds + 1, "fedavg") == []
    # FedAvg's own run: its own committed row first, then the others'
    assert [k for k, _ in reference_rows(main_job, clients, rounds, "fedavg", 0.6)][:2] == [
        "FedAvg, this run (seed 0)",
        "FedAvg, same data (committed, seeds 0, 1, 2)",
    ]
    summary = {
        "method": "fedfac-static",
        "config": main_job,
        "federation_size": clients,
        "rounds": [{}] * rounds,
        "best_accuracy_mean": 0.7,
        "best_round": rounds,
        "final_accuracy_mean": 0.7,
        "final_accuracy_pooled": 0.7,
        "best_accuracy_pooled": 0.7,
        "total_bytes_up": 1,
        "total_bytes_down": 1,
        "total_seconds": 1.0,
    }
    assert "FedFac (static), this run (seed 0)" in summary_table(summary)


def test_a_main_job_plot_draws_the_committed_curves_beside_the_run(tmp_path) -> None:
    """The plot of a run on the main job's data draws FedAvg's and Local's committed
    mean curves (with their seeds' range) beside the run's own, as far as the run
    went; read back from the lines the figure drew. On other data: the run alone."""
    from methods import parse_run_config
    from pflower.results import committed_curves, plot_accuracy, plotted_series
    from pflower.results.reference import _settings

    (setting,) = _settings()
    config = parse_run_config({"method": "fedfac-static"}).as_dict()
    rounds = [{"round": r, "accuracy_mean": 0.5 + r / 100} for r in (1, 2, 3)]
    summary = {"method": "fedfac-static", "config": config, "rounds": rounds}
    summary["federation_size"] = setting["clients"]
    plot_accuracy([summary], tmp_path / "a.png", committed_curves(summary))
    series = plotted_series(tmp_path / "a.png")
    assert list(series) == [
        "fedfac-static (this run, seed 0)",
        "FedAvg (committed, seeds 0, 1, 2): mean",
        "Local (committed, seeds 0, 1, 2): mean",
    ]
    assert series["fedfac-static (this run, seed 0)"] == [[1, 2, 3], [0.51, 0.52, 0.53]]
    fedavg = setting["rows"]["fedavg"]["curves"]
    mean = [sum(fedavg[s][r] for s in fedavg) / len(fedavg) for r in range(3)]
    assert series["FedAvg (committed, seeds 0, 1, 2): mean"][0] == [1, 2, 3]
    assert series["FedAvg (committed, seeds 0, 1, 2): mean"][1] == pytest.approx(mean)
    other = {**summary, "config": {**config, "sim-samples": 60}}
    plot_accuracy([other], tmp_path / "b.png", committed_curves(other))
    assert list(plotted_series(tmp_path / "b.png")) == ["fedfac-static"]


def test_the_summary_says_over_how_many_clients_each_mean_is_taken() -> None:
    """A late joiner changes who is scored: the table says how many, and the range."""
    from pflower.results import summary_table

    rounds = [
        {"round": 1, "per_client_accuracy": {"a": 0.5, "b": 0.5, "c": 0.5}},
        {"round": 2, "per_client_accuracy": {"a": 0.9, "b": 0.5, "c": 0.5, "d": 0.5}},
    ]
    summary = {
        "method": "ditto",
        "config": {},
        "rounds": rounds,
        "best_accuracy_mean": 0.6,
        "best_round": 2,
        "final_accuracy_mean": 0.6,
        "final_accuracy_pooled": 0.6,
        "best_accuracy_pooled": 0.6,
        "total_bytes_up": 1,
        "total_bytes_down": 1,
        "total_seconds": 1.0,
    }
    table = summary_table(summary)
    assert "final accuracy (mean over 4 clients)" in table
    assert "best accuracy (mean over 4 clients)" in table
    assert "clients scored a round" in table and "3 to 4" in table
    summary["rounds"] = rounds[1:]
    assert "clients scored a round" not in summary_table(summary)


def test_results_json_is_the_summary_indented_and_each_round_is_encoded_once(
    tmp_path, monkeypatch
) -> None:
    """results.json is ``json.dumps(summary, indent=2)`` to the byte, round after round
    and after a resume, while each round's record is encoded once (not every round
    again: that grew with the run)."""
    import json

    import pflower.results

    encoded: list[int] = []
    encode = pflower.results.encode_round
    monkeypatch.setattr(
        pflower.results, "encode_round", lambda r: encoded.append(r["round"]) or encode(r)
    )
    monkeypatch.setattr(pflower.results.time, "perf_counter", lambda: 7.0)  # total_seconds
    cfg = parse_run_config({"output-dir": str(tmp_path), "run-name": "r", "num-server-rounds": 9})
    rec = RunRecorder(cfg)
    assert rec.results_json() == json.dumps(rec.summary(), indent=2)  # no round yet: []
    for n in range(1, 5):
        scored = n % 2 == 0
        rec.add_round(
            {
                "round": n,
                "accuracy_mean": 0.1 * n if scored else None,
                "accuracy_pooled": 0.1 * n if scored else None,
                "per_client_accuracy": {"0": 0.5, "1": [1, {"a": None}]} if scored else {},
                "bytes_up": n,
                "bytes_down": n,
                "seconds": 0.25,
            }
        )
        assert rec.results_json() == json.dumps(rec.summary(), indent=2)
        assert json.loads(rec.results_path.read_text())["rounds"] == rec.rounds
    assert encoded == [1, 2, 3, 4]
    rec.resume(4, rec.rounds[:2], tmp_path / "state.npz")
    assert rec.results_json() == json.dumps(rec.summary(), indent=2)
    assert encoded == [1, 2, 3, 4, 1, 2]
