"""Tabular data as a user brings it (pflower/data/tables.py) and the Fed-Heart-Disease recipe
(pflower/data/fed_heart_disease.py): label, split, feature and categorical columns, missing
values refused, each site standardised with its own training rows, FLamby's split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmarks.presets import SHARED_DATA
from methods import parse_run_config
from pflower.config.schema import ConfigError
from pflower.data import data_info, load_client_data

# the shared data folder the presets read ($PFLOWER_DATA_DIR or ../shared/data): required,
# as the CIFAR-10 dev file is, so a missing copy fails rather than skips
HEART = SHARED_DATA / "fed-heart-disease"
TABLE = {
    "partitioner": "natural",
    "partition-by": "hospital",
    "label-column": "outcome",
    "split-column": "part",
    "categorical-columns": "ward:a/b/c",
}


def _hospitals(path: Path, rows: int = 40, **change: object) -> Path:
    """Three hospitals' records with a fixed train/test column, as a CSV."""
    rng = np.random.default_rng(0)
    frames = []
    for h, shift in (("north", 0.0), ("south", 5.0), ("west", -3.0)):
        x = rng.normal(shift, 1.0 + abs(shift), size=(rows, 2))
        frames.append(
            pd.DataFrame(
                {
                    "hospital": h,
                    "age": x[:, 0] * 10 + 50,
                    "dose": x[:, 1],
                    "ward": rng.choice(["a", "b", "c"], size=rows),
                    "outcome": (x[:, 0] + x[:, 1] > 2 * shift).astype(int),
                    "part": ["test" if i % 4 == 0 else "train" for i in range(rows)],
                }
            )
        )
    df = pd.concat(frames, ignore_index=True)
    for column, value in change.items():
        if value is None:
            df = df.drop(columns=[column])
        elif value == "":  # a missing cell: empty in the CSV
            df[column] = df[column].astype(float)
            df.loc[3, column] = np.nan
        else:
            df.loc[3, column] = value
    df.to_csv(path, index=False)
    return path


def _cfg(path: Path, **extra: object):  # noqa: ANN202
    return parse_run_config({"dataset": str(path), "model": "logreg", **TABLE, **extra})


def test_a_sites_features_are_standardised_with_its_own_training_rows(tmp_path) -> None:
    path = _hospitals(tmp_path / "h.csv")
    cfg = _cfg(path)
    assert data_info(cfg).input_shape == (4,)  # age, dose, ward=b, ward=c
    df = pd.read_csv(path)
    for i, name in enumerate(("north", "south", "west")):  # sorted: one client each
        data = load_client_data(cfg, i, 3)
        mine = df[df.hospital == name]
        assert data.num_train == (mine.part == "train").sum()
        assert data.y_test.shape[0] == (mine.part == "test").sum()  # the fixed test set
        x = data.x_train.numpy()
        assert np.allclose(x.mean(axis=0), 0, atol=1e-5) and np.allclose(
            x.std(axis=0), 1, atol=1e-4
        )
        train = mine[mine.part == "train"]
        test = mine[mine.part == "test"]
        expected = (test.age - train.age.mean()) / train.age.std(ddof=0)
        assert np.allclose(data.x_test[:, 0].numpy(), expected.to_numpy(), atol=1e-4)
        assert torch.equal(data.y_test, torch.tensor(test.outcome.to_numpy()))


def test_a_table_runs_end_to_end_with_one_client_per_hospital(tmp_path) -> None:
    from pflower.engine.inprocess import run_inprocess

    path = _hospitals(tmp_path / "h.csv")
    raw = {"dataset": str(path), "model": "logreg", **TABLE, "local-steps": 5}
    raw |= {"batch-size": 4, "num-server-rounds": 2, "output-dir": str(tmp_path)}
    res = run_inprocess({**raw, "run-name": "t"}, 3)
    last = res["rounds"][-1]
    # each client named by its hospital (the partition column's value), not client-0..2
    assert sorted(last["per_client_accuracy"]) == ["north", "south", "west"]
    assert last["per_client_samples"]["south"] == {"train": 30, "test": 10}
    assert 0.0 <= last["accuracy_mean"] <= 1.0


@pytest.mark.parametrize(
    ("change", "key", "says"),
    [
        ({"dose": ""}, "feature-columns", "'dose' .* 1 missing"),
        ({"ward": "d"}, "categorical-columns", r"'ward' .*\['d'\] outside"),
        ({"ward": None}, "categorical-columns", "'ward' is not in"),
        ({"outcome": ""}, "label-column", "'outcome' .* 1 missing"),
        ({"part": "validation"}, "split-column", "'train' or 'test'"),
    ],
)
def test_a_table_that_does_not_fit_the_run_is_refused_naming_the_key(
    tmp_path, change: dict, key: str, says: str
) -> None:
    path = _hospitals(tmp_path / "h.csv", **change)
    with pytest.raises(ConfigError, match=f"config key '{key}'.*{says}|'{key}'.*{says}"):
        load_client_data(_cfg(path), 0, 3)


def test_categorical_levels_must_be_declared_and_distinct() -> None:
    with pytest.raises(ConfigError, match="'categorical-columns'"):
        from pflower.data.tables import parse_categorical

        parse_categorical("ward:a")


def test_local_steps_take_exactly_that_many_batches_whatever_the_site_size() -> None:
    from client_app.train import epoch_batches

    cfg = parse_run_config({"local-steps": 7, "batch-size": 4})
    g = torch.Generator().manual_seed(0)
    for n in (3, 10, 100):
        x, y = torch.zeros(n, 2), torch.zeros(n, dtype=torch.int64)
        assert len(list(epoch_batches(x, y, cfg, g))) == 7
    one_pass = parse_run_config({"batch-size": 4})
    assert len(list(epoch_batches(torch.zeros(10, 2), torch.zeros(10), one_pass, g))) == 3


def test_the_recipe_reproduces_flambys_split_row_by_row(tmp_path) -> None:
    from pflower.data.recipes import main

    assert main(["build", "fed-heart-disease", "--source", str(HEART), "--out", str(tmp_path)]) == 0
    built = pd.read_parquet(tmp_path / "fed-heart-disease.parquet")
    ref = pd.read_csv(HEART / "flamby_split.csv")
    kept = ref[ref.split != "dropped"]
    assert len(built) == len(kept) == 740
    got = built.set_index(["centre", "record_id"])[["split", "label"]]
    want = kept.set_index(["centre", "file_row"])[["split", "label"]]
    want.index.names = got.index.names
    assert got.sort_index().equals(want.sort_index().astype(got.dtypes.to_dict()))
    sizes = built.groupby(["centre", "split"]).size().unstack()
    assert sizes.loc["switzerland"].tolist() == [16, 30]  # test, train
    cfg = parse_run_config(
        {"dataset": str(tmp_path / "fed-heart-disease.parquet"), "model": "logreg"}
        | {"partitioner": "natural", "partition-by": "centre", "label-column": "label"}
        | {"categorical-columns": "cp:1/2/3/4,restecg:0/1/2"}
    )
    assert data_info(cfg).input_shape == (13,)  # FLamby's 13 inputs
    assert load_client_data(cfg, 2, 4).num_train == 30  # Switzerland
    # each hospital's own file, for a deployment: its rows only, the same 13 inputs
    from flwr.common.config import parse_config_args

    from pflower.data.fed_heart_disease import DEPLOY_CONFIG, site_folder

    deployed = parse_run_config(dict(parse_config_args([DEPLOY_CONFIG])))
    assert not deployed.input_shape and deployed.partitioner != "natural"
    files = sorted(site_folder(tmp_path / "fed-heart-disease.parquet").glob("*.csv"))
    assert [f.stem for f in files] == ["cleveland", "hungarian", "switzerland", "va"]
    own = pd.read_csv(files[2])
    assert len(own) == 46 and "centre" not in own.columns  # Switzerland's 16 + 30
    assert data_info(deployed, str(files[2])).input_shape == (13,)
    assert load_client_data(deployed, 0, 1, str(files[2])).num_train == 30


def test_the_recipe_says_which_file_is_missing(tmp_path, capsys) -> None:
    """Three of the four hospitals' files are there: the one missing is named."""
    import shutil

    from pflower.data.recipes import main

    source = tmp_path / "source"
    source.mkdir()
    for name in ("cleveland", "switzerland", "va"):
        shutil.copyfile(HEART / f"processed.{name}.data", source / f"processed.{name}.data")
    assert (
        main(["build", "fed-heart-disease", "--source", str(source), "--out", str(tmp_path)]) == 2
    )
    err = capsys.readouterr().err
    assert "processed.hungarian.data" in err and str(source) in err
    assert "cleveland" not in err


def test_the_report_interval_is_honest_about_few_and_equal_seeds() -> None:
    from benchmarks.fed_heart_disease import interval

    assert interval([50.0, 50.0])[1] == "all 2 seeds equal"
    assert interval([70.0])[1] == "one seed"
    mean, text = interval([0.0, 100.0])  # a t-interval of two seeds spans past 0-100
    assert mean == 50.0 and text == "[0.0, 100.0]* (n=2: not meaningful)"
    _, text = interval([70.0, 72.0, 74.0, 71.0, 73.0])
    lo, hi = (float(v) for v in text.strip("[]").split(","))
    assert 69.0 < lo < 72.0 < hi < 75.0


@pytest.mark.parametrize(("drop", "ready"), [(None, True), ("ward", False)])
def test_a_sites_own_csv_passes_or_fails_the_site_check_in_one_line(
    tmp_path, capsys, drop: str | None, ready: bool
) -> None:
    from tests.test_site_check import check

    site = tmp_path / "north.csv"
    df = pd.read_csv(_hospitals(tmp_path / "all.csv"))
    df = df[df.hospital == "north"].drop(columns=["hospital"])
    (df if drop is None else df.drop(columns=[drop])).to_csv(site, index=False)
    run = "method='fedavg' model='logreg' label-column='outcome' split-column='part' "
    run += "categorical-columns='ward:a/b/c' input-shape='4' num-classes=2"
    assert check(tmp_path, site, run) == (0 if ready else 2)
    if not ready:
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "config key 'categorical-columns'" in err[0], err
        assert "'ward' is not in" in err[0]


@pytest.mark.parametrize("declared", [False, True])
def test_a_site_checks_its_own_column_names_and_is_told_a_folder_is_not_its_csv(
    tmp_path, capsys, declared: bool
) -> None:
    """A hospital whose label column is 'target' passes the check against a run that
    says 'outcome' when it declares its own (--label-column); its folder, not its
    CSV, is refused in one line saying so."""
    from tests.test_site_check import check

    site = tmp_path / "sites" / "north.csv"
    site.parent.mkdir()
    df = pd.read_csv(_hospitals(tmp_path / "all.csv"))
    df = df[df.hospital == "north"].drop(columns=["hospital"]).rename(columns={"outcome": "target"})
    df.to_csv(site, index=False)
    run = "method='fedavg' model='logreg' label-column='outcome' split-column='part' "
    run += "categorical-columns='ward:a/b/c' input-shape='4' num-classes=2"
    own = ("--label-column", "target") if declared else ()
    assert check(tmp_path, site, run, *own) == (0 if declared else 2)
    capsys.readouterr()
    assert check(tmp_path, site.parent, run, *own) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "a folder of CSV files (north.csv)" in err[0], err


@pytest.mark.slow
def test_the_fed_heart_disease_preset_and_report_reduced(tmp_path) -> None:
    """The preset's CI variant: two rows, one seed, two rounds; the report names the
    hospitals, their test-set sizes and FLamby's published rows."""
    from benchmarks.__main__ import main
    from benchmarks.fed_heart_disease import report

    argv = ["run", "fed-heart-disease", "--rows", "fedavg", "fedper", "--seeds", "0"]
    assert main([*argv, "--rounds", "2", "--settings", "logreg", "--out", str(tmp_path)]) == 0
    text = report(tmp_path / "runs" / "fed-heart-disease", tmp_path).read_text()
    line = next(x for x in text.splitlines() if x.startswith("| `fedper` | 1 |"))
    assert "Cleveland Clinic (n=104)" in text and "Univ. Hospitals Zurich and Basel (n=16)" in text
    assert line.count("one seed") == 6  # four centres, their mean and the AUC
    assert "| FLamby FedAvg | 68.5 |" in text and (tmp_path / "fed-heart-disease.png").exists()


def test_the_flamby_replica_reads_the_same_inputs_as_the_engine(tmp_path) -> None:
    """benchmarks/studies/flamby_fedavg.py (the replica outside our engine) and our loader
    give every centre the same standardised 13 inputs and labels, in the same order."""
    from benchmarks.studies.flamby_fedavg import centres, fedavg
    from pflower.data.recipes import main

    main(["build", "fed-heart-disease", "--source", str(HEART), "--out", str(tmp_path)])
    cfg = parse_run_config(
        {"dataset": str(tmp_path / "fed-heart-disease.parquet"), "model": "logreg"}
        | {"partitioner": "natural", "partition-by": "centre", "label-column": "label"}
        | {"categorical-columns": "cp:1/2/3/4,restecg:0/1/2"}
    )
    replica = centres(HEART, standardise=True)
    for i, (x_tr, y_tr, x_te, y_te) in enumerate(replica):
        ours = load_client_data(cfg, i, 4)
        assert torch.allclose(ours.x_train, x_tr, atol=1e-5)
        assert torch.allclose(ours.x_test, x_te, atol=1e-5)
        assert torch.equal(ours.y_train, y_tr.long()) and torch.equal(ours.y_test, y_te.long())
    accs = fedavg(replica, seed=0, rounds=1, steps=2)
    assert len(accs) == 4 and all(0.0 <= a <= 1.0 for a in accs)
    assert accs == fedavg(replica, seed=0, rounds=1, steps=2)  # seeded


def test_check_passes_a_users_csv_and_names_the_site_whose_csv_lacks_a_column(
    tmp_path, capsys
) -> None:
    """``dev.sh check`` (pflower.cli) on a user's table: one CSV split by a column in
    simulation passes; one CSV per hospital, the last without a declared column, is
    refused in one line naming the key and that hospital (#45, #46: every site)."""
    from pflower.cli.__main__ import check

    whole = _hospitals(tmp_path / "all.csv")
    keys = " ".join(f"{k}='{v}'" for k, v in TABLE.items())
    run = f"dataset='{whole}' model='logreg' method='fedavg' {keys}"
    assert check(["--run-config", run, "--federation-config", "num-supernodes=3"]) == 0
    assert "(2 classes, 4)" in capsys.readouterr().out

    df = pd.read_csv(whole)
    paths = []
    for name in ("north", "south", "west"):
        mine = df[df.hospital == name].drop(columns=["hospital"])
        if name == "west":
            mine = mine.drop(columns=["ward"])
        mine.to_csv(tmp_path / f"{name}.csv", index=False)
        paths.append(str(tmp_path / f"{name}.csv"))
    keys = "label-column='outcome' split-column='part' categorical-columns='ward:a/b/c'"
    run = f"client-data-paths='{','.join(paths)}' model='logreg' method='fedavg' {keys}"
    assert check(["--run-config", run, "--federation-config", "num-supernodes=3"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "site 2 (west.csv)" in err[0], err
    assert "'categorical-columns'" in err[0] and "'ward' is not in" in err[0], err
