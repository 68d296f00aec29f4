"""The Hugging Face data path: sources, partitioners and scenarios."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from methods import parse_run_config
from pflower.config.schema import ConfigError, RunConfig
from pflower.data import data_info, load_client_data
from pflower.data.client_arrays import load_client_arrays
from pflower.data.hf import (
    DOMAIN_SHIFTS,
    NO_TABLE_KEYS,
    apply_domain_shift,
    hf_data_info,
    label_permutation,
    load_source,
    source_from_dataset,
)
from pflower.data.partitions import (
    dirichlet_client_partitions,
    domain_groups,
    domain_partitions,
    groups_for,
    library_partitions,
    natural_partition,
    semantic_groups,
)

CIFAR_DEV = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cifar10-dev-12k.parquet"
)


def _tabular(n: int = 600, num_classes: int = 10, seed: int = 0, **extra) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    cols = {
        "f0": rng.standard_normal(n).astype(np.float32),
        "f1": rng.standard_normal(n).astype(np.float32),
        "label": np.arange(n) % num_classes,
    }
    cols.update(extra)
    return datasets.Dataset.from_dict(cols)


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def image_parquet(tmp_path_factory) -> str:
    """200 random 8x8 RGB images, 4 classes, HF Image struct, written as parquet."""
    rng = np.random.default_rng(0)
    imgs = [
        {"bytes": _png(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)), "path": None}
        for _ in range(200)
    ]
    feats = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c", "d"])}
    )
    ds = datasets.Dataset.from_dict(
        {"img": imgs, "label": [i % 4 for i in range(200)]}, features=feats
    )
    path = tmp_path_factory.mktemp("img") / "tiny.parquet"
    ds.to_parquet(str(path))
    return str(path)


# ------------------------------------------------------------------ library partitioners


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological"])
def test_library_partitioners_deterministic_and_complete(kind):
    src = source_from_dataset(_tabular(1000))
    a = library_partitions(src, kind, 10, seed=3, alpha=0.5, classes_per_client=3)
    b = library_partitions(src, kind, 10, seed=3, alpha=0.5, classes_per_client=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    rows = np.concatenate(a)
    assert len(rows) == 1000 and len(np.unique(rows)) == 1000
    c = library_partitions(src, kind, 10, seed=4, alpha=0.5, classes_per_client=3)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_pathological_classes_per_client():
    src = source_from_dataset(_tabular(1000))
    for rows in library_partitions(src, "pathological", 8, seed=0, classes_per_client=2):
        assert len(np.unique(src.labels[rows])) <= 2


# ------------------------------------------------------------------ dirichlet-client


def test_dirichlet_client_exact_sizes_and_disjoint():
    labels = np.arange(5000) % 10
    parts = dirichlet_client_partitions(labels, 10, 6, 0.5, 50, 10, seed=1)
    again = dirichlet_client_partitions(labels, 10, 6, 0.5, 50, 10, seed=1)
    seen = []
    for (tr, te), (tr2, te2) in zip(parts, again, strict=True):
        assert len(tr) == 50 and len(te) == 10
        assert not set(tr) & set(te)
        assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
        seen += list(tr) + list(te)
    assert len(set(seen)) == len(seen)  # pools large enough: no repeats across clients


def test_dirichlet_client_train_and_test_share_their_clients_class_proportions():
    """A client's train and test sets come from its one q_i ~ Dir(alpha): their class
    histograms are close (total variation), those of two clients are far apart."""
    labels = np.arange(50_000) % 10
    parts = dirichlet_client_partitions(labels, 10, 6, 0.5, 400, 400, seed=1)

    def share(rows: np.ndarray) -> np.ndarray:
        return np.bincount(labels[rows], minlength=10) / len(rows)

    def tv(a: np.ndarray, b: np.ndarray) -> float:
        return 0.5 * float(np.abs(a - b).sum())

    own = [tv(share(tr), share(te)) for tr, te in parts]
    other = [tv(share(a[0]), share(b[1])) for a in parts for b in parts if a is not b]
    assert max(own) < 0.12  # multinomial noise of 400 draws
    assert np.mean(other) > 0.4 and min(other) > 2 * max(own)


def test_dirichlet_client_refills_pools(caplog):
    labels = np.arange(200) % 4
    with caplog.at_level("WARNING"):
        parts = dirichlet_client_partitions(labels, 4, 10, 1.0, 30, 5, seed=0)
    assert sum("rows repeat" in r.message for r in caplog.records) == 1
    for tr, te in parts:
        assert len(tr) == 30 and len(te) == 5 and not set(tr) & set(te)


def test_dirichlet_client_end_to_end(image_parquet):
    cfg = RunConfig(
        dataset=image_parquet,
        partitioner="dirichlet-client",
        train_per_client=20,
        test_per_client=5,
    )
    x_tr, y_tr, x_te, y_te = load_client_arrays(cfg, 1, 4)
    assert x_tr.shape == (20, 3, 8, 8) and x_te.shape == (5, 3, 8, 8)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64


# ------------------------------------------------------------------ natural ids


def test_natural_partitioner_with_split_column(tmp_path):
    n = 120
    ds = _tabular(
        n,
        4,
        writer_id=[f"w{i % 3}" for i in range(n)],
        split=["test" if i % 5 == 0 else "train" for i in range(n)],
    )
    path = tmp_path / "nat.parquet"
    ds.to_parquet(str(path))
    src = load_source(str(path))
    rows = natural_partition(src, "writer_id", 1)
    assert set(src.columns["writer_id"][rows]) == {"w1"}  # sorted ids: w0, w1, w2
    cfg = RunConfig(dataset=str(path), partitioner="natural", partition_by="writer_id")
    x_tr, y_tr, x_te, y_te = load_client_arrays(cfg, 1, 3)
    assert len(y_tr) + len(y_te) == 40
    assert len(y_te) == 8  # the split column decides, not test-fraction (0.2 * 40 = 8 too)
    cfg = cfg.model_copy(update={"test_fraction": 0.5})
    assert len(load_client_arrays(cfg, 1, 3)[3]) == 8
    assert x_tr.shape[1] == 2  # id and split columns are not features
    with pytest.raises(ConfigError, match="partition-by"):
        load_client_arrays(cfg, 3, 4)


@pytest.mark.parametrize(
    "ids", [["va", "cleveland", "hungary", "switzerland"], [12, 3, 7], ["b", "a b", "a"]]
)
def test_natural_partition_is_flwr_datasets_natural_id_partitioner(tmp_path, ids, capfd):
    """The rows and their order are the library's, for text and integer columns
    (pflower.data.partitions computes them itself: the library prints a progress bar)."""
    from flwr_datasets.partitioner import NaturalIdPartitioner

    from benchmarks.scale import flower_partitions
    from pflower.data.tables import Tabular

    rng = np.random.default_rng(0)
    column = [ids[i] for i in rng.integers(0, len(ids), 90)]
    path = tmp_path / "nat.parquet"
    _tabular(90, 3, site=column).to_parquet(str(path))
    src = load_source(str(path), Tabular(exclude=("site",)))  # an id column, not a feature
    capfd.readouterr()
    library = flower_partitions(
        NaturalIdPartitioner(partition_by="writer"), src.labels, src.columns["site"]
    )
    assert len(library) == len(ids)
    for pid in range(len(ids)):
        assert natural_partition(src, "site", pid).tolist() == library[pid].tolist()
    assert "partition_id_to_indices" in capfd.readouterr().err  # the library's bar, ours none
    natural_partition(src, "site", 0)
    assert capfd.readouterr().err == ""


# ------------------------------------------------------------------ scenarios


def test_permute_labels_bijection_per_client():
    perms = [label_permutation(10, 0, i) for i in range(5)]
    for p in perms:
        assert sorted(p) == list(range(10))
    assert len({tuple(p) for p in perms}) == 5
    assert np.array_equal(label_permutation(10, 0, 2), perms[2])


def test_permute_labels_end_to_end(image_parquet):
    base = RunConfig(dataset=image_parquet, partitioner="iid", seed=2)
    perm = base.model_copy(update={"permute_labels": True})
    for pid in range(3):
        _, y, _, _ = load_client_arrays(base, pid, 3)
        _, yp, _, _ = load_client_arrays(perm, pid, 3)
        mapping = {}
        for a, b in zip(y, yp, strict=True):
            assert mapping.setdefault(a, b) == b  # a function of the original label
        assert len(set(mapping.values())) == len(mapping)  # injective


def test_domain_groups_disjoint_classes():
    labels = np.arange(2000) % 10
    groups = domain_groups(10, 4, seed=0)
    assert sorted(np.concatenate(groups)) == list(range(10))
    parts = domain_partitions(labels, groups, 8, seed=0)
    for g in range(4):
        cls = set(groups[g])
        members = [parts[i] for i in range(g, 8, 4)]
        for rows, new in members:
            assert set(labels[rows]) <= cls
            assert set(new) == set(range(len(cls)))
        assert not set(members[0][0]) & set(members[1][0])  # IID split within the group
    for g1 in range(4):
        for g2 in range(g1 + 1, 4):
            assert not set(labels[parts[g1][0]]) & set(labels[parts[g2][0]])
    with pytest.raises(ConfigError, match="num-domains"):
        domain_groups(3, 4, seed=0)


def _class_map(rows: np.ndarray, new: np.ndarray, labels: np.ndarray) -> dict[int, int]:
    pairs = set(zip(labels[rows].tolist(), new.tolist(), strict=True))
    mapping = dict(pairs)
    assert len(mapping) == len(pairs)  # one new label per class: a permutation
    return mapping


def test_each_client_permutes_its_groups_labels_its_own_way():
    labels = np.arange(3000) % 10
    groups = (np.array([0, 1, 8, 9]), np.array([2, 3, 4, 5, 6, 7]))
    parts = domain_partitions(labels, groups, 10, seed=0)
    maps = [_class_map(rows, new, labels) for rows, new in parts]
    for g, cls in enumerate(groups):
        members = range(g, 10, 2)
        for i in members:
            assert sorted(maps[i]) == cls.tolist()
            assert sorted(maps[i].values()) == list(range(len(cls)))
        # the clients of one group name the same classes differently
        assert len({tuple(sorted(maps[i].items())) for i in members}) > 1


def _cifar10_like(n: int = 200, coarse: bool = False):
    names = [
        "airplane",
        "automobile",
        "bird",
        "cat",
        "deer",
        "dog",
        "frog",
        "horse",
        "ship",
        "truck",
    ]
    cols = {"x0": np.arange(n, dtype=np.float32), "label": (np.arange(n) % 10).tolist()}
    feats = {"x0": datasets.Value("float32"), "label": datasets.ClassLabel(names=names)}
    if coarse:  # CIFAR-100's layout: a superclass per row
        cols["coarse_label"] = ((np.arange(n) % 10) // 5).tolist()
        feats["coarse_label"] = datasets.ClassLabel(names=["first", "second"])
        cols["fine_label"] = cols.pop("label")
        feats["fine_label"] = datasets.ClassLabel(names=[f"c{i}" for i in range(10)])
        del feats["label"]
    return source_from_dataset(datasets.Dataset.from_dict(cols, features=datasets.Features(feats)))


def test_semantic_groups_from_cifar10_names_and_from_coarse_labels():
    groups = semantic_groups(_cifar10_like())
    assert {k: v.tolist() for k, v in groups.items()} == {
        "vehicles": [0, 1, 8, 9],
        "animals": [2, 3, 4, 5, 6, 7],
    }
    coarse = semantic_groups(_cifar10_like(coarse=True))
    assert [v.tolist() for v in coarse.values()] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    src = _cifar10_like()
    assert [g.tolist() for g in groups_for(src, "auto", 4, 0)] == [[0, 1, 8, 9], [2, 3, 4, 5, 6, 7]]
    assert len(groups_for(src, "random", 4, 0)) == 4
    plain = source_from_dataset(
        datasets.Dataset.from_dict({"x0": [0.0, 1.0, 2.0], "label": [0, 1, 2]})
    )
    assert semantic_groups(plain) is None
    assert len(groups_for(plain, "auto", 3, 0)) == 3  # no semantic groups: random ones
    with pytest.raises(ConfigError, match="domain-groups"):
        groups_for(plain, "semantic", 3, 0)
    with pytest.raises(ConfigError, match="domain-groups"):
        parse_run_config({"domain-groups": "coarse"})


def test_domain_partitioner_end_to_end(image_parquet):
    cfg = RunConfig(dataset=image_parquet, partitioner="domain", num_domains=2)
    ys = [np.concatenate([a[1], a[3]]) for a in (load_client_arrays(cfg, i, 4) for i in range(4))]
    assert all(set(y) <= {0, 1} for y in ys)


def test_domain_shift_transforms():
    x = np.random.default_rng(0).random((2, 3, 8, 8), dtype=np.float32)
    outs = [apply_domain_shift(x, i) for i in range(len(DOMAIN_SHIFTS))]
    assert np.allclose(outs[0], x)
    for o in outs:
        assert o.shape == x.shape and o.dtype == np.float32
    assert np.allclose(outs[5], 1 - x)
    assert np.allclose(outs[1][:, 0], outs[1][:, 1])  # grayscale


def test_client_data_paths_whole(image_parquet, tmp_path):
    other = tmp_path / "other.parquet"
    _tabular(50).to_parquet(str(other))
    cfg = RunConfig(client_data_paths=f"{image_parquet},{image_parquet}", test_fraction=0.25)
    cd = load_client_data(cfg, 1, 2)
    assert cd.x_train.shape == (150, 3, 8, 8) and cd.y_test.shape == (50,)
    assert data_info(cfg).input_shape == (3, 8, 8)
    with pytest.raises(ConfigError, match="client-data-paths"):
        load_client_arrays(cfg, 2, 3)
    whole = load_client_arrays(RunConfig(), 0, 5, data_path=str(other))
    assert len(whole[1]) + len(whole[3]) == 50


# ------------------------------------------------------------------ sources and errors


def test_missing_local_path_names_dataset_key():
    cfg = RunConfig(dataset="/nonexistent/dir/data.parquet")
    with pytest.raises(FileNotFoundError, match="'dataset'"):
        load_client_arrays(cfg, 0, 2)
    with pytest.raises(FileNotFoundError, match="'dataset'"):
        load_client_arrays(RunConfig(), 0, 2, data_path="/nonexistent/site")


def test_offline_hub_name_gives_clear_error(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="local path via dataset="):
        hf_data_info("surely-not-cached-org/surely-not-a-dataset")


def test_unreachable_hub_fails_fast(monkeypatch):
    import pflower.data.loading as loading

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading, "_hub_reachable", lambda: False)
    with pytest.raises(RuntimeError, match="local path via dataset="):
        hf_data_info("someorg/some-dataset")


def test_image_folder_with_splits(tmp_path):
    rng = np.random.default_rng(1)
    for split, n in (("train", 6), ("test", 2)):
        for cls in ("cat", "dog"):
            d = tmp_path / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(
                    d / f"{i}.png"
                )
    info = hf_data_info(str(tmp_path))
    assert info.input_shape == (3, 12, 10) and info.num_classes == 2
    _, y_tr, _, y_te = load_client_arrays(RunConfig(), 0, 1, data_path=str(tmp_path))
    assert len(y_tr) == 12 and len(y_te) == 4


def test_new_config_keys_validate_and_name_key():
    cfg = parse_run_config({"num-domains": 3, "domain-shift": True, "client-data-paths": "a,b"})
    assert cfg.num_domains == 3 and cfg.domain_shift and cfg.client_data_paths == "a,b"
    with pytest.raises(ConfigError, match="num-domains"):
        parse_run_config({"num-domains": 0})
    with pytest.raises(ConfigError, match="domain-shift"):
        parse_run_config({"domain-shift": "maybe"})


def test_sklearn_digits():
    info = hf_data_info("sklearn-digits")
    assert info.input_shape == (1, 8, 8) and info.num_classes == 10
    x_tr, y_tr, x_te, y_te = load_client_arrays(
        RunConfig(dataset="sklearn-digits", partitioner="dirichlet", alpha=0.5), 0, 5
    )
    assert x_tr.shape[1:] == (1, 8, 8) and abs(float(x_tr.mean())) < 1.0


def test_idx_converter(tmp_path):
    import gzip
    import struct

    from pflower.data.convert_idx import convert

    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        imgs = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labs = (np.arange(n) % 10).astype(np.uint8)
        with gzip.open(tmp_path / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
            f.write(struct.pack(">HBB3I", 0, 8, 3, n, 28, 28) + imgs.tobytes())
        with gzip.open(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(struct.pack(">HBBI", 0, 8, 1, n) + labs.tobytes())
    out = tmp_path / "fm.parquet"
    assert convert(tmp_path, out) == 40
    assert hf_data_info(str(out)).input_shape == (1, 28, 28)
    _, y_tr, _, y_te = load_client_arrays(RunConfig(), 0, 1, data_path=str(out))
    assert len(y_tr) == 30 and len(y_te) == 10  # the split column from the file names


@pytest.mark.slow
def test_cifar_dev_file_loads():
    assert CIFAR_DEV.exists(), f"the shared data beside the checkout is missing: {CIFAR_DEV}"
    info = hf_data_info(str(CIFAR_DEV))
    assert info.input_shape == (3, 32, 32) and info.num_classes == 10
    cfg = RunConfig(dataset=str(CIFAR_DEV), partitioner="dirichlet", alpha=0.5)
    x_tr, y_tr, x_te, y_te = load_client_arrays(cfg, 0, 20)
    assert x_tr.shape[1:] == (3, 32, 32) and x_tr.dtype == np.float32
    assert y_tr.max() < 10 and len(y_tr) + len(y_te) > 0


def test_the_shared_neurons_carry_the_label_only_when_most_of_the_teacher_is_shared():
    """docs/main_job.md's measurement: with the paper's first setting (half the neurons,
    40% of the covariates shared) the shared neurons carry ~4% of the label's variance
    (a perfect shared model is near chance), with the main job's (80%, 80%) most of it."""
    from pflower.data.synthetic import generate_simulation_study, label_share_of_shared_neurons

    def share(p: float, alpha: float) -> dict:
        study = generate_simulation_study(
            20, 200, shared_neurons=p, shared_covariates=alpha, keep_teachers=True
        )
        return label_share_of_shared_neurons(study)

    half, main_job = share(0.5, 0.4), share(0.8, 0.8)
    assert half["variance_share_shared"] < 0.1 < 0.5 < main_job["variance_share_shared"]
    assert half["accuracy_shared_part_alone"] < 0.6 < main_job["accuracy_shared_part_alone"]
    assert main_job["accuracy_personal_part_alone"] < half["accuracy_personal_part_alone"]
    with pytest.raises(ValueError, match="keep_teachers"):
        label_share_of_shared_neurons(generate_simulation_study(2, 20))


@pytest.mark.parametrize(
    "shared_neurons, shared_covariates", [(0.5, 0.4), (1.0, 0.4), (0.5, 0.0), (0.0, 1.0)]
)
def test_one_simulated_client_is_drawn_alone_as_the_whole_study_draws_it(
    shared_neurons, shared_covariates
):
    """A process serving some of 100,000 simulated clients draws each one alone from
    where its draws begin (16 bytes a client kept), the same bits as the whole study."""
    from pflower.data.synthetic import StudyArgs, generate_simulation_study, simulated_client

    shape = StudyArgs(30, 16, 12, shared_neurons, shared_covariates, 0.1, 5)
    study = generate_simulation_study(9, *shape)
    for client in (8, 0, 3):
        x, y = simulated_client(client, 9, shape)
        assert np.array_equal(x, study.features[client])
        assert np.array_equal(y, study.labels[client])


def test_per_client_streams_draw_a_client_alone_whatever_the_federation_size():
    """``sim-client-streams``: client c's data come from its own stream, the same in
    the whole study and drawn alone, in a federation of 9 or of a million; another
    draw than the study's one stream, with the same shared part (its first draws)."""
    from pflower.data.synthetic import StudyArgs, generate_simulation_study, simulated_client

    shape = StudyArgs(30, 16, 12, 0.5, 0.4, 0.1, 5)
    study = generate_simulation_study(9, *shape, False, True)
    one_stream = generate_simulation_study(9, *shape)
    assert np.array_equal(study.output_weights, one_stream.output_weights)
    for client in (8, 0, 3):
        x, y = simulated_client(client, 9, shape, client_streams=True)
        assert np.array_equal(x, study.features[client])
        assert np.array_equal(y, study.labels[client])
        far, _ = simulated_client(client, 1_000_000, shape, client_streams=True)
        assert np.array_equal(far, x)
        assert not np.array_equal(x, one_stream.features[client])
    x, _ = simulated_client(999_999, 1_000_000, shape, client_streams=True)
    assert x.shape == (30, 16) and np.isfinite(x).all()


def test_the_simulation_study_draws_what_every_recorded_result_was_made_with():
    """The generator's stream, pinned: the main job's and the papers' tables were made
    with these draws (a digest of the data of an earlier commit's generator)."""
    from pflower.data.synthetic import generate_simulation_study

    study = generate_simulation_study(4, 10, hidden=20)
    digest = hashlib.sha256()
    for x, y in zip(study.features, study.labels):
        digest.update(x.tobytes())
        digest.update(y.tobytes())
    assert digest.hexdigest()[:16] == "0aebc5fc91695866"


def test_a_simulated_client_is_loaded_without_the_whole_study(monkeypatch):
    import pflower.data as data

    def whole(*args, **kwargs):
        raise AssertionError("the whole study was generated")

    monkeypatch.setattr(data, "generate_simulation_study", whole)
    cfg = RunConfig(sim_samples=20, seed=13)
    got = data.build_client_data(cfg, 2, 6)
    assert got.num_train + int(got.y_test.shape[0]) == 20


@pytest.mark.parametrize(
    "pil_mode, mode, size, fast",
    [
        ("RGB", "RGB", (8, 6), True),  # the CIFAR case: decoded by torchvision
        ("L", "L", (8, 6), True),
        ("L", "RGB", (8, 6), False),  # a mode conversion: PIL's, as before
        ("RGB", "L", (8, 6), False),
        ("RGBA", "RGB", (8, 6), False),
        ("P", "RGB", (8, 6), False),  # a palette
        ("I;16", "L", (8, 6), False),  # 16-bit
        ("RGB", "RGB", (4, 4), False),  # a resize
    ],
)
def test_an_image_decodes_to_the_same_pixels_whichever_decoder_reads_it(
    pil_mode: str, mode: str, size: tuple[int, int], fast: bool
) -> None:
    from pflower.data.hf import _decode, png_as_is

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (6, 8, 4), dtype=np.uint8)
    img = Image.fromarray(pixels, "RGBA")
    img = img if pil_mode == "RGBA" else img.convert("RGB").convert(pil_mode)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    data = buf.getvalue()
    shape = (1 if mode == "L" else 3, size[1], size[0])
    assert png_as_is(data, mode, shape) is fast
    got = _decode({"bytes": data, "path": None}, mode, shape)
    expected = Image.open(io.BytesIO(data)).convert(mode)  # the reference: PIL, as before
    if expected.size != size:
        expected = expected.resize(size, Image.BILINEAR)
    arr = np.asarray(expected, dtype=np.uint8)
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    assert got.shape == shape and got.dtype == np.uint8
    np.testing.assert_array_equal(got, arr)


def test_client_data_kept_only_for_a_federation_within_the_budget(monkeypatch):
    """A federation whose clients' tensors fit the budget is kept whole between
    messages; a larger one is rebuilt each message (an LRU smaller than it would miss
    every message of a round that asks every client, its slots held for nothing)."""
    import pflower.data as data

    small, large = RunConfig(sim_samples=20, seed=11), RunConfig(sim_samples=20, seed=12)
    one = data.build_client_data(small, 0, 4).nbytes
    monkeypatch.setattr(data, "CLIENT_DATA_BUDGET", 4 * one)
    assert load_client_data(small, 1, 4) is load_client_data(small, 1, 4)  # kept
    first = load_client_data(large, 1, 5)  # the first client of a federation tells its size
    again = load_client_data(large, 1, 5)
    assert again is not first  # rebuilt, not kept
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            (first.x_train, first.y_train, first.x_test, first.y_test),
            (again.x_train, again.y_train, again.x_test, again.y_test),
        )
    )
    before = data._kept_client_data.cache_info().currsize
    for pid in range(5):
        load_client_data(large, pid, 5)
    assert data._kept_client_data.cache_info().currsize == before  # nothing more kept


def _fresh_copy(path: str, tmp_path: Path, name: str) -> str:
    """The parquet under a new path: a source of its own (load_source caches by path)."""
    copy = tmp_path / f"{name}.parquet"
    copy.write_bytes(Path(path).read_bytes())
    return str(copy)


def test_a_shared_set_that_fits_is_decoded_whole_once_with_the_same_pixels(
    image_parquet, tmp_path, monkeypatch
):
    import pflower.data.hf as hf
    from pflower.data import decode_shared_data

    monkeypatch.setattr(hf, "_STATS_ROWS", 16)  # the statistics decode 16 rows of 200
    whole = RunConfig(dataset=_fresh_copy(image_parquet, tmp_path, "whole"))
    by_row = RunConfig(dataset=_fresh_copy(image_parquet, tmp_path, "by-row"))
    decode_shared_data(whole)
    src = load_source(whole.dataset, NO_TABLE_KEYS)  # as the clients call it
    assert src._whole and src._done.all()  # every row, before any client asked
    monkeypatch.setattr(hf, "DECODE_WHOLE_BYTES", 200 * 3 * 8 * 8 - 1)  # one byte short
    decode_shared_data(by_row)
    rows = load_source(by_row.dataset, NO_TABLE_KEYS)
    assert not rows._whole and rows._done.sum() == 16  # only the statistics' rows
    for pid in range(4):  # every client's arrays, to the bit, either way
        for a, b in zip(load_client_arrays(whole, pid, 4), load_client_arrays(by_row, pid, 4)):
            np.testing.assert_array_equal(a, b)


def test_a_simulated_client_decodes_the_shared_set_whole_and_a_site_its_rows(
    image_parquet, tmp_path, monkeypatch
):
    from flwr.common import Context, RecordDict

    import pflower.data.hf as hf
    from client_app.app import build_client

    monkeypatch.setattr(hf, "_STATS_ROWS", 16)  # the statistics decode 16 rows of 200

    def build(node: dict, name: str) -> object:
        config = {"dataset": _fresh_copy(image_parquet, tmp_path, name), "model": "mlp"}
        build_client(
            Context(1, 1, {"partition-id": 0, "num-partitions": 4, **node}, RecordDict(), {}),
            config,
        )
        return load_source(config["dataset"], NO_TABLE_KEYS)

    assert build({}, "simulated")._whole
    site = build({"site": "a", "state-dir": str(tmp_path / "state")}, "site")
    assert not site._whole and site._done.sum() < 200
