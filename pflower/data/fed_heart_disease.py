"""Fed-Heart-Disease: the UCI Heart Disease files of four hospitals as one table,
with FLamby's preprocessing and train/test split (docs/DATA.md;
`python -m pflower.data.recipes build fed-heart-disease --source <folder of the files>`).

FLamby's protocol: drop ``slope``, ``ca`` and ``thal``, then every row with a missing
value (a zero cholesterol is kept); label = ``num > 0``; each centre split on its own,
34% to test with scikit-learn's ``train_test_split`` (seed 43), stratified on the
label where the centre has both classes with more than two rows each. The table keeps
the raw feature values: ``cp`` and ``restecg`` are one-hot encoded by the run config
(``categorical-columns``), and each site standardises with its own training rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# the UCI files, in FLamby's centre order (0-3); the centre names sort in that order
CENTRES = (
    ("cleveland", "processed.cleveland.data"),
    ("hungarian", "processed.hungarian.data"),
    ("switzerland", "processed.switzerland.data"),
    ("va", "processed.va.data"),
)
HOSPITALS = {
    "cleveland": "Cleveland Clinic",
    "hungarian": "Hungarian Inst. of Cardiology",
    "switzerland": "Univ. Hospitals Zurich and Basel",
    "va": "VA Long Beach",
}
COLUMNS = (
    *("age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang"),
    *("oldpeak", "slope", "ca", "thal", "num"),
)
DROPPED = ("slope", "ca", "thal")
RUN_CONFIG = (
    "model='logreg' partitioner='natural' partition-by='centre' label-column='label' "
    "categorical-columns='cp:1/2/3/4,restecg:0/1/2' num-server-rounds=15 local-steps=100 "
    "batch-size=4 optimizer='adam' lr=0.001"
)


def read_centre(path: Path) -> Any:
    """One UCI file as a DataFrame: headerless CSV, '?' missing."""
    import pandas as pd

    return pd.read_csv(path, header=None, names=list(COLUMNS), na_values="?")


def flamby_split(labels: np.ndarray) -> np.ndarray:
    """'train' / 'test' for each kept row of one centre, as FLamby assigns them."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(len(labels))
    counts = np.bincount(labels, minlength=2)
    stratify = labels if (counts > 2).all() else None
    _, test = train_test_split(rows, test_size=0.34, random_state=43, stratify=stratify)
    split = np.full(len(labels), "train", dtype=object)
    split[test] = "test"
    return split


def table(folder: Path) -> Any:
    """The four centres as one DataFrame: centre, record_id (the row of its file),
    split, label and the ten kept features, raw."""
    import pandas as pd

    parts = []
    for centre, name in CENTRES:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"no {name} in {folder} (the four UCI processed.*.data files)")
        df = read_centre(path).drop(columns=list(DROPPED))
        kept = df.dropna()
        labels = (kept["num"] > 0).astype(np.int64).to_numpy()
        part = kept.drop(columns=["num"]).astype("float64")
        part.insert(0, "label", labels)
        part.insert(0, "split", flamby_split(labels))
        part.insert(0, "record_id", kept.index.to_numpy(np.int64))
        part.insert(0, "centre", centre)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


# a deployment: each hospital its own CSV (site_files), the shape from the sites' data
DEPLOY_CONFIG = (
    "model='logreg' label-column='label' categorical-columns='cp:1/2/3/4,restecg:0/1/2' "
    "num-server-rounds=15 local-steps=100 batch-size=4 optimizer='adam' lr=0.001 "
    "min-available-clients=4"
)


def build(folder: Path, out: Path) -> Path:
    """Write the table as parquet (``out``: a .parquet path or a folder), and each
    hospital's own rows as ``<centre>.csv`` in ``fed-heart-disease-sites/`` beside it
    (what a site of a deployment holds)."""
    path = out if out.suffix == ".parquet" else out / "fed-heart-disease.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    whole = table(folder)
    whole.to_parquet(path, index=False)
    sites = site_folder(path)
    sites.mkdir(exist_ok=True)
    for centre, rows in whole.groupby("centre"):
        rows.drop(columns=["centre"]).to_csv(sites / f"{centre}.csv", index=False)
    return path


def site_folder(built: Path) -> Path:
    """Where ``build`` writes each hospital's own CSV."""
    return built.parent / "fed-heart-disease-sites"
