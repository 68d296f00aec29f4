"""Sites whose class folders differ (#36): label ids come from each site's own sorted
class folders, so a site that lacks a class shifts every later id. With the run's
``class-names`` every site maps its labels by name; without it, the server compares
the sites' class lists before round 1 and stops before any site trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from methods import parse_run_config
from pflower.data import load_client_data
from pflower.engine.inprocess import build_inprocess, run_inprocess
from strategies.base import ClassListMismatch

CLASSES = ("cat", "dog", "frog", "horse")


def _site(root: Path, classes: tuple[str, ...], per_class: int = 6) -> Path:
    """An image folder: one sub-folder per class, 8x8 images whose colour is the class."""
    for name in classes:
        (root / name).mkdir(parents=True)
        shade = 30 + 60 * CLASSES.index(name)
        for k in range(per_class):
            pixels = np.full((8, 8, 3), shade + k, dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{k}.png")
    return root


@pytest.fixture
def sites(tmp_path: Path) -> tuple[Path, Path, Path]:
    """a: cat, dog, frog; b: no dog; c: no dog but a horse (as many classes as a:
    its labels go wrong silently, no tensor shape differs)."""
    return (
        _site(tmp_path / "a", ("cat", "dog", "frog")),
        _site(tmp_path / "b", ("cat", "frog")),
        _site(tmp_path / "c", ("cat", "frog", "horse")),
    )


def _frog_labels(cfg_keys: dict, path: Path) -> set[int]:
    cfg = parse_run_config({"model": "mlp", **cfg_keys})
    data = load_client_data(cfg, 0, 1, str(path))
    labels = np.concatenate([data.y_train.numpy(), data.y_test.numpy()])
    x = np.concatenate([data.x_train.numpy(), data.x_test.numpy()])
    brightness = x.reshape(len(x), -1).mean(axis=1)
    return set(labels[brightness == brightness.max()].tolist())  # b's brightest: frogs


def test_a_site_lacking_a_class_keeps_the_other_ids_with_class_names(sites) -> None:
    _, b, _ = sites
    assert _frog_labels({}, b) == {1}  # its own folders: frog is its second class
    assert _frog_labels({"class-names": "cat,dog,frog"}, b) == {2}  # by name: the run's id


def test_a_class_the_run_does_not_list_is_a_config_error(sites) -> None:
    a, _, _ = sites
    cfg = parse_run_config({"class-names": "cat,frog"})
    with pytest.raises(ValueError, match=r"'class-names'.*\['dog'\]"):
        load_client_data(cfg, 0, 1, str(a))


def _config(a: Path, tmp_path: Path, **keys: str) -> dict:
    return {
        "method": "fedavg",
        "input-shape": "3,8,8",  # declared: the server reads no data
        "num-classes": 4,
        "model": "mlp",
        "num-server-rounds": 2,
        "output-dir": str(tmp_path / "out"),
        "run-name": "classes",
        **keys,
    }


def test_sites_with_different_class_folders_are_stopped_before_aggregation(sites, tmp_path) -> None:
    a, _, c = sites
    nodes = [{"data-path": str(a)}, {"data-path": str(c)}]
    fits: list = []
    server, rounds = build_inprocess(
        _config(a, tmp_path), 2, lambda kind, *_: fits.append(kind), nodes
    )
    before = [x.copy() for x in server.strategy.global_arrays]
    with pytest.raises(ClassListMismatch, match=r"before round 1: .*client-0; client-1.*'class-"):
        server.fit(rounds, timeout=None)
    assert fits == []  # asked before round 1: no site trained, nothing was sent
    assert all(np.array_equal(x, y) for x, y in zip(before, server.strategy.global_arrays))


def test_with_class_names_the_same_sites_train(sites, tmp_path) -> None:
    a, b, c = sites
    nodes = [{"data-path": str(p)} for p in (a, b, c)]
    names = {"class-names": "cat,dog,frog,horse"}
    res = run_inprocess(_config(a, tmp_path, **names), 3, None, nodes)
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    assert sorted(res["rounds"][-1]["per_client_accuracy"]) == ["client-0", "client-1", "client-2"]
