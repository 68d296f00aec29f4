"""Per-site launch for real: two sites started with ``python -m deploy.site`` (the
command an operator types), each reading only its own image folder, against a
loopback SuperLink with TLS and SuperNode authentication.

Each site's folder has a different number of images, so what a site trained and
was scored on can be told from its data cache: a partition of anything else would
not have that size. All processes are started here and stopped by pid.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from deploy.site_guard import installed_app_hash, read_ledger
from harness.loopback import LoopbackFederation

pytestmark = pytest.mark.slow

ROUNDS = 2
RUN_TIMEOUT = 900
SIZES = {"site-a": 12, "site-b": 20}  # images per class in each site's own folder


def image_folder(root: Path, per_class: int, seed: int) -> Path:
    """An imagefolder data set: dark and bright 16x16 images, one sub-folder a class."""
    rng = np.random.default_rng(seed)
    for name, level in (("bright", 200), ("dark", 50)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(level, 30, (16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def cached_labels(state_dir: Path) -> np.ndarray:
    """Every label a site's ClientApps loaded (train and test), from its data cache."""
    (entry,) = [p for p in (state_dir / "data-cache").iterdir() if p.is_dir()]
    return np.concatenate([np.load(entry / "y_train.npy"), np.load(entry / "y_test.npy")])


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=pytest.mark.flower142),
        pytest.param(
            "cuda:0",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
            ],
        ),
    ],
)
def test_two_sites_train_on_their_own_folders_over_tls_with_auth(device, tmp_path) -> None:
    folders = {
        site: image_folder(tmp_path / "data" / site, n, seed)
        for seed, (site, n) in enumerate(SIZES.items())
    }
    # the server reads no data: the run declares the input shape and the classes
    with LoopbackFederation(tmp_path / "fed", tls=True, auth=True) as fed:
        fed.make_certs(list(SIZES))
        fed.start_superlink()
        for site in SIZES:
            fed.register(site)
        # site-b starts the plain way: Flower's own SuperNode, ClientApps started cold,
        # still through its own SuperExec (the approved-apps check, the ledger), with
        # a data cache; site-a keeps no copy of its data (the default)
        cold = {"site-b": ("--no-warm", "--data-cache")}
        sites = {
            site: fed.start_site(site, folders[site], device, cold.get(site, ())) for site in SIZES
        }
        for site, proc in sites.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 180, site, proc)
        run_id = fed.run(
            {
                "method": "fedper",
                "model": "cnn4",
                "input-shape": "3,16,16",
                "class-names": "bright,dark",
                "num-server-rounds": ROUNDS,
                "min-available-clients": 2,
                "output-dir": str(fed.root / "out"),
                "run-name": "sites",
            }
        )
        assert fed.wait_run(run_id, RUN_TIMEOUT) == "finished:completed", fed.tail()
        logs = {site: proc.text() for site, proc in sites.items()}

    res = json.loads((fed.root / "out" / "sites" / "results.json").read_text())
    # the server holds no data: its config's default ('synthetic') is not what trained
    assert res["config"]["dataset"] == res["config"]["partitioner"] == "each site's own data"
    assert [r["round"] for r in res["rounds"]] == list(range(1, ROUNDS + 1))
    last = res["rounds"][-1]
    assert sorted(last["per_client_accuracy"]) == sorted(SIZES)
    assert all(r["replies"] == 2 and not r["rejected"] for r in res["rounds"])
    for site, per_class in SIZES.items():
        state = fed.state_dir(site)
        # the launcher's own command line: the site's data, device and no partition
        first_line = logs[site].splitlines()[0]
        assert "deploy.warm_superexec" in first_line  # the site's own SuperExec, always
        supernode = "flower-supernode --superlink" if site == "site-b" else "deploy.fast_supernode"
        assert ("--no-preload" in first_line) == (site == "site-b")
        launched = next(ln for ln in logs[site].splitlines() if supernode in ln)
        # every message it answered is in its ledger, from the build it approved
        ledger = read_ledger(state)
        assert [e["type"] for e in ledger if e["type"] == "train"] == ["train"] * ROUNDS
        assert all(e["app"] == installed_app_hash() and not e["refused"] for e in ledger)
        assert f'data-path="{folders[site]}"' in launched and f'device="{device}"' in launched
        assert "partition-id" not in launched
        # it loaded exactly its own folder, whole: this site's size (both classes, from
        # the cache of the site that asked for one, owner-only; none at the other)
        assert sum(last["per_client_samples"][site].values()) == 2 * per_class
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        if site == "site-b":
            labels = cached_labels(state)
            assert np.bincount(labels).tolist() == [per_class, per_class]
            files = [p for p in (state / "data-cache").rglob("*.npy")]
            assert files and {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
        else:
            assert not (state / "data-cache").exists()
        # its personal head is on its own disk, and only there
        saved = state / "sites" / f"{site}.npz"
        with np.load(saved) as z:
            assert sorted(k for k in z.files if not k.startswith("__")) == [
                "head.bias",
                "head.weight",
            ]
        others = [p for p in fed.root.rglob(f"{site}.npz") if p != saved]
        assert others == []
