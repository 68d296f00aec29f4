"""The simulation pre-flight checks every site of ``client-data-paths`` (#46), not
only the first: a newcomer's three hospitals, the first clean, whose label problems
(a class spelled another way, different class folders under ``num-classes``) used to
pass ``check`` and surface in the run. Each ends in one line, exit 2, naming the key
and the site; a clean federation prints each site's class name -> id map."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from pflower_cli.__main__ import check
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
    t0 = time.perf_counter()
    assert _check(paths, *[names] if names else []) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'class-names'" in err and "'Malignant'" in err and "'malignant'" in err
    assert "hospital-c" in err
    assert time.perf_counter() - t0 < 60


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
