"""Data recipes: where a data set comes from, how to make a local copy, and a run
config that fits it (docs/DATA.md).

    python -m pflower.data.recipes list
    python -m pflower.data.recipes build NAME --source SRC --out PATH

``fed-heart-disease`` writes a table (pflower/data/fed_heart_disease.py); the others
write a parquet file in the Hugging Face image schema (an image column,
``label`` with its class names, and the id columns a natural partition needs) that
``dataset=PATH`` reads offline. SRC is the recipe's hub name (needs the internet),
a local parquet file or folder or image folder in the hub's schema, or the data
set's own release format where the recipe names one (CIFAR-10's python batches,
MedMNIST's ``.npz``). ``cifar10-dev-check`` makes the development and check files
the CPU presets use (benchmarks/presets.py): disjoint, class-balanced subsets of
CIFAR-10's training split.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pflower.data import fed_heart_disease


@dataclass(frozen=True)
class Recipe:
    name: str
    hub: str  # the Hugging Face hub name
    label: str  # the source's label column (renamed to ``label``)
    run_config: str  # keys that fit the data (add dataset='<the built file>')
    about: str
    keep: tuple[str, ...] = ()  # id columns kept for natural partitions
    release: str = ""  # the data set's own release format, read from a local copy


RECIPES = {
    r.name: r
    for r in (
        Recipe(
            "cifar10",
            "uoft-cs/cifar10",
            "label",
            "model='cnn4' partitioner='dirichlet' alpha=0.1",
            "CIFAR-10, 10 classes, 3x32x32 (FedDecomp, FedCP, FedFac, Factorized-FL)",
            release="cifar-10-batches-py (torchvision's download folder)",
        ),
        Recipe(
            "cifar10-dev-check",
            "uoft-cs/cifar10",
            "label",
            "model='cnn4' partitioner='dirichlet' alpha=0.1",
            "CIFAR-10's training split as two disjoint class-balanced files: "
            "cifar10-dev-12k.parquet (1,200 a class, develop and benchmark) and "
            "cifar10-check-6k.parquet (600 a class, acceptance checks only)",
            release="cifar-10-batches-py (torchvision's download folder)",
        ),
        Recipe(
            "cifar100",
            "uoft-cs/cifar100",
            "fine_label",
            "model='resnet18' partitioner='pathological' classes-per-client=5",
            "CIFAR-100, 100 fine classes, 3x32x32; FedFac's pathological S = 5",
        ),
        Recipe(
            "femnist",
            "flwrlabs/femnist",
            "character",
            "model='cnn4' partitioner='natural' partition-by='writer_id'",
            "FEMNIST (LEAF), 62 classes, 1x28x28, one client per writer",
            keep=("writer_id",),
        ),
        Recipe(
            "tiny-imagenet",
            "zh-plus/tiny-imagenet",
            "label",
            "model='resnet18' partitioner='dirichlet' alpha=0.1",
            "Tiny-ImageNet, 200 classes, 3x64x64",
        ),
        Recipe(
            "pathmnist",
            "",
            "label",
            "model='cnn4' partitioner='dirichlet' alpha=0.3",
            "MedMNIST PathMNIST (colon pathology), 9 classes, 3x28x28",
            release="pathmnist.npz (MedMNIST's own file: `pip install medmnist` "
            "downloads it to ~/.medmnist)",
        ),
        Recipe(
            "fed-heart-disease",
            "",
            "label",
            fed_heart_disease.RUN_CONFIG,
            "Fed-Heart-Disease (FLamby): UCI Heart Disease of four hospitals, a table of 740 "
            "records, 10 features (13 with cp and restecg one-hot), binary label, "
            "FLamby's train/test split (pflower/data/fed_heart_disease.py)",
            release="a folder with the four UCI processed.*.data files (the folder "
            "FLamby's download script fills)",
        ),
    )
}

PATHMNIST_CLASSES = (
    "adipose",
    "background",
    "debris",
    "lymphocytes",
    "mucus",
    "smooth muscle",
    "normal colon mucosa",
    "cancer-associated stroma",
    "colorectal adenocarcinoma epithelium",
)


class RecipeError(ValueError):
    """A source a recipe cannot read, said in one line."""


def _images_dataset(images: np.ndarray, labels: np.ndarray, names: tuple[str, ...]) -> Any:
    """(N, H, W[, C]) uint8 images and their labels as a ``datasets.Dataset`` with the
    hub's image schema."""
    import datasets
    from PIL import Image

    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=list(names))}
    )
    rows = {"img": [Image.fromarray(a) for a in images], "label": labels.astype(int).tolist()}
    return datasets.Dataset.from_dict(rows, features=features)


def _from_cifar_batches(folder: Path) -> Any:
    """torchvision's ``cifar-10-batches-py``: the training batches (pickled dicts)."""
    with open(folder / "batches.meta", "rb") as f:
        names = tuple(n.decode() for n in pickle.load(f, encoding="bytes")[b"label_names"])
    data, labels = [], []
    for batch in sorted(folder.glob("data_batch_*")):
        with open(batch, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        data.append(np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(d[b"labels"], dtype=np.int64))
    if not data:
        raise RecipeError(f"{folder}: no data_batch_* files (a cifar-10-batches-py folder)")
    return _images_dataset(
        np.concatenate(data).transpose(0, 2, 3, 1), np.concatenate(labels), names
    )


def _from_medmnist(path: Path, names: tuple[str, ...]) -> Any:
    """MedMNIST's ``.npz``: train, val and test arrays; ``split`` keeps the test split."""
    import datasets

    with np.load(path) as z:
        parts = []
        for split in ("train", "val", "test"):
            if f"{split}_images" not in z.files:
                continue
            ds = _images_dataset(z[f"{split}_images"], z[f"{split}_labels"].reshape(-1), names)
            parts.append(ds.add_column("split", ["test" if split == "test" else "train"] * len(ds)))
    if not parts:
        raise RecipeError(f"{path}: no train_images/train_labels arrays (a MedMNIST .npz)")
    return datasets.concatenate_datasets(parts)


def load(recipe: Recipe, source: str) -> Any:
    """The source as a ``datasets.Dataset``, its label column named ``label``."""
    from pflower.data.loading import _load_hf

    path = Path(source).expanduser()
    if path.is_dir() and (path / "batches.meta").exists():
        ds = _from_cifar_batches(path)
    elif path.suffix == ".npz":
        ds = _from_medmnist(path, PATHMNIST_CLASSES if recipe.name == "pathmnist" else ())
    else:
        try:
            ds = _load_hf(source)  # a hub name (online), a parquet file or folder, images
        except (FileNotFoundError, RuntimeError, ValueError) as err:
            raise RecipeError(str(err).replace("config key 'dataset': ", "")) from None
    if recipe.label not in ds.column_names:
        raise RecipeError(
            f"{source}: no label column {recipe.label!r} (recipe {recipe.name}); its "
            f"columns are {ds.column_names}"
        )
    if recipe.label != "label":
        ds = ds.rename_column(recipe.label, "label")
    image = next((c for c in ("img", "image") if c in ds.column_names), None)
    if image is None:
        raise RecipeError(f"{source}: no image column ('img' or 'image'): {ds.column_names}")
    missing = [c for c in recipe.keep if c not in ds.column_names]
    if missing:
        raise RecipeError(f"{source}: recipe {recipe.name} needs the column(s) {missing}")
    wanted = [image, "label", *recipe.keep, *(["split"] if "split" in ds.column_names else [])]
    return ds.select_columns(wanted)


def dev_check_rows(
    labels: np.ndarray, dev_per_class: int, check_per_class: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, class-balanced row sets (dev, check), seeded."""
    rng = np.random.default_rng(seed)
    dev, check = [], []
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        if len(rows) < dev_per_class + check_per_class:
            raise RecipeError(
                f"class {c} has {len(rows)} images, fewer than {dev_per_class} + {check_per_class}"
            )
        dev.append(rows[:dev_per_class])
        check.append(rows[dev_per_class : dev_per_class + check_per_class])
    return np.sort(np.concatenate(dev)), np.sort(np.concatenate(check))


def build(
    name: str, source: str, out: Path, dev_per_class: int = 1200, check_per_class: int = 600
) -> list[Path]:
    """Write the recipe's file(s) from ``source``; returns their paths."""
    recipe = RECIPES[name]
    if name == "fed-heart-disease":
        try:
            return [fed_heart_disease.build(Path(source).expanduser(), out)]
        except FileNotFoundError as err:
            raise RecipeError(str(err)) from None
    ds = load(recipe, source)
    if name == "cifar10-dev-check":
        if "split" in ds.column_names:  # the training split only (hub copies carry test)
            ds = ds.filter(lambda s: s != "test", input_columns="split").remove_columns("split")
        labels = np.asarray(ds["label"])
        dev, check = dev_check_rows(labels, dev_per_class, check_per_class)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for rows, stem in ((dev, "cifar10-dev"), (check, "cifar10-check")):
            path = out / f"{stem}-{_count(len(rows))}.parquet"
            ds.select(rows.tolist()).to_parquet(str(path))
            paths.append(path)
        return paths
    path = out if out.suffix == ".parquet" else out / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(path))
    return [path]


def _count(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 and n >= 1000 else str(n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pflower.data.recipes", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every recipe: source, run config")
    b = sub.add_parser("build", help="write a recipe's local parquet file(s)")
    b.add_argument("name", choices=sorted(RECIPES))
    b.add_argument("--source", help="hub name (default: the recipe's), local copy or release")
    b.add_argument("--out", type=Path, required=True, help="a .parquet path or a folder")
    b.add_argument("--dev-per-class", type=int, default=1200, help="cifar10-dev-check")
    b.add_argument("--check-per-class", type=int, default=600, help="cifar10-dev-check")
    args = p.parse_args(argv)
    if args.command == "list":
        for r in RECIPES.values():
            print(f"{r.name}: {r.about}")
            print(f"    source: {r.hub or '-'}" + (f"; or {r.release}" if r.release else ""))
            print(f"    run config: {r.run_config} dataset='<the built file>'")
        return 0
    source = args.source or RECIPES[args.name].hub
    if not source:
        p.error(f"{args.name} has no hub copy: --source {RECIPES[args.name].release}")
    try:
        paths = build(args.name, source, args.out, args.dev_per_class, args.check_per_class)
    except RecipeError as err:
        print(f"recipe {args.name}: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    recipe = RECIPES[args.name]
    print(
        f"run it: bash scripts/dev.sh run --run-config \"{recipe.run_config} dataset='{paths[0]}'\""
    )
    if args.name == "fed-heart-disease":  # deployed: each hospital holds only its own file
        sites = fed_heart_disease.site_folder(paths[0])
        print(f"deploy it (docs/DEPLOYMENT.md): each hospital's own file is in {sites}/;")
        print(
            f"  each site: python -m deploy.site --site cleveland --data-path {sites}/cleveland.csv ..."
        )
        print(
            f'  then: flwr run . pflower --stream --run-config "{fed_heart_disease.DEPLOY_CONFIG}"'
        )
        print("  (no input-shape: the sites' data give it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
