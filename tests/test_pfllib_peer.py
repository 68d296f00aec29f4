"""benchmarks/pfllib_peer.py without PFLlib: a tiny partition exported to per-client
image folders (and to one parquet file) is read back by our loader with the same
counts and labels; the driver's hooks record a PFLlib-shaped server; a trace becomes
results.json as PFLlib's loop defines its rounds; a missing checkout is one line.
The tests that need PFLlib itself skip, saying so, where ``PFLLIB_DIR`` is unset."""

from __future__ import annotations

import ast
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from benchmarks import pfllib_peer as peer

NAMES = ["airplane", "automobile", "bird"]
NEEDS_PFLLIB = pytest.mark.skipif(
    not os.environ.get("PFLLIB_DIR"),
    reason="needs a PFLlib checkout in PFLLIB_DIR (" + peer.GET_PFLLIB + ")",
)


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


Tiny = tuple[list[bytes], np.ndarray, list[tuple[np.ndarray, np.ndarray]]]


@pytest.fixture
def tiny() -> Tiny:
    """18 images of 3 classes, split over 3 clients as a dir partition would: client 2
    has no 'automobile', client 1's test split has one class only."""
    labels = np.array([0, 1, 2] * 6, dtype=np.int64)  # row r is of class r % 3
    rows = [
        (np.array([0, 1, 2, 3, 4]), np.array([5, 6])),
        (np.array([7, 8, 9, 10, 11, 12]), np.array([13])),
        (np.array([14, 15]), np.array([17])),
    ]
    return [png(i) for i in range(len(labels))], labels, rows


def test_tiny_partition_is_what_the_fixture_says(tiny: Tiny) -> None:
    _, labels, rows = tiny
    everything = np.concatenate([np.concatenate(pair) for pair in rows])
    assert len(set(everything.tolist())) == len(everything)  # no row given twice
    assert 1 not in labels[np.concatenate(rows[2])]  # client 2 lacks 'automobile'


def test_folders_read_back_by_our_loader_with_the_same_counts(tiny: Tiny, tmp_path: Path) -> None:
    """Each client's folder, read by our loader through client-data-paths and
    class-names, has the partition's train and test counts and label histograms
    (by name: client 2, without 'automobile', keeps the other classes' ids)."""
    pngs, labels, rows = tiny
    folders = peer.export_client_folders(tmp_path / "clients", pngs, rows, labels, NAMES)
    assert (folders[0] / "train" / "airplane" / "00000.png").read_bytes() == pngs[0]
    config = {
        "method": "fedavg",
        "client-data-paths": ",".join(str(f) for f in folders),
        "class-names": ",".join(NAMES),
    }
    want = peer.client_summary(rows, labels, NAMES)
    got = peer.loader_counts(config, len(rows))
    for w, g in zip(want, got, strict=True):
        for key in ("train", "test", "train_labels", "test_labels"):
            assert g[key] == w[key], (w["client"], key)


def test_parquet_read_back_by_our_loader_with_the_same_counts(tiny: Tiny, tmp_path: Path) -> None:
    """The one-file export, naturally partitioned by ``client`` with its ``split``
    column, gives each client the partition's rows (label ids: one source)."""
    pngs, labels, rows = tiny
    source = tmp_path / "source.parquet"
    features = {"img": {"_type": "Image"}, "label": {"names": NAMES, "_type": "ClassLabel"}}
    table = pa.table(
        {
            "img": pa.array(
                [{"bytes": b, "path": None} for b in pngs],
                type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            ),
            "label": pa.array(labels, type=pa.int64()),
        }
    )
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), source)
    assert peer.class_names_of(source) == NAMES
    out = tmp_path / "ours.parquet"
    peer.export_parquet(out, source, rows, NAMES)
    config = {
        "method": "fedavg",
        "dataset": str(out),
        "partitioner": "natural",
        "partition-by": "client",
    }
    want = peer.client_summary(rows, labels, NAMES)
    got = peer.loader_counts(config, len(rows))
    for w, g in zip(want, got, strict=True):
        for key in ("train", "test"):
            assert g[key] == w[key]
        for key in ("train_labels", "test_labels"):
            assert g[key] == {str(NAMES.index(k)): v for k, v in w[key].items()}


def test_a_missing_checkout_is_one_line_saying_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PFLLIB_DIR", raising=False)
    for given in (None, tmp_path / "nowhere", tmp_path):
        with pytest.raises(peer.PfllibMissing) as err:
            peer.pfllib_checkout(given)
        message = str(err.value)
        assert "\n" not in message
        assert "git clone https://github.com/TsingZ0/PFLlib" in message
        assert "checkout d832e76" in message
    (tmp_path / "system").mkdir()
    (tmp_path / "system" / "main.py").write_text("")
    (tmp_path / "dataset" / "utils").mkdir(parents=True)
    (tmp_path / "dataset" / "utils" / "dataset_utils.py").write_text("")
    monkeypatch.setenv("PFLLIB_DIR", str(tmp_path))
    assert peer.pfllib_checkout() == tmp_path.resolve()


def test_main_py_arguments() -> None:
    """PFLlib's defaults but ours (-nc 10, CPU), -mu 0.01 for FedProx only, our names
    mapped to PFLlib's spelling, and extra options after (argparse keeps the last)."""
    argv = peer.pfllib_argv("fedprox", 30, ["-mu", "0.1"])
    assert argv[:4] == ["-algo", "FedProx", "-gr", "30"]
    pairs = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert pairs["-nc"] == "10" and pairs["-dev"] == "cpu" and pairs["-lbs"] == "10"
    assert argv[-4:] == ["-mu", "0.01", "-mu", "0.1"]
    assert "-mu" not in peer.pfllib_argv("FedAvg", 2)
    assert peer.pfllib_argv("LG", 1)[1] == "LG-FedAvg"
    assert peer.pfllib_name("fedrod") == "FedROD" and peer.pfllib_name("per-fedavg") == "PerAvg"
    # the driver finds the h5 file by the options' last values, as argparse reads them
    assert peer.last(argv, "-mu") == "0.1" and peer.last(argv, "-go", "test") == "test"


class FakeClient:
    def __init__(self, id: int, samples: int, correct: int) -> None:
        self.id, self.samples, self.correct = id, samples, correct


def fake_server_classes(trace: peer.Trace) -> type:
    """A server shaped as PFLlib's (serverbase.Server, a Ditto-like subclass defined
    after the hooks), hooked, and run for ``global_rounds`` + 1 iterations."""

    class Server:
        def __init__(self) -> None:
            self.num_join_clients = 2
            self.rs_test_acc: list[float] = []
            self.clients = [FakeClient(0, 4, 1), FakeClient(1, 6, 6)]

        def test_metrics(self) -> tuple:
            ids = [c.id for c in self.clients]
            return (
                ids,
                [c.samples for c in self.clients],
                [c.correct * 1.0 for c in self.clients],
                [],
            )

        def train_metrics(self) -> tuple:
            return [0, 1], [1, 1], [0.0, 0.0]

        def evaluate(self) -> None:
            stats = self.test_metrics()
            self.train_metrics()
            self.rs_test_acc.append(sum(stats[2]) / sum(stats[1]))

    peer.install(Server, trace)

    class Ditto(Server):
        def __init__(self) -> None:
            super().__init__()
            self.Budget: list[float] = []

        def test_metrics_personalized(self) -> tuple:
            return [0, 1], [4, 6], [4.0, 3.0], []

        def evaluate_personalized(self) -> None:
            stats = self.test_metrics_personalized()
            self.rs_test_acc.append(sum(stats[2]) / sum(stats[1]))

        def train(self, rounds: int) -> None:
            for _ in range(rounds + 1):
                self.evaluate()
                self.evaluate_personalized()
                self.clients[0].correct += 1  # "training"
                self.Budget.append(1.5)

    return Ditto


def test_the_hooks_record_each_evaluation_per_client_and_each_round() -> None:
    """Without changing the server's code: every value appended to rs_test_acc comes
    with the per-client counts of the test_metrics* call that made it, and every
    Budget entry is a round."""
    trace = peer.Trace()
    server = fake_server_classes(trace)()
    server.train(2)
    assert server.rs_test_acc == [e["value"] for e in trace.evaluations]
    assert len(trace.evaluations) == 6 and len(trace.iterations) == 3
    first, personal = trace.evaluations[0], trace.evaluations[1]
    assert first["kind"] == "test_metrics" and personal["kind"] == "test_metrics_personalized"
    assert first["samples"] == [4, 6] and first["correct"] == [1.0, 6.0]
    assert trace.evaluations[2]["correct"] == [2.0, 6.0]  # after one round's "training"
    assert [e["iteration"] for e in trace.evaluations] == [0, 0, 1, 1, 2, 2]
    assert trace.join_clients == 2
    assert all(i["seconds"] == 1.5 and i["eval_seconds"] >= 0 for i in trace.iterations)


def trace_of(evaluations: list[tuple[int, list[int], list[int]]], rounds: int) -> dict:
    """A driver's trace: (iteration, samples, correct) evaluations, 1 s iterations."""
    evals = [
        {
            "value": sum(c) / sum(n),
            "iteration": it,
            "kind": "test_metrics",
            "ids": list(range(len(n))),
            "samples": n,
            "correct": [float(x) for x in c],
        }
        for it, n, c in evaluations
    ]
    return {
        "iterations": [{"seconds": 10.0 + i, "eval_seconds": 2.0} for i in range(rounds + 1)],
        "evaluations": evals,
        "join_clients": 2,
        "h5": {"rs_test_acc": [e["value"] for e in evals]},
        "started_at": 0.0,
        "ended_at": 50.0,
        "torch_threads": 1,
    }


def test_rounds_as_pfllibs_loop_defines_them() -> None:
    """-gr 2 runs 3 iterations, each evaluating before it trains: round r is the
    evaluation at iteration r, timed by iteration r - 1; pooled is correct over all
    test samples, mean the clients' mean; best as PFLlib's max(rs_test_acc)."""
    trace = trace_of([(0, [10, 30], [1, 3]), (1, [10, 30], [9, 3]), (2, [10, 30], [5, 15])], 2)
    res = peer.results_from_trace(trace, {"seed": 0}, "fedavg", "PFLlib")
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    one, two = res["rounds"]
    assert one["accuracy_pooled"] == pytest.approx(12 / 40)
    assert one["accuracy_mean"] == pytest.approx((0.9 + 0.1) / 2)
    assert two["accuracy_pooled"] == pytest.approx(20 / 40)
    assert one["per_client_accuracy"] == {"client-0": 0.9, "client-1": 0.1}
    assert (one["seconds"], two["seconds"]) == (10.0, 11.0)
    assert res["initial"]["accuracy_pooled"] == pytest.approx(4 / 40)
    assert res["best_accuracy_pooled"] == pytest.approx(0.5)
    assert res["best_accuracy_mean"] == pytest.approx(0.5)  # round 1's 0.5 ties round 2's
    assert res["final_accuracy_pooled"] == pytest.approx(0.5)
    assert res["seconds_per_client_round"] == pytest.approx(11.0 / 2)  # after round 1
    assert res["train_seconds_per_client_round"] == pytest.approx(9.0 / 2)
    assert res["h5_matches_trace"] is True
    assert peer.seconds_per_client_round(res) == pytest.approx(11.0 / 2)


def test_two_evaluations_an_iteration_and_one_after_the_loop() -> None:
    """Ditto's iteration evaluates twice: the round is the last (personalized); an
    evaluation after the loop (FedBABU's fine-tuned models) is the final one."""
    trace = trace_of(
        [
            (0, [10, 10], [1, 1]),
            (0, [10, 10], [2, 2]),
            (1, [10, 10], [3, 3]),
            (1, [10, 10], [8, 8]),
            (2, [10, 10], [9, 10]),
        ],
        1,
    )
    res = peer.results_from_trace(trace, {}, "ditto", "PFLlib")
    (only,) = res["rounds"]
    assert only["accuracy_pooled"] == pytest.approx(0.8)
    assert list(only["other_evaluations"].values()) == [pytest.approx(0.3)]
    assert res["after_training"][0]["accuracy_pooled"] == pytest.approx(0.95)
    assert res["final_accuracy_pooled"] == pytest.approx(0.95)
    assert res["best_accuracy_pooled"] == pytest.approx(0.95)


def test_table_has_a_row_per_results_file(tmp_path: Path) -> None:
    res = peer.results_from_trace(
        trace_of([(0, [5], [1]), (1, [5], [2]), (2, [5], [3])], 2),
        {"seed": 1, "algorithm": "FedAvg"},
        "fedavg",
        "PFLlib",
    )
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    lines = peer.table([path, path]).splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("| PFLlib | FedAvg | 1 | 2 | 0.6000 |")


def test_the_module_imports_nothing_of_ours_at_the_top() -> None:
    """It also runs inside PFLlib's environment, in PFLlib's ``system/``: its top
    imports are the standard library's and numpy."""
    tree = ast.parse(Path(peer.__file__).read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert top - set(sys.stdlib_module_names) - {"__future__"} == {"numpy"}


def test_h5_results_read_back(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py", reason="h5py is PFLlib's environment's, not ours")
    with h5py.File(tmp_path / "r.h5", "w") as f:
        f.create_dataset("rs_test_acc", data=[0.1, 0.4])
        f.create_dataset("rs_test_auc", data=[])
    assert peer.read_h5(tmp_path / "r.h5") == {"rs_test_acc": [0.1, 0.4], "rs_test_auc": []}


@NEEDS_PFLLIB
def test_every_mapped_algorithm_is_one_main_py_knows() -> None:
    main = (peer.pfllib_checkout() / "system" / "main.py").read_text()
    for name in [*peer.METHODS.values(), *peer.ALIASES.values()]:
        assert f'args.algorithm == "{name}"' in main, name


@pytest.mark.parametrize("method", sorted(peer.METHODS))
def test_our_side_of_each_mapped_method_is_a_valid_run_config(method: str, tmp_path: Path) -> None:
    """``run-ours``'s config for every mapped method parses (profile='pfllib', cnn4),
    so a grid's runs of ours do not fail on a key after PFLlib's side has run."""
    from methods import parse_run_config

    folders = [str(tmp_path / f"client-{i}") for i in range(2)]
    manifest = {"clients": 2, "client_folders": folders, "class_names": list(NAMES)}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    cfg = parse_run_config(peer.ours_config(tmp_path, method, 0, 1))
    assert (cfg.profile, cfg.model, cfg.lr, cfg.batch_size) == ("pfllib", "cnn4", 0.005, 10)


# ----------------------------------------------------------------------------- the preset


def fake_partition(root: Path) -> list[str]:
    folders = [str(root / "clients" / f"client-{i}") for i in range(2)]
    manifest = {"clients": 2, "client_folders": folders, "class_names": list(NAMES)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return folders


def test_preset_placeholders_read_the_partition_manifest(tmp_path: Path) -> None:
    folders = fake_partition(tmp_path)
    assert peer.preset_partition("partition", tmp_path) == ",".join(folders)
    assert peer.preset_partition("classes", tmp_path) == ",".join(NAMES)


def test_a_preset_partition_without_checkout_is_one_line(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PFLLIB_DIR", raising=False)
    with pytest.raises(peer.PfllibMissing, match="get it with: git clone"):
        peer.preset_partition("partition", tmp_path / "none")


def test_a_pfllib_cell_is_complete_to_the_runner_and_refuses_what_pfllib_lacks(
    monkeypatch, tmp_path: Path
) -> None:
    """run_preset_cell keeps the cell's config in results.json, so the runner's own
    completeness check (a resumed grid skips the cell) passes; PFLlib's goes beside."""
    from benchmarks import presets

    folders = fake_partition(tmp_path / "partition")
    config = {
        "method": "fedprox",
        "seed": 2,
        "profile": "pfllib",
        "model": "cnn4",
        "client-data-paths": ",".join(folders),
        "class-names": ",".join(NAMES),
        "num-server-rounds": 2,
        "output-dir": str(tmp_path / "runs"),
        "run-name": "fedprox_pfllib-seed2",
    }
    cell = presets.Cell("p", "default", "fedprox pfllib", 2, "pfllib", 2, 2, config)
    asked = {}

    def fake_run(checkout, partition, algorithm, seed, rounds, out, *rest):
        asked.update(partition=partition, algorithm=algorithm, seed=seed, rounds=rounds)
        res = peer.results_from_trace(
            trace_of([(0, [5, 5], [1, 1]), (1, [5, 5], [2, 2]), (2, [5, 5], [3, 3])], 2),
            {"algorithm": algorithm, "seed": seed},
            "fedprox",
            "PFLlib",
        )
        (out / "results.json").write_text(json.dumps(res))
        return res

    monkeypatch.setattr(peer, "run", fake_run)
    assert not presets.is_complete(cell)
    res = peer.run_preset_cell(config, 2, cell.dir)
    assert asked == {
        "partition": tmp_path / "partition",
        "algorithm": "FedProx",
        "seed": 2,
        "rounds": 2,
    }
    assert res["pfllib"]["algorithm"] == "FedProx"
    assert presets.is_complete(cell)
    with pytest.raises(SystemExit, match="PFLlib has no 'fedfac-static'"):
        peer.run_preset_cell({**config, "method": "fedfac-static"}, 2, cell.dir)
    with pytest.raises(SystemExit, match="client-data-paths = '{pfllib-partition}'"):
        peer.run_preset_cell({**config, "client-data-paths": ""}, 2, cell.dir)


def test_the_shipped_preset_runs_each_method_on_both_sides() -> None:
    from benchmarks import presets

    preset = presets.load("pfllib-methods")
    rows = {(method, variant.get("engine")) for _, method, variant in preset.rows()}
    assert rows == {(m, e) for m in preset.methods for e in ("pfllib", "inprocess")}
    assert set(preset.methods) <= set(peer.METHODS)
    assert preset.config["client-data-paths"] == "{pfllib-partition}"


def test_the_paired_report_pairs_seeds_both_sides_have(tmp_path: Path) -> None:
    head = "setting,row,method,seed,rounds,clients,best_accuracy_mean,best_accuracy_pooled,"
    rows = [
        head + "seconds_per_round",
        "default,fedprox pfllib,fedprox,0,2,2,0.40,0.50,4.0",
        "default,fedprox ours,fedprox,0,2,2,0.42,0.52,2.0",
        "default,fedprox pfllib,fedprox,1,2,2,0.50,0.60,4.0",
        "default,fedprox ours,fedprox,1,2,2,0.44,0.54,2.0",
        "default,fedprox ours,fedprox,2,2,2,0.99,0.99,2.0",  # PFLlib's seed 2 not run
        "default,apfl pfllib,apfl,0,2,2,0.70,0.70,4.0",
        "default,apfl ours,apfl,0,2,2,0.60,0.60,2.0",
        "default,scaffold pfllib,scaffold,0,2,2,0.5,0.5,4.0",
        "default,scaffold ours,scaffold,0,1,2,0.9,0.9,2.0",  # stopped before its last round
    ]
    (tmp_path / "p.csv").write_text("\n".join(rows) + "\n")
    lines = peer.paired_table(tmp_path / "p.csv", rounds=2).splitlines()
    assert len(lines) == 4  # fedprox and apfl
    fedprox = [c.strip() for c in lines[2].strip("|").split("|")]
    assert fedprox == [
        *("fedprox", "0, 1", "55.0 (7.1)", "53.0 (1.4)", "-2.0", "yes"),
        *("45.0 (7.1)", "43.0 (1.4)", "2.00", "1.00"),
    ]
    apfl = [c.strip() for c in lines[3].strip("|").split("|")]
    assert apfl[:6] == ["apfl", "0", "70.0", "60.0", "-10.0", "no"]


def test_the_dev_set_is_where_the_presets_find_it() -> None:
    from benchmarks import presets

    assert peer.DEV_SET == presets.CIFAR10_DEV


def test_the_peer_names_every_method_whose_card_names_pfllibs() -> None:
    """The runner's map (importable in PFLlib's environment) agrees with the cards."""
    from methods import get_method, method_names

    cards = {m: get_method(m).pfllib for m in method_names() if get_method(m).pfllib}
    assert cards == {m: peer.METHODS[m] for m in cards}
