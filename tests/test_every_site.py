"""The simulation pre-flight checks every site of ``client-data-paths`` (#46), not
only the first: a newcomer's three hospitals, the first clean, whose label problems
(a class spelled another way, different class folders under ``num-classes``) used to
pass ``check`` and surface in the run. Each ends in one line, exit 2, naming the key
and the site; a clean federation prints each site's class name -> id map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pflower.cli.__main__ import check
from tests.helpers import image_folder


def _hospitals(root: Path, third: tuple[str, ...]) -> str:
    """Three hospitals' image folders; the first two clean, the third as given."""
    clean = ("benign", "malignant", "normal")
    paths = [
        image_folder(root / "hospital-a", clean, per_class=3, side=8),
        image_folder(root / "hospital-b", clean, per_class=3, side=8),
        image_folder(root / "hospital-c", third, per_class=3, side=8),
    ]
    return ",".join(str(p) for p in paths)


def _check(paths: str, *keys: str) -> int:
    run_config = " ".join(
        [f"client-data-paths='{paths}'", "model='mlp'", "num-server-rounds=1", *keys]
    )
    return check(["--run-config", run_config, "--federation-config", "num-supernodes=3"])


@pytest.mark.parametrize("names", ["", "class-names='benign,malignant,normal'"])
def test_a_class_spelled_two_ways_at_a_later_site_stops_the_check(tmp_path, capsys, names):
    paths = _hospitals(tmp_path, ("benign", "Malignant", "normal"))
    assert _check(paths, *[names] if names else []) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'class-names'" in err and "'Malignant'" in err and "'malignant'" in err
    assert "hospital-c" in err


def test_different_class_folders_without_names_ask_for_class_names(tmp_path, capsys):
    paths = _hospitals(tmp_path, ("benign", "normal"))  # lacks a class: ids would shift
    assert _check(paths, "num-classes=3") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'class-names'" in err and "site 2 (hospital-c): benign, normal)" in err
    assert "class-names='benign,malignant,normal'" in err  # the fix, spelled out


def test_with_class_names_each_site_prints_its_map(tmp_path, capsys):
    paths = _hospitals(tmp_path, ("benign", "normal"))
    assert _check(paths, "class-names='benign,malignant,normal'") == 0
    out = capsys.readouterr().out
    assert re.search(
        r"site 0 \(hospital-a\): \d+ train / \d+ test; classes "
        r"benign->0 malignant->1 normal->2\n",
        out,
    ), out
    assert re.search(
        r"site 2 \(hospital-c\): \d+ train / \d+ test; classes "
        r"benign->0 normal->2 \(lacks malignant\)\n",
        out,
    ), out


def test_a_later_site_that_breaks_the_run_is_named(tmp_path, capsys):
    paths = _hospitals(tmp_path, ("benign", "malignant", "tumour"))
    assert _check(paths, "class-names='benign,malignant,normal'") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: site 2 (hospital-c): config key 'class-names'"), err
    assert "['tumour']" in err


NEWCOMER = """
description = "three hospitals"
methods = ["fedavg", "local", "fedper"]
seeds = [0, 1]
clients = 3
rounds = 2
[config]
client-data-paths = "{paths}"
class-names = "benign,malignant,normal"
model = "mlp"
hidden-dim = 8
[report]
per-client = true
"""


@pytest.mark.slow
def test_the_newcomers_comparison_reports_what_a_paper_needs(tmp_path) -> None:
    """#46's comparison: 3 methods on 3 hospitals' folders with 2, then 3 seeds. The
    report names each site by its folder with its test-set size, flags intervals of
    2 seeds, and a renamed copy of the preset finds the same runs by their content."""
    from benchmarks.__main__ import main

    paths = _hospitals(tmp_path / "data", ("benign", "normal"))
    preset = tmp_path / "hospitals.toml"
    preset.write_text(NEWCOMER.replace("{paths}", paths))
    runs, out = tmp_path / "runs", tmp_path / "report"
    assert main(["run", str(preset), "--runs", str(runs), "--out", str(out)]) == 0
    md = (out / "hospitals.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| row | hospital-a (n="))
    assert "hospital-b (n=" in head and "hospital-c (n=" in head
    assert "(n=2: not meaningful)" in md or "all 2 seeds equal" in md
    assert (out / "hospitals-default.png").stat().st_size > 10_000

    assert main(["run", str(preset), "--runs", str(runs), "--out", str(out), "--seeds", "2"]) == 0
    md = (out / "hospitals.md").read_text()
    assert "| `fedavg` | 3 |" in md and "(n=2: not meaningful)" not in md  # 3 seeds now

    copy = tmp_path / "renamed.toml"
    copy.write_text(preset.read_text())
    again = ["--runs", str(runs), "--out", str(out), "--report-only", "--seeds", "0", "1", "2"]
    assert main(["run", str(copy), *again]) == 0
    renamed = (out / "renamed.md").read_text()
    assert "| `fedavg` | 3 |" in renamed and "| `fedper` | 3 |" in renamed
