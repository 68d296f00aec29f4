"""Benchmarks as data: preset files, the grid, resume, the report, the engines."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import presets, report, runner
from benchmarks.__main__ import main
from benchmarks.runner import fedfac_recovery, linear_probe
from tests.helpers import image_folder


def _preset(tmp_path: Path, text: str, name: str = "trial") -> presets.Preset:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return presets.load(str(path))


GRID = """
description = "a grid"
methods = ["fedavg", "local"]
clients = 3
rounds = 2
[config]
dataset = "synthetic"
lr = 0.1
[method-config.local]
lr = 0.2
[variants.small]
sim-samples = 60
[variants.alone]
method = "fedper"
lr = 0.3
[settings.a]
hidden-dim = 16
[settings.b]
clients = 4
rounds = 3
paper = { fedavg = "50.0" }
"""


def test_every_shipped_preset_is_a_valid_grid_of_run_configs(monkeypatch, tmp_path):
    from methods import parse_run_config

    # data placeholders stand for a file name here: nothing is decoded or written
    monkeypatch.setattr(
        presets, "resolve", lambda v: str(presets.CIFAR10_DEV) if v == "{dev}" else v
    )
    assert len(presets.names()) >= 20
    for name in presets.names():
        preset = presets.load(name)
        assert preset.description, name
        for cell in preset.cells(runs=tmp_path):
            placeholder = {k for k, v in cell.config.items() if isinstance(v, str) and "{" in v}
            config = {k: v for k, v in cell.config.items() if k not in placeholder}
            if "pretrained-weights" in placeholder:  # a weight file: stands for the file
                config["pretrained-weights"] = "imagenet"
            parse_run_config(config)  # every key known, every value valid


def test_rows_settings_and_key_precedence(tmp_path):
    preset = _preset(tmp_path, GRID)
    labels = [label for label, _, _ in preset.rows()]
    # each method with each variant, then a variant that names its own method, alone
    assert labels == ["fedavg", "fedavg small", "local", "local small", "alone"]
    cells = preset.cells(seeds=[0, 1], runs=tmp_path / "runs")
    assert len(cells) == 2 * 2 * 5
    by = {(c.setting, c.label, c.seed): c for c in cells}
    assert by["a", "fedavg", 0].config["lr"] == 0.1  # [config]
    assert by["a", "local", 0].config["lr"] == 0.2  # method-config over config
    assert by["a", "alone", 0].config["lr"] == 0.3  # a variant over everything
    assert by["a", "alone", 0].config["method"] == "fedper"
    assert by["a", "local small", 1].config["sim-samples"] == 60
    assert by["a", "fedavg", 0].config["hidden-dim"] == 16
    b = by["b", "fedavg", 1]
    assert (b.clients, b.rounds, b.config["num-server-rounds"]) == (4, 3, 3)
    assert "paper" not in b.config and "clients" not in b.config  # reserved keys
    assert preset.paper("b") == {"fedavg": "50.0"}
    # distinct directories: no two cells share results
    assert len({c.dir for c in cells}) == len(cells)


@pytest.mark.parametrize(
    "text, message",
    [
        ('methods = ["fedavgx"]', "unknown"),
        ('methods = ["fedavg"]\nengine = "ray"', "engine"),
        ('methods = ["fedavg"]\n[config]\ndataset = "{cifar}"', "placeholder"),
        ('methods = ["fedavg"]\n[settings.dir0.5]\nalpha = 0.5', "quote names with dots"),
        ('methods = ["fedavg"]\n[variants.x]\nflower = "1.40"', "flower '1.40' not in"),
    ],
)
def test_a_bad_preset_fails_naming_the_problem(tmp_path, text, message):
    with pytest.raises(SystemExit, match=message):
        _preset(tmp_path, text).cells(runs=tmp_path)


def test_a_cell_on_another_flower_line_runs_in_that_lines_environment(tmp_path, monkeypatch):
    """``flower`` picks the cell's interpreter: this one for its own line (or none
    named), the other line's venv otherwise, made by dev.sh when it is missing."""
    from pflower.flower_lines import installed

    preset = _preset(
        tmp_path,
        'methods = ["fedavg"]\nbase-row = false\n[variants.old]\nflower = "1.39"\n'
        '[variants.new]\nflower = "1.42"\n[variants.any]\nengine = "inprocess"',
    )
    lines = {c.label: c.flower for c in preset.cells(runs=tmp_path)}
    assert lines == {"fedavg old": "1.39", "fedavg new": "1.42", "fedavg any": ""}
    assert all("flower" not in c.config for c in preset.cells(runs=tmp_path))  # reserved
    here = installed("flwr")[:4]  # "1.39" or "1.42"
    other = "1.42" if here == "1.39" else "1.39"
    assert runner.flower_python("") == runner.flower_python(here) == sys.executable
    made = []
    monkeypatch.setattr(runner, "REPO", tmp_path)  # no venv there: dev.sh is asked
    monkeypatch.setattr(runner.subprocess, "run", lambda cmd, **kw: made.append((cmd, kw)))
    python = runner.flower_python(other)
    venv = tmp_path / (".venv" if other == "1.39" else ".venv-flwr142")
    assert python == str(venv / "bin" / "python")
    ((cmd, kw),) = made
    assert cmd == ["bash", "scripts/dev.sh", "check"] and kw["env"]["PFLOWER_FLOWER"] == other
    assert kw["env"]["VENV"] == str(venv)
    assert kw["env"].get("PFLOWER_FLOWER_BASE") == (sys.prefix if other == "1.42" else None)


def test_dev_subset_placeholder_makes_a_seeded_subset_once(tmp_path):
    import pyarrow.parquet as pq

    path = presets.subset_parquet(50, 0, tmp_path)
    again = presets.subset_parquet(50, 0, tmp_path)
    assert path == again and pq.read_table(path).num_rows == 50
    assert presets.subset_parquet(0, 0, tmp_path) == str(presets.CIFAR10_DEV)


def test_domain_placeholder_writes_disjoint_per_site_image_folders(tmp_path):
    import io

    import datasets
    from PIL import Image

    from pflower.data.hf import load_source

    rng = np.random.default_rng(0)
    pngs = []
    for _ in range(40):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(buf, "PNG")
        pngs.append({"bytes": buf.getvalue(), "path": None})
    feats = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])}
    )
    labels = [i % 2 for i in range(40)]
    source = tmp_path / "tiny.parquet"
    datasets.Dataset.from_dict({"img": pngs, "label": labels}, features=feats).to_parquet(
        str(source)
    )

    folders = presets.domain_folders(2, tmp_path / "cache", str(source))
    assert folders == presets.domain_folders(2, tmp_path / "cache", str(source))  # made once
    files = [sorted(Path(f).rglob("*.png")) for f in folders]
    rows = [{int(p.stem) for p in fs} for fs in files]
    assert not rows[0] & rows[1] and rows[0] | rows[1] == set(range(40))  # disjoint, all
    for fs in files:  # the class folder keeps the label id and name
        assert all(p.parent.name == ("0-a", "1-b")[labels[int(p.stem)]] for p in fs)
    gray = np.asarray(Image.open(files[1][0]).convert("RGB"))  # domain 1: grayscale
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    site = load_source(folders[0])  # what a site with client-data-paths reads
    assert sorted(site.labels.tolist()) == sorted(labels[r] for r in rows[0])


def _fake(cell: presets.Cell, accs: list[float], up: int, seconds: list[float], **top) -> None:
    rounds = [
        {
            "round": i + 1,
            "accuracy_mean": a,
            "accuracy_pooled": a - 0.01,
            "bytes_up": up,
            "bytes_down": 2 * up,
            "seconds": s,
            "failures": i,
            "per_client_accuracy": {"client-0": a},
        }
        for i, (a, s) in enumerate(zip(accs, seconds))
    ]
    cell.dir.mkdir(parents=True, exist_ok=True)
    res = {
        "config": cell.config,
        "rounds": rounds,
        "best_accuracy_mean": max(accs),
        "final_accuracy_mean": accs[-1],
        "best_accuracy_pooled": max(accs) - 0.01,
        "final_accuracy_pooled": accs[-1] - 0.01,
        **top,
    }
    (cell.dir / "results.json").write_text(json.dumps(res))


def test_complete_needs_every_round_and_the_same_config(tmp_path):
    cell = _preset(tmp_path, GRID).cells(seeds=[0], runs=tmp_path)[0]
    assert not runner.is_complete(cell)
    _fake(cell, [0.5], 10, [1.0])  # 1 of 2 rounds
    assert not runner.is_complete(cell)
    _fake(cell, [0.5, 0.6], 10, [1.0, 2.0])
    assert runner.is_complete(cell)
    changed = presets.Cell(**{**cell.__dict__, "config": {**cell.config, "lr": 0.123}})
    assert not runner.is_complete(changed)  # a changed preset reruns the cell
    _fake(cell, [0.5, 0.6], 10, [1.0, 2.0], federation_size=cell.clients)
    assert runner.is_complete(cell)
    more = presets.Cell(**{**cell.__dict__, "clients": cell.clients * 10})
    assert not runner.is_complete(more)  # the federation's size is not in the config


def test_a_run_of_another_engine_or_size_is_not_found_elsewhere(tmp_path):
    """A cell with no run of its own reuses one of the same experiment found under
    another folder, never one made by another engine or on another federation."""
    text = GRID.replace('methods = ["fedavg", "local"]', 'methods = ["fedavg"]')
    runs = tmp_path / "runs"
    cell = _preset(tmp_path, text).cells(seeds=[0], runs=runs)[0]
    other = _preset(tmp_path, text, name="renamed").cells(seeds=[0], runs=runs)[0]
    _fake(cell, [0.5, 0.6], 10, [1.0, 2.0], federation_size=cell.clients)
    (cell.dir / "cell.json").write_text(json.dumps({"ok": True, "engine": cell.engine}))
    assert presets._found_elsewhere(other, runs).dir == cell.dir
    (cell.dir / "cell.json").write_text(json.dumps({"ok": True, "engine": "simulation"}))
    assert presets._found_elsewhere(other, runs).dir == other.dir


def test_a_run_made_before_an_auto_default_changed_is_redone(tmp_path):
    """A key the method reads and the preset leaves ``auto`` is compared as resolved now;
    a key the run predates, or one the method does not read, is not."""
    from methods import parse_run_config

    text = GRID.replace('methods = ["fedavg", "local"]', 'methods = ["dualfed"]')
    cell = _preset(tmp_path, text).cells(seeds=[0], runs=tmp_path)[0]
    resolved = parse_run_config(cell.config).as_dict()
    _fake(cell, [0.5, 0.6], 10, [1.0, 2.0])
    res = json.loads((cell.dir / "results.json").read_text())
    for stored, complete in (
        ({**resolved}, True),
        (
            {**resolved, "dualfed.global-head-epochs": resolved["dualfed.global-head-epochs"] + 4},
            False,
        ),
        ({**resolved, "factorized-fl.epsilon": 99.0}, True),  # Factorized-FL's key
        ({k: v for k, v in resolved.items() if k != "dualfed.global-prior"}, True),
    ):
        (cell.dir / "results.json").write_text(json.dumps({**res, "config": stored}))
        assert runner.is_complete(cell) is complete, stored


def test_a_key_set_to_auto_compares_as_resolved(tmp_path):
    """A setting may put a schedule key back to 'auto' (the preset's [config] set it):
    the run stores the resolved value, and the cell is complete with it."""
    from methods import parse_run_config

    cell = _preset(tmp_path, GRID).cells(seeds=[0], runs=tmp_path)[0]
    cell = presets.Cell(**{**cell.__dict__, "config": {**cell.config, "lr": "auto"}})
    resolved = parse_run_config(cell.config).as_dict()
    _fake(cell, [0.5, 0.6], 10, [1.0, 2.0])
    res = json.loads((cell.dir / "results.json").read_text())
    (cell.dir / "results.json").write_text(json.dumps({**res, "config": resolved}))
    assert runner.is_complete(cell)
    (cell.dir / "results.json").write_text(
        json.dumps({**res, "config": {**resolved, "lr": resolved["lr"] * 3}})
    )
    assert not runner.is_complete(cell)  # an auto that now resolves otherwise reruns


def test_summary_statistics_and_extras(tmp_path):
    preset = _preset(tmp_path, GRID)
    c0, c1 = [c for c in preset.cells(seeds=[0, 1], runs=tmp_path) if c.label == "fedavg"][:2]
    _fake(c0, [0.5, 0.7], 300, [9.0, 2.0], probe={"index_recovery": 0.25})
    _fake(c1, [0.6, 0.9], 300, [9.0, 4.0], probe={"index_recovery": 0.75})
    row = report.summarise([c0, c1])
    assert row["n"] == 2
    assert np.mean(row["final"]) == pytest.approx(0.8)
    assert report._pct(row["final"]) == "80.0 ± 14.1"  # sample std of 0.7, 0.9
    assert row["mb"] == pytest.approx(900 / 1e6 / 3)  # a round's up + down, per client
    assert row["s_round"] == pytest.approx(3.0)  # the rounds after the first
    res = json.loads((c0.dir / "results.json").read_text())
    assert report.extra_value(res, "index_recovery") == 0.25  # the probe
    assert report.extra_value(res, "failures:sum") == 1.0  # per-round, aggregated
    assert report.extra_value(res, "failures") == 1.0  # final round by default
    assert report.extra_value(res, "absent") is None
    # a row with no complete run says why
    missing = [c for c in preset.cells(seeds=[0], runs=tmp_path) if c.label == "local"]
    assert report.summarise(missing) == {"n": 0, "reason": "not run"}


def test_the_recovery_probe_compares_the_final_split_with_the_teacher():
    from methods import parse_run_config
    from pflower.data import simulation_study

    config = {"dataset": "synthetic", "method": "fedfac-static", "sim-samples": 40}
    truth = simulation_study(parse_run_config(config), 3).shared_neurons
    res = {"config": config, "rounds": [{"fa_shared_mask": {"features.1": truth.tolist()}}]}
    assert fedfac_recovery(res, 3) == {"index_recovery": 1.0}
    res["rounds"][-1]["fa_shared_mask"] = {"features.1": (~truth).tolist()}
    assert fedfac_recovery(res, 3) == {"index_recovery": 0.0}


def test_the_linear_probe_reads_the_run_checkpoint_encoder(tmp_path):
    from pflower.config.schema import ConfigError
    from pflower.engine.inprocess import run_inprocess

    cfg = {"method": "fedavg", "num-server-rounds": 3, "sim-samples": 200, "hidden-dim": 32}
    res = run_inprocess({**cfg, "output-dir": str(tmp_path), "run-name": "r"}, 3)
    assert 0.0 <= linear_probe(res, 3)["linear_probe_accuracy"] <= 1.0
    # the checkpoint it reads is the run's own: another method's run is refused
    with pytest.raises(ConfigError, match="fedavg"):
        linear_probe({**res, "config": {**res["config"], "method": "fedper"}}, 3)


def test_the_machine_reference_is_timed_and_tabulated_with_its_spread():
    """The reference step is a real timing (positive, torch's thread count put back);
    the report's table lists each row's before and after and the setting's spread."""
    import torch

    from benchmarks import machine
    from benchmarks.report import machine_table

    threads = torch.get_num_threads()
    assert 0.1 < machine.reference_ms(steps=3, warmup=1) < 1000
    assert torch.get_num_threads() == threads
    assert machine.spread([8.0, 10.0, 9.0]) == pytest.approx(0.25)
    assert machine.spread([]) == 0.0
    rows = {
        "a": {"reference_ms": [[8.0, 9.0]]},
        "b": {"reference_ms": [[10.0, 8.5]]},
        "c": {"reference_ms": []},  # a cell run without it: left out
    }
    lines = machine_table(rows)
    assert any("25% above the fastest" in ln for ln in lines)
    assert "| `a` | 8.00 | 9.00 |" in lines and "| `b` | 10.00 | 8.50 |" in lines
    assert not any("`c`" in ln for ln in lines)
    assert machine_table({"c": {"reference_ms": []}}) == []


def test_the_cost_plot_draws_each_rows_cost_against_the_clients(tmp_path):
    """``[report] cost-plot`` (the scale presets): per row, each setting's complete cell
    of the lowest seed, its median s/client-round after round 1 and its peak, ordered by
    the clients; with no complete cell it draws nothing."""
    text = """
description = "cost"
methods = ["fedavg"]
rounds = 2
[settings.large]
clients = 30
[settings.small]
clients = 3
[report]
cost-plot = true
"""
    preset = _preset(tmp_path, text)
    cells = preset.cells(seeds=[0, 1], runs=tmp_path / "runs")
    assert not report.cost_plot(preset, cells, tmp_path / "none.png")
    for cell in (c for c in cells if c.seed == 0):  # seed 1 never ran: seed 0 is drawn
        _fake(cell, [0.5, 0.6], 10, [9.0, 6.0], federation_size=cell.clients)
        status = {"ok": True, "peak_rss": 2e8 * cell.clients}
        (cell.dir / "cell.json").write_text(json.dumps(status))
    small = next(c for c in cells if c.seed == 0 and c.clients == 3)
    res = json.loads((small.dir / "results.json").read_text())
    for r in res["rounds"]:
        r["replies"] = 3
    (small.dir / "results.json").write_text(json.dumps(res))
    # round 1 (start-up) left out; small: 6 s over 3 replies; large records no replies
    assert report.cost_points(preset, cells) == {"fedavg": [(3, 2.0, 0.6), (30, 6.0, 6.0)]}
    path = report.write(preset, cells, ["(test)"], out=tmp_path / "out")
    assert "![cost](trial-cost.png)" in path.read_text()
    assert (tmp_path / "out" / "trial-cost.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_preset_runs_reports_resumes_and_isolates_a_crash(tmp_path, capsys):
    out = tmp_path / "docs"
    text = f"""
description = "tiny"
methods = ["fedavg", "local"]
clients = 3
rounds = 2
[config]
dataset = "synthetic"
sim-samples = 60
hidden-dim = 16
[variants.plain]
method = "local"
engine = "plain"
[report]
out = "{out}"
per-client = true
ratio-to = "plain"
machine-reference = true
"""
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    runs = tmp_path / "runs"
    args = ["run", str(path), "--runs", str(runs)]
    assert main(args) == 0
    preset = presets.load(str(path))
    cells = preset.cells(runs=runs)
    results = {c.label: json.loads((c.dir / "results.json").read_text()) for c in cells}
    assert {len(r["rounds"]) for r in results.values()} == {2}
    assert results["fedavg"]["total_bytes_up"] > 0 and results["local"]["total_bytes_up"] == 0
    assert len(results["plain"]["rounds"][-1]["per_client_accuracy"]) == 3  # the plain loop
    status = json.loads((cells[0].dir / "cell.json").read_text())
    assert status["peak_rss"] > 10e6
    before, after = status["reference_ms"]  # the machine's step around the cell
    assert 0.1 < before < 1000 and 0.1 < after < 1000
    md = (out / "tiny.md").read_text()
    assert f"python -m benchmarks run {path}" in md
    assert f"| `fedavg` | {before:.2f} | {after:.2f} |" in md
    assert "| `fedavg` | 1 |" in md and "| `plain` | 1 |" in md and "x plain" in md
    assert (out / "tiny-default.png").stat().st_size > 10_000
    mtimes = {c.label: os.stat(c.dir / "results.json").st_mtime_ns for c in cells}

    # rerun: nothing runs again, the results are untouched
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("complete, reused") == 3
    assert {c.label: os.stat(c.dir / "results.json").st_mtime_ns for c in cells} == mtimes

    # an invalid config stops the preset before any cell runs (#46: exit 2, one line)
    path.write_text(text + '[variants.broken]\nmethod = "fedavg"\nalpha = -1.0\n')
    assert main(args) == 2
    assert "preset error: tiny: config key 'alpha'" in capsys.readouterr().err
    # missing data stop it before any cell runs too (#106: the pre-flight of each data)
    path.write_text(text + '[variants.broken]\nmethod = "fedavg"\ndataset = "/no/such.parquet"\n')
    assert main(args) == 2
    assert "config key 'dataset'" in capsys.readouterr().err
    # a cell that crashes at run time (a checkpoint that is not there) fails alone, the
    # exit code says so
    path.write_text(text + '[variants.broken]\nmethod = "fedavg"\nresume-from = "/no/such"\n')
    assert main(args) == 1
    md = (out / "tiny.md").read_text()
    assert "| `broken` | 0 | failed: exit code" in md and "resume-from" in md
    # a row the commands left out says so, without calling it a failure
    path.write_text(text + '[variants.later]\nmethod = "local"\n')
    assert main([*args, "--rows", "plain"]) == 0
    assert "| `later` | 0 | not run |" in (out / "tiny.md").read_text()
    assert {c.label: os.stat(c.dir / "results.json").st_mtime_ns for c in cells} == mtimes

    # --settings picks table columns by name; a name the preset lacks is an error
    capsys.readouterr()
    assert main([*args, "--settings", "default", "--rows", "plain"]) == 0
    assert capsys.readouterr().out.count("complete, reused") == 1
    with pytest.raises(SystemExit):
        main([*args, "--settings", "label-skew"])
    assert "unknown settings ['label-skew']" in capsys.readouterr().err


def test_the_report_draws_heatmaps_and_tabulates_phases(tmp_path):
    preset = _preset(
        tmp_path,
        GRID + f'[report]\nout = "{tmp_path / "docs"}"\nheatmap = "ffl_mixture"\n',
    )
    cells = [c for c in preset.cells(seeds=[0], runs=tmp_path / "runs") if c.setting == "a"]
    for c in cells:
        _fake(c, [0.5, 0.6], 10, [1.0, 2.0])
        res = json.loads((c.dir / "results.json").read_text())
        for r in res["rounds"]:
            r["server_seconds"] = {"configure": 0.1, "waiting for clients": 2.0, "aggregate": 0.2}
            r["ffl_mixture"] = {"clients": ["a", "b"], "matrix": [[0.7, 0.3], [0.4, 0.6]]}
        if c.label == "fedavg":
            res["client_phases"] = {"queued": 1.5, "app imports": 2.5, "train": 0.5}
        (c.dir / "results.json").write_text(json.dumps(res))
    rows = {c.label: report.summarise([c]) for c in cells}
    lines = report.phases_table(rows)
    assert any(ln.startswith("| client: queued | 1.5 |") for ln in lines)
    assert any(ln.startswith("| server: waiting for clients | 2 |") for ln in lines)
    path = tmp_path / "plot.png"
    report.plot(preset, "a", rows, path)
    assert path.stat().st_size > 10_000
    # no client phases anywhere (a simulation): no phase table
    for row in rows.values():
        row["results"][0].pop("client_phases", None)
    assert report.phases_table(rows) == []


ONE_DEPLOYED_ROUND = """
description = "one deployed round"
methods = ["fedper"]
engine = "deployment"
clients = 2
rounds = 1
[config]
dataset = "synthetic"
sim-samples = 40
"""


@pytest.mark.slow
def test_a_deployment_cell_counts_wire_bytes_and_logs_each_message(tmp_path):
    cell = _preset(tmp_path, ONE_DEPLOYED_ROUND).cells(runs=tmp_path / "runs")[0]
    runner.run_cell(cell, timeout=600)
    res = json.loads((cell.dir / "results.json").read_text())
    assert res["run_status"] == "finished:completed" and len(res["rounds"]) == 1
    assert res["wire_bytes_up"] > res["rounds"][0]["bytes_up"] > 0  # gRPC frames around it
    phases = res["client_phases"]
    # per client: the class-list query before round 1, a fit and the closing evaluate
    assert phases["messages"] == 6
    assert {"queued", "python+flwr", "app imports", "train"} <= set(phases)


class _FailingFederation:
    """A loopback federation whose run ends failed with no results, as a crashed
    ServerApp's does; its ``flwr log`` is a traceback."""

    def __init__(self, root: Path, isolation: str, warm: bool) -> None:
        from types import SimpleNamespace

        self.nodes, self.procs, self.fleet_port, self.asked = {}, [], 1, []
        self.site = SimpleNamespace(text=lambda: "SuperNode ID")

    def start_superlink(self) -> None:
        pass

    def start_supernode(self, *args):
        return self.site

    def wait_for(self, *args) -> None:
        pass

    def run(self, config) -> int:
        return 7

    def wait_run(self, run_id: int, timeout: float) -> str:
        return "finished:failed"

    def flwr(self, *args):
        from types import SimpleNamespace

        self.asked.append(args)
        return SimpleNamespace(stdout="early line\n" * 50 + "RuntimeError: planted\n")

    def close(self) -> None:
        pass


def test_a_deployed_run_that_fails_stops_its_cell_with_the_end_of_its_log(tmp_path, monkeypatch):
    import harness.loopback as loopback

    feds: list[_FailingFederation] = []
    monkeypatch.setattr(
        loopback,
        "LoopbackFederation",
        lambda *a, **k: feds.append(_FailingFederation(*a, **k)) or feds[-1],
    )
    monkeypatch.setattr(loopback, "CountingRelay", lambda port: type("R", (), {"port": 2})())
    cell = _preset(tmp_path, ONE_DEPLOYED_ROUND).cells(runs=tmp_path / "runs")[0]
    cell.dir.mkdir(parents=True)
    with pytest.raises(RuntimeError, match="ended 'finished:failed'") as err:
        runner._deployment(cell, warm=False)
    assert feds[0].asked == [("log", "7", "loopback", "--show")]
    message = str(err.value)
    assert message.endswith("RuntimeError: planted")  # the ServerApp's own error
    assert message.count("early line") == runner.LOG_TAIL - 1  # the end of the log only


@pytest.mark.slow
def test_pfl_research_runs_the_same_workload_beside_our_engine(tmp_path):
    """The side-by-side's CI variant: pfl-research (installed into its own environment
    on first use) and our in-process engine train FedAvg on the same 4 clients' data
    from the same initial weights; both write a run's results.json that the report
    tables, with seconds per client-round and the ratio to pfl-research."""
    text = """
description = "pfl-research beside ours"
methods = ["fedavg"]
base-row = false
clients = 4
rounds = 3
[config]
dataset = "synthetic"
sim-samples = 60
hidden-dim = 16
lr = 0.1
local-epochs = 5
fraction-fit = 0.5
[variants.pfl-research]
engine = "pfl"
[variants.in-process]
engine = "inprocess"
[report]
ratio-to = "fedavg pfl-research"
per-client-round = true
"""
    preset = _preset(tmp_path, text)
    cells = preset.cells(runs=tmp_path / "runs")
    assert runner.run_preset(preset, cells, timeout=900) == []
    pfl, ours = (json.loads((c.dir / "results.json").read_text()) for c in cells)
    assert pfl["engine"].startswith("pfl-research") and pfl["federation_size"] == 4
    assert [r["replies"] for r in pfl["rounds"]] == [2, 2, 2]  # half the clients a round
    assert all(r["seconds"] > 0 for r in pfl["rounds"])
    assert sorted(pfl["rounds"][-1]["per_client_accuracy"]) == sorted(
        ours["rounds"][-1]["per_client_accuracy"]
    )
    # the same work: the two final models score alike on the same clients' test splits
    assert abs(pfl["final_accuracy_mean"] - ours["final_accuracy_mean"]) <= 0.15
    spec = json.loads((cells[0].dir / "pfl-spec.json").read_text())
    assert spec["cohort"] == 2 and spec["lr"] == 0.1 and spec["model"] == "mlp"
    text = report.write(preset, cells, ["(test)"], out=tmp_path / "report").read_text()
    assert "`fedavg pfl-research` | 1 |" in text and "x fedavg pfl-research" in text
    assert "s/client-round" in text


def test_the_floor_is_fedavg_on_every_core_whatever_the_split(tmp_path):
    """The side-by-side's floor (benchmarks/floor.py): FedAvg's local training alone in
    one process a core. Its rounds are marked as a run's, every client is scored after
    the last, the mean does not depend on how the cohort is split over processes, and
    with every client a round it learns what the in-process engine learns (its own
    shuffles: the same work, not the same bits)."""
    from benchmarks.floor import run_floor
    from pflower.engine.inprocess import run_inprocess

    config = {
        "method": "fedavg",
        "dataset": "synthetic",
        "sim-samples": 60,
        "hidden-dim": 16,
        "lr": 0.1,
        "local-epochs": 5,
        "fraction-fit": 0.5,
        "num-server-rounds": 3,
        "seed": 0,
    }
    run_floor(config, 4, tmp_path / "one", cores=1)
    run_floor(config, 4, tmp_path / "two", cores=2)
    one, two = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert [r["replies"] for r in two["rounds"]] == [2, 2, 2]  # half the clients a round
    assert all(r["seconds"] > 0 for r in two["rounds"])
    assert len(two["rounds"][-1]["per_client_accuracy"]) == 4
    assert one["rounds"][-1]["per_client_accuracy"] == two["rounds"][-1]["per_client_accuracy"]
    assert "2 processes" in two["engine"] and "1 process," in one["engine"]
    every = {**config, "fraction-fit": 1.0}
    run_floor(every, 4, tmp_path / "every", cores=2)
    floor = json.loads((tmp_path / "every" / "results.json").read_text())
    ours = run_inprocess({**every, "output-dir": str(tmp_path), "run-name": "ours"}, 4)
    assert abs(floor["final_accuracy_mean"] - ours["final_accuracy_mean"]) <= 0.1
    assert floor["final_accuracy_mean"] > 0.55  # two classes: above chance


@pytest.mark.slow
def test_a_user_preset_on_an_image_folder_reports_seeds_intervals_and_csv(tmp_path, capsys):
    """docs/examples/my-comparison.toml, pointed at a local image folder, smaller:
    its runs and report go to --out outside the repository, at an equal budget; the
    report has each seed's value, a 95% interval, and a CSV line per run."""
    import csv
    import tomllib

    example = Path(presets.REPO / "docs/examples/my-comparison.toml").read_text()
    raw = tomllib.loads(example)
    assert raw["equal-budget"] == "fedavg" and raw["config"]["dataset"].startswith("/path")
    images = image_folder(tmp_path / "my-images", per_class=30, side=8)
    text = example.replace(raw["config"]["dataset"], str(images))
    text = text.replace('"fedper", "feddecomp"', '"feddecomp"').replace("seeds = [0, 1, 2]", "")
    text = text.replace("clients = 10", "clients = 2").replace("rounds = 20", "rounds = 2")
    text = text.replace('model = "cnn4"', 'model = "mlp"\nhidden-dim = 8')
    path = tmp_path / "mine.toml"
    path.write_text(text)
    out = tmp_path / "elsewhere"
    assert main(["run", str(path), "--out", str(out), "--seeds", "0", "1"]) == 0
    runs = list((out / "runs" / "mine").glob("*/*/results.json"))
    assert len(runs) == 2 * 3 * 2  # settings x rows x seeds
    cfg = json.loads(runs[0].read_text())["config"]
    assert cfg["dataset"] == str(images)
    for res in (json.loads(p.read_text()) for p in runs):  # one schedule for every row
        assert res["config"]["local-epochs"] == 2 and res["config"]["optimizer"] == "sgd"
        assert res["config"]["lr"] == json.loads(runs[0].read_text())["config"]["lr"]
    md = (out / "mine.md").read_text()
    assert "95% CI" in md and "each seed" in md and "Equal budget: every row trains with" in md
    line = next(x for x in md.splitlines() if x.startswith("| `feddecomp` | 2 |"))
    lines = list(csv.DictReader((out / "mine.csv").open()))
    assert len(lines) == 12 and {x["seed"] for x in lines} == {"0", "1"}
    mine = [x for x in lines if x["row"] == "feddecomp" and x["setting"] == "skewed"]
    seeds = ", ".join(f"{100 * float(x['final_accuracy_mean']):.1f}" for x in mine)
    assert seeds in line  # the table's per-seed values are the CSV's
    # the interval as a reader should take it: clipped, 2 seeds flagged, equal seeds said
    shown = report.interval_text([100 * float(x["final_accuracy_mean"]) for x in mine])
    assert f"| {shown} |" in line and ("not meaningful" in shown or "seeds equal" in shown)
    assert not (presets.REPO / "docs/results/mine.md").exists()


def test_the_95_percent_interval_is_students_t():
    assert report.ci95([0.5]) is None
    low, high = report.ci95([0.7, 0.9])  # mean 0.8, s = 0.1414, t(0.975, 1) = 12.706
    assert (low + high) / 2 == pytest.approx(0.8)
    assert (high - low) / 2 == pytest.approx(12.706 * 0.1414214 / np.sqrt(2), rel=1e-4)


def test_secagg_masks_benchmark_compares_the_two_generators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reduced CI variant of ``python -m benchmarks.studies.secagg_masks``: the mask table
    at 2 sites, and the hook its ``--rounds`` runs use puts Flower's generator in
    place of the PRF in a fresh process (so the two columns are what they say)."""
    import subprocess
    import sys

    from benchmarks.studies import secagg_masks

    out = tmp_path / "masks.md"
    secagg_masks.main(["--sites", "2", "--repeats", "1", "--out", str(out)])
    rows = [r for r in out.read_text().splitlines() if r.startswith("| ") and "x |" in r]
    assert len(rows) == 2 and all(float(r.split("|")[-2].strip()[:-1]) > 0 for r in rows)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(secagg_masks.SITECUSTOMIZE)
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), repo])}
    probe = "import pflower.patches; print(pflower.patches.mask_arrays.__name__)"
    got = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert got.stdout.strip() == "pseudo_rand_gen", got.stderr


def test_dp_arrived_table_counts_both_epsilons_from_the_rounds() -> None:
    """benchmarks/studies/dp_arrived.py's table (its run is the slow e2e test of
    test_secure_aggregation): the asked-for column steps the accountant at the target,
    so it is below the reported epsilon when less noise arrived; unreleased rounds
    are skipped."""
    from benchmarks.studies.dp_arrived import table

    config = {"dp-noise-multiplier": 1.0, "dp-delta": 1e-5}
    rounds = [
        {"round": 1, "replies": 6, "dp_noise_multiplier_target": 1.0},
        {"round": 2, "replies": 0},
    ]
    rounds[0] |= {"dp_noise_multiplier_achieved": 0.775, "dp_epsilon": 9.0, "dp_sample_rate": 1.0}
    rows = table({"config": config, "rounds": rounds}, 10)
    assert len(rows) == 3 and rows[2].startswith("| 1 | 10 | 6 | 1.000 | 0.775 | 9.00 |")
    assert 0 < float(rows[2].split("|")[-2]) < 9.0


def _grid_results(accuracies: dict[str, float], mask: list[int] | None = None) -> dict:
    last: dict = {"per_client_accuracy": accuracies}
    if mask is not None:
        last["fa_shared_mask"] = {"features.1": mask}
    return {"rounds": [last]}


def test_attack_grid_scores_the_honest_sites_only(tmp_path: Path) -> None:
    """benchmarks/attack_grid.py: the attackers (the first partitions) are left out of
    the accuracy, the change is against the same defence's clean run on those sites,
    and FedFac's split change counts the neurons whose role differs."""
    from benchmarks import attack_grid

    def cell(attack: str, a: int) -> attack_grid.Cell:
        cfg = {"num-server-rounds": 1}
        return attack_grid.Cell("fedfac", "fedfac-static", 4, attack, a, "defaults", cfg)

    clean, hit = cell("clean", 0), cell("fa-steer", 1)
    for c, acc, mask in (
        (clean, {"client-0": 1.0, "client-1": 0.5, "client-2": 0.7, "client-3": 0.6}, [1, 1, 0, 0]),
        (hit, {"client-0": 0.0, "client-1": 0.4, "client-2": 0.7, "client-3": 0.4}, [1, 0, 1, 0]),
    ):
        (tmp_path / c.name).mkdir()
        (tmp_path / c.name / "results.json").write_text(json.dumps(_grid_results(acc, mask)))
    rows = {r["cell"].attack: r for r in attack_grid.summarise([clean, hit], tmp_path)}
    assert rows["fa-steer"]["honest"] == pytest.approx(50.0)  # client-0 left out
    assert rows["fa-steer"]["change"] == pytest.approx(-10.0)  # against 60 on clients 1-3
    assert rows["fa-steer"]["split"] == pytest.approx(50.0)
    assert attack_grid.complete(tmp_path / hit.name / "results.json", 1)
    assert not attack_grid.complete(tmp_path / hit.name / "results.json", 10)


@pytest.mark.slow
def test_attack_grid_ci_variant_writes_its_tables_and_plot(tmp_path: Path) -> None:
    from benchmarks import attack_grid

    attack_grid.main(["--ci", "--jobs", "1", "--out", str(tmp_path), "--runs", str(tmp_path / "r")])
    text = (tmp_path / "attacks-grid.md").read_text()
    for title in ("FedAvg", "FedFac", "Factorized-FL", "FedCP"):
        assert f"## {title}" in text
    assert (tmp_path / "attacks-grid.png").stat().st_size > 1000
    assert "| factorized-fl-alpha | 4 | 1 | match-magnet | defaults |" in text


def test_an_unknown_top_level_preset_key_stops_with_the_closest_one(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('description = "x"\nmethods = ["fedavg"]\nequal_budget = "fedavg"\n')
    with pytest.raises(SystemExit, match="'equal_budget' \\(did you mean 'equal-budget'\\?\\)"):
        presets.load(str(path))


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # a [config] typo: every cell would fail alone (exit 1) after the first ran
        (("lr = 0.1", "lr = 0.1\nmmd-lambda = 5"), "did you mean 'fedcp.mmd-lambda'"),
        # a method key no row reads: accepted, and it would do nothing
        (("lr = 0.1", "lr = 0.1\nfedcp.mmd-lambda = 2"), "'fedcp.mmd-lambda' belongs to fedcp"),
        (
            ("[method-config.local]", "[method-config.local]\nditto.lambda = 2"),
            "method-config.local",
        ),
        (("hidden-dim = 16", "hidden-dim = -3"), "'hidden-dim'"),
    ],
)
def test_a_preset_that_cannot_run_stops_before_any_cell(tmp_path: Path, capsys, edit, named):
    from benchmarks.__main__ import main

    path = tmp_path / "bad.toml"
    path.write_text(GRID.replace(*edit))
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--runs", str(runs), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("preset error: bad: ") and named in err, err
    assert not runs.exists()  # nothing ran, nothing written


def test_a_preset_load_error_is_exit_2(tmp_path: Path, capsys) -> None:
    from benchmarks.__main__ import main

    path = tmp_path / "typo.toml"
    path.write_text('description = "x"\nmethods = ["fedavg"]\nequal_budget = "fedavg"\n')
    assert main(["run", str(path), "--runs", str(tmp_path / "r")]) == 2
    assert "did you mean 'equal-budget'" in capsys.readouterr().err


def test_an_unknown_report_key_stops_with_the_closest_one(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('description = "x"\nmethods = ["fedavg"]\n[report]\nper_client = true\n')
    with pytest.raises(SystemExit, match="'per_client' \\(did you mean 'per-client'\\?\\)"):
        presets.load(str(path))


def test_the_direction_check_benchmark_tables_both_ways(capsys) -> None:
    from benchmarks.studies import direction_check

    assert direction_check.main(["--replies", "4", "--reps", "1"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 4 |")]
    cells = row[0].strip("|").split("|")
    assert len(cells) == 6 and cells[-1].strip().endswith("x")
    assert float(cells[2]) > float(cells[4])  # the whole stack holds more memory


@pytest.mark.slow
def test_scale_100k_ci_variant_streams_rounds_of_one_percent(tmp_path):
    """scale-100k's reduced CI variant (2,000 clients, 1% a round, Flower's Ray
    simulation): FedPer completes its 3 rounds with 20 clients each, every round
    streamed, the closing evaluation on 1% of the clients."""
    runs = tmp_path / "runs"
    args = ["run", "scale-100k", "--settings", "ci-2000", "--rows", "fedper"]
    assert main([*args, "--runs", str(runs), "--out", str(tmp_path)]) == 0
    (path,) = runs.glob("*/ci-2000/*/results.json")
    res = json.loads(path.read_text())
    assert res["federation_size"] == 2000 and len(res["rounds"]) == 3
    assert [len(r["per_client_train_loss"]) for r in res["rounds"]] == [20, 20, 20]
    assert all(r["aggregation_streamed"] for r in res["rounds"])
    assert len(res["rounds"][-1]["per_client_accuracy"]) == 20


@pytest.mark.slow
def test_scale_1m_ci_variant_runs_flwr_run_and_in_process_alike(tmp_path):
    """scale-1m's reduced CI variant (2,000 clients, 1% a round, 2 rounds), through
    ``flwr run`` (its local SuperLink stopped after) and the in-process engine: both
    train the same 20 clients a round to the same numbers; Flower's engine ran on
    sparse node stores (built so or converted at its start) and compact nodes; the
    run reports its personal state (in memory: at most 40 clients can train); the
    model report is written."""
    from benchmarks.__main__ import main
    from benchmarks.runner import run_processes

    assert main(["scale", "--settings", "ci-2000", "--out", str(tmp_path)]) == 0
    cells = {p.parent.name: p.parent for p in (tmp_path / "runs").glob("*/ci-2000/*/results.json")}
    ray, local = (json.loads((cells[n] / "results.json").read_text()) for n in
                  ("flwr_run-seed0", "in-process-seed0"))  # fmt: skip
    for res in (ray, local):
        assert res["federation_size"] == 2000 and len(res["rounds"]) == 2
        assert [len(r["per_client_train_loss"]) for r in res["rounds"]] == [20, 20]
        assert res["personal_state"]["clients_that_can_train"] == 40
        assert res["personal_state"]["clients_on_disk"] == 0
    for a, b in zip(ray["rounds"], local["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]
        assert a["per_client_train_loss"] == pytest.approx(b["per_client_train_loss"], abs=1e-6)
    log = (cells["flwr_run-seed0"] / "cell.log").read_text()
    # At a few thousand nodes Flower may build its stores before the app's import
    # patches it (pflower/patches/node_stores.py); then they are converted when the
    # engine starts. Either way the engine runs on sparse stores, never Flower's.
    assert re.search(
        r"2000 nodes, their stores (sparse|converted), the LinkState's nodes compact", log
    )
    assert run_processes(cells["flwr_run-seed0"] / "flwr-home") == []  # stopped
    status = json.loads((cells["flwr_run-seed0"] / "cell.json").read_text())
    assert status["peak_rss"] > 0 and status["launched_at"] < ray["rounds"][0]["started_at"]
    assert (tmp_path / "scale-1m-model.md").read_text().startswith("# A million simulated")


def test_the_image_decode_benchmark_checks_the_pixels_and_tables_both_decoders(capsys):
    from benchmarks.studies.image_decode import main as image_decode

    assert image_decode(["--images", "40", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "40 CIFAR-10 PNGs, the same pixels" in out
    assert "| PIL |" in out and "| product |" in out and "product / PIL: " in out


def test_the_channels_last_benchmark_tables_both_layouts(capsys):
    from benchmarks.studies.channels_last import main as channels_last

    assert channels_last(["--steps", "2", "--repeats", "1", "--models", "cnn4"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("| cnn4 |")]
    assert len(row) == 1 and row[0].count("x |") == 2  # both ratios


def test_the_vmap_benchmark_trains_the_same_weights_both_ways(capsys):
    from benchmarks.studies.vmap_clients import main as vmap_clients

    args = ["--clients", "3", "--steps", "2", "--batch", "4", "--repeats", "1"]
    assert vmap_clients(args) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| cnn4", "| mlp"))]
    assert len(rows) == 2
    for row in rows:  # the batched weights are the sequential ones, up to float rounding
        assert row[3].endswith("x") and float(row[4].rstrip(" |")) < 1e-4


def test_the_running_sum_benchmark_tables_both_sums_with_the_same_bits(capsys):
    from benchmarks.studies.running_sum import main as running_sum

    assert running_sum(["--replies", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "same bits: True" in out
    rows = [line for line in out.splitlines() if line.startswith(("| numpy |", "| compiled |"))]
    assert len(rows) == 2 and all(row.endswith("x |") for row in rows)
    assert "mean: same bits as numpy's: True" in out
    edges = [line for line in out.splitlines() if line.startswith(("| first reply", "| mean"))]
    assert len(edges) == 4 and all(float(line.split("|")[2]) > 0 for line in edges)


def test_the_fold_pass_study_tables_the_passes_and_the_sums_within_rounding(capsys):
    from benchmarks.studies.fold_pass import main as fold_pass

    assert fold_pass(["--repeats", "1", "--scale", "0.01"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| before", "| after"))]
    assert len(rows) == 3 and all(float(row.split("|")[2]) > 0 for row in rows)
    assert "values outside found: 0 (clean), 1 (one NaN)" in out


def test_ray_timeline_splits_rounds_into_busy_actors_gaps_and_the_boundary() -> None:
    from benchmarks.studies.ray_timeline import actor_tasks, summarize

    # rounds end (aggregation) at 0.9, 1.9, ... 4.9 s; rounds 2-4 hold calls at i+0.0..0.8
    calls = [("A", 0.1, 0.5), ("A", 4.0, 4.8)]  # round 1 and the last round: left out
    for i in (1, 2, 3):
        calls += [("A", i, i + 0.3), ("A", i + 0.35, i + 0.8)]
        calls += [("B", i + 0.02, i + 0.4), ("B", i + 0.42, i + 0.6)]
    events = [{"ph": "X", "name": "run", "tid": a, "ts": s * 1e6, "dur": (e - s) * 1e6}
              for a, s, e in calls]  # fmt: skip
    events.append({"ph": "X", "name": "task:execute", "tid": "A", "ts": 0, "dur": 1})
    marks = {"aggregate end": [k + 0.9 for k in range(5)]}
    for name, at in (("reply stored", 0.81), ("fold end", 0.82), ("round loop end", 0.83),
                     ("aggregate start", 0.85), ("instruction stored", 0.93),
                     ("submit start", 0.94), ("submitted", 0.95)):  # fmt: skip
        marks[name] = [k + at for k in range(5)]
    marks["fold end"] += [k + 0.7 for k in range(5)]  # an earlier reply's fold: not the last
    tasks = actor_tasks(events)
    assert len(tasks) == len(calls) and tasks == sorted(tasks, key=lambda t: t[1])
    s = summarize(tasks, marks)
    assert s["rounds"] == 3 and s["round_ms"] == 1000.0
    # over rounds 2-4 (0.9 to 3.9 s): A runs 0.75 s a round, B 0.56
    assert s["actors"]["A"] == {"calls": 6, "busy_share": 0.75, "call_ms": 375.0}
    assert s["actors"]["B"]["busy_share"] == 0.56
    assert s["gap_within_round_ms"] == 35.0  # A waits 50 ms between its two, B 20
    b = s["boundary_ms"]  # A ends at i+0.8, B at i+0.6; the next round's first call at i+1
    assert b["tail (an actor idle)"] == 200.0 and b["both idle"] == 200.0
    # stored 10 ms after, folded 10, the loop ends 10, aggregation 20 later and 50 long,
    # the instruction 30 after, handed to the pool 10, submitted 10, the call 50 after
    assert [b[k] for k in list(b)[2:]] == [10.0, 10.0, 10.0, 20.0, 50.0, 30.0, 10.0, 10.0, 50.0]
    held = {k: v for k, v in marks.items() if k not in ("fold end", "round loop end")}
    b = summarize(tasks, held)["boundary_ms"]  # a held round: no fold, no loop mark
    assert b["its fold"] == b["to the round loop's end"] == 0.0
    assert b["to the aggregation"] == 40.0
    with pytest.raises(ValueError, match="at least 4 rounds"):
        summarize(tasks, {**marks, "aggregate end": [0.9, 1.9, 2.9]})


RAY_TIMELINE = """
description = "one Ray cell, timed"
methods = ["fedavg"]
clients = 4
[config]
dataset = "synthetic"
[variants.simulation]
engine = "simulation"
"""


@pytest.mark.slow
def test_ray_timeline_times_a_real_ray_simulation(tmp_path: Path, capsys) -> None:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    from benchmarks.studies.ray_timeline import main as ray_timeline
    from pflower.patches import wakeups

    path = tmp_path / "timed.toml"
    path.write_text(RAY_TIMELINE)
    out = tmp_path / "out"
    args = ["--preset", str(path), "--setting", "default", "--rounds", "5", "--out", str(out)]
    assert ray_timeline(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds"] == 3  # rounds 2-4 of 5
    assert sum(a["calls"] for a in s["actors"].values()) == 4 * 3  # every client, every round
    assert all(0 < a["busy_share"] <= 1 for a in s["actors"].values())
    assert s["boundary_ms"]["both idle"] > 0 and s["phase_ms"]["execute"] > 0
    # the finer marks are in place: the last reply's fold, Flower's loop, Ray's submit
    steps = ("its fold", "to the round loop's end", "Ray's submit")
    assert all(s["boundary_ms"][k] > 0 for k in steps)
    assert "both idle" in capsys.readouterr().out
    # the classes as the product patched them (engine-wakeups on top), not as marked
    # and not as Flower shipped them, though this process first imported them here
    assert wakeups.in_place()
    for name in ("store_message_ins", "store_message_res"):
        assert InMemoryLinkState.__dict__[name].__name__ == "store_and_notify"


ROUNDS_WRITER = """
import json, subprocess, sys, time
from pathlib import Path

out = Path(sys.argv[1])
def write(k):
    rounds = [{"round": i + 1, "seconds": 0.5, "replies": 4} for i in range(k)]
    out.write_text(json.dumps({"rounds": rounds}))
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
burn(0.3)  # round 1: start-up, left out
write(1)
time.sleep(0.2)
# rounds 2-3: this process burns 0.4 s, an actor 0.3 s
actor = subprocess.Popen(["bash", "-c", 'exec -a "ray::ClientAppActor" "$0" -c "$1"',
    sys.executable, "import time\\nend = time.process_time() + 0.3\\n"
    "while time.process_time() < end: pass\\ntime.sleep(30)"])
burn(0.4)
time.sleep(0.5)
write(2)
time.sleep(0.2)
write(3)
time.sleep(0.2)
burn(0.3)  # round 4 and its closing evaluation: left out
write(4)
time.sleep(0.3)
actor.kill()
"""


def test_the_cpu_watcher_splits_the_timed_rounds_cpu_by_process(tmp_path):
    """What the report's CPU table reads: each role's CPU between the writes after round
    1 and round N-1, an exited or killed process keeping its last reading."""
    import subprocess

    from benchmarks.machine import RoundCpuWatcher

    results = tmp_path / "results.json"
    proc = subprocess.Popen([sys.executable, "-c", ROUNDS_WRITER, str(results)])
    watcher = RoundCpuWatcher(proc.pid, results).start()
    assert proc.wait(timeout=60) == 0
    summary = watcher.summary(json.loads(results.read_text()))
    assert summary["rounds"] == [2, 3]
    assert summary["client_rounds"] == 8 and summary["wall_seconds"] == 1.0
    cpu = summary["cpu_seconds"]
    assert 0.35 <= cpu["engine process"] <= 0.55  # its 0.4 s, not round 1's or 4's 0.3
    assert 0.25 <= cpu["Ray actors"] <= 0.4
    rows = {"fedavg": {"n": 1, "cpu": [summary]}}
    table = "\n".join(report.cpu_table(rows))
    per = 1000 * cpu["engine process"] / 8
    assert f"| `fedavg` | 2-3 | {per:.1f} |" in table and "cores busy" in table


def test_cpu_roles_count_the_raylet_and_rays_agents_as_services_not_actors():
    """The raylet's command line names default_worker.py (how it starts workers) and
    Ray's agents are ray::-named: none of them runs a ClientApp (command lines as
    Ray 2.x's, read off a running instance)."""
    from benchmarks.machine import ROLES, role_of

    class Proc:
        def __init__(self, pid: int, *args: str) -> None:
            self.pid, self.args = pid, list(args)

        def cmdline(self) -> list[str]:
            return self.args

        def name(self) -> str:
            return self.args[0] if self.args else "?"

    site = "/v/lib/python3.11/site-packages/ray"
    worker = f"{site}/_private/workers/default_worker.py"
    cases = {
        Proc(
            2, f"{site}/core/src/ray/raylet/raylet", f"--python_worker_command=python {worker}"
        ): 2,
        Proc(3, f"{site}/core/src/ray/gcs/gcs_server", "--gcs_server_port=0"): 2,
        Proc(4, "ray::DashboardAgent", "--node-ip-address=127.0.0.1"): 2,
        Proc(5, "ray::RuntimeEnvAgent"): 2,
        Proc(6, "/v/bin/python", "-u", f"{site}/_private/log_monitor.py"): 2,
        Proc(7, "ray::ClientAppActor.run"): 1,
        Proc(8, "ray::IDLE"): 1,
        Proc(9, "/v/bin/python", worker, "--node-ip-address=127.0.0.1"): 1,  # not renamed yet
        Proc(10, "/usr/bin/git", "rev-parse"): 3,
        Proc(1, "/v/bin/python", "-m", "benchmarks", "cell"): 0,
    }
    for proc, role in cases.items():
        assert role_of(proc, 1) == ROLES[role], proc.args


def test_paired_codes_pairs_ratios_within_a_repeat(tmp_path: Path) -> None:
    """benchmarks/studies/paired_codes.py: a ratio is two rows of the same repeat (not two
    medians), a failed cell (nan) drops out, and s/round is the median round after the first."""
    from benchmarks.studies.paired_codes import s_per_round, table

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"rounds": [{"seconds": s} for s in (5.0, 1.0, 3.0, 2.0)]}))
    assert s_per_round(results) == 2.0
    samples = {
        (0, "s", "head-inproc"): 1.0,
        (0, "s", "base-inproc"): 2.0,
        (1, "s", "head-inproc"): 4.0,
        (1, "s", "base-inproc"): 4.0,
        (2, "s", "head-inproc"): float("nan"),
        (2, "s", "base-inproc"): 9.0,
    }
    lines = table(samples).splitlines()
    # paired: 1/2 and 4/4 (median 0.75); a ratio of the medians would be 2.5/4 = 0.625
    assert "| s | head-inproc / base-inproc | 0.750 | 0.500-1.000 | 2 |" in lines
    assert "| s | head-inproc | 2.500 | 1.000-4.000 | 2 |" in lines
    assert "| s | base-inproc | 4.000 | 2.000-9.000 | 3 |" in lines


def test_a_preset_whose_data_cannot_run_is_refused_before_any_cell(tmp_path, capsys):
    """#106: the shipped example, unchanged, names its missing path; a preset whose
    ``clients`` does not match its per-site folders names ``clients``; exit 2, no run."""
    example = presets.REPO / "docs/examples/my-comparison.toml"
    out = tmp_path / "out"
    assert main(["run", str(example), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config key 'dataset'" in err[0] and "/path/to/my/images" in err[0]
    folders = [image_folder(tmp_path / f"hospital-{k}", per_class=3, side=8) for k in "abc"]
    text = GRID_SITES.format(paths=",".join(map(str, folders)))
    path = tmp_path / "sites.toml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set the preset's clients = 3" in err[0], err
    assert "clients = 4, but client-data-paths gives 3 sites" in err[0]
    assert not list(out.glob("runs/*/*/*/results.json"))  # nothing ran


GRID_SITES = """
description = "three hospitals' folders, one client too many"
methods = ["fedavg"]
clients = 4
rounds = 1
[config]
client-data-paths = "{paths}"
class-names = "a,b"
model = "mlp"
hidden-dim = 8
"""
