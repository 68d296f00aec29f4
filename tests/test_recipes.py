"""Data recipes (pflower/data/recipes.py) on small local stand-ins of each source's
format: each builds a parquet file that the pre-flight (``check``) accepts with the
recipe's run config, and the CIFAR-10 dev/check builder keeps its two files
disjoint and class-balanced."""

from __future__ import annotations

import pickle
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest

from pflower.cli.__main__ import check
from pflower.data.recipes import RECIPES, RecipeError, build, load, main

RNG = np.random.default_rng(0)


def _images(n: int, size: int, channels: int = 3) -> np.ndarray:
    shape = (n, size, size, channels) if channels > 1 else (n, size, size)
    return RNG.integers(0, 256, shape, dtype=np.uint8)


def cifar_batches(folder: Path, per_class: int = 5) -> Path:
    """torchvision's cifar-10-batches-py layout, ``per_class`` images a class."""
    folder.mkdir(parents=True)
    names = [f"class{c}".encode() for c in range(10)]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}))
    labels = np.repeat(np.arange(10), per_class)
    half = len(labels) // 2
    for i, rows in enumerate((slice(0, half), slice(half, None)), start=1):
        data = _images(len(labels[rows]), 32).transpose(0, 3, 1, 2).reshape(-1, 3072)
        batch = {b"data": data, b"labels": labels[rows].tolist()}
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    return folder


def hub_parquet(path: Path, columns: dict, n: int, size: int, channels: int = 3) -> Path:
    """A parquet file in a hub data set's schema (its own column names)."""
    from PIL import Image

    features, rows = {}, {}
    for name, spec in columns.items():
        if spec == "image":
            features[name] = datasets.Image()
            rows[name] = [Image.fromarray(a) for a in _images(n, size, channels)]
        elif isinstance(spec, int):  # a class label with this many classes, 4 images each
            features[name] = datasets.ClassLabel(names=[f"c{i}" for i in range(spec)])
            rows[name] = (np.arange(n) // 4 % spec).tolist()
        else:  # an id column
            features[name] = datasets.Value("string")
            rows[name] = [f"{spec}{i % 10}" for i in range(n)]
    ds = datasets.Dataset.from_dict(rows, features=datasets.Features(features))
    ds.to_parquet(str(path))
    return path


def _check(dataset: Path, recipe: str, clients: int = 4) -> int:
    config = f"{RECIPES[recipe].run_config} dataset='{dataset}'"
    return check(["--run-config", config, "--federation-config", f"num-supernodes={clients}"])


def test_cifar10_dev_and_check_files_are_disjoint_and_balanced(tmp_path, capsys) -> None:
    source = cifar_batches(tmp_path / "cifar-10-batches-py")
    dev, chk = build("cifar10-dev-check", str(source), tmp_path / "out", 3, 2)
    assert (dev.name, chk.name) == ("cifar10-dev-30.parquet", "cifar10-check-20.parquet")
    tables = [pq.read_table(p) for p in (dev, chk)]
    assert [t.column_names for t in tables] == [["img", "label"]] * 2
    assert b"huggingface" in tables[0].schema.metadata  # the hub schema, class names kept
    for t, per_class in zip(tables, (3, 2)):
        assert np.bincount(t.column("label").to_numpy()).tolist() == [per_class] * 10
    images = [{bytes(r["bytes"]) for r in t.column("img").to_pylist()} for t in tables]
    assert not images[0] & images[1]  # no image in both
    assert _check(dev, "cifar10-dev-check") == 0
    assert "(10 classes, 3x32x32)" in capsys.readouterr().out
    info = datasets.load_dataset("parquet", data_files=str(dev), split="train").features
    assert info["label"].names[:2] == ["class0", "class1"]
    with pytest.raises(RecipeError, match="fewer than"):
        build("cifar10-dev-check", str(source), tmp_path / "too-many", 4, 2)


@pytest.mark.parametrize(
    ("recipe", "columns", "size", "channels", "clients"),
    [
        ("cifar100", {"img": "image", "fine_label": 100, "coarse_label": 20}, 32, 3, 4),
        # femnist's sites are its writers (10 here): one SuperNode each
        (
            "femnist",
            {"image": "image", "character": 62, "writer_id": "w", "hsf_id": "h"},
            28,
            1,
            10,
        ),
        ("tiny-imagenet", {"image": "image", "label": 200}, 64, 3, 4),
    ],
)
def test_hub_recipes_build_a_file_the_preflight_accepts(
    recipe, columns, size, channels, clients, tmp_path
) -> None:
    source = hub_parquet(tmp_path / "hub.parquet", columns, 80, size, channels)
    (path,) = build(recipe, str(source), tmp_path / f"{recipe}.parquet")
    table = pq.read_table(path)
    assert "label" in table.column_names and set(RECIPES[recipe].keep) <= set(table.column_names)
    assert _check(path, recipe, clients) == 0
    if clients > 4:  # a natural partition with more sites than SuperNodes is refused
        assert _check(path, recipe, 4) == 2
    # the source without the recipe's label column: one line naming it
    wrong = hub_parquet(tmp_path / "wrong.parquet", {"image": "image", "y": 3}, 8, 8)
    with pytest.raises(RecipeError, match=f"no label column '{RECIPES[recipe].label}'"):
        load(RECIPES[recipe], str(wrong))


def test_pathmnist_from_medmnist_npz_keeps_its_test_split(tmp_path) -> None:
    npz = tmp_path / "pathmnist.npz"
    labels = {s: (np.arange(n) % 9)[:, None] for s, n in (("train", 45), ("val", 9), ("test", 18))}
    np.savez(npz, **{f"{s}_images": _images(len(y), 28) for s, y in labels.items()},
             **{f"{s}_labels": y for s, y in labels.items()})  # fmt: skip
    (path,) = build("pathmnist", str(npz), tmp_path / "out")
    table = pq.read_table(path)
    assert table.num_rows == 72
    assert table.column("split").to_pylist().count("test") == 18
    assert _check(path, "pathmnist", clients=3) == 0


def test_offline_hub_source_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    import pflower.data.loading as loading

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading, "_hub_reachable", lambda: False)
    assert main(["build", "cifar100", "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("recipe cifar100: ") and "cannot be reached" in err
    assert err.count("\n") == 1
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{name}: " in listed for name in RECIPES)
