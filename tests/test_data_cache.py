"""The site-local data cache of a deployed ClientApp (pflower/data/cache.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.presets import subset_parquet
from methods import parse_run_config
from pflower.data import DataInfo, build_client_data, data_info
from pflower.data.tables import Tabular


@pytest.fixture()
def site(tmp_path) -> str:
    return subset_parquet(200, 1, tmp_path / "site")


def entries(state: Path) -> list[Path]:
    root = state / "data-cache"
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def test_the_cache_gives_the_same_data_and_is_used_again(site, tmp_path, caplog) -> None:
    caplog.set_level("INFO", logger="flwr.pflower")
    cfg = parse_run_config({"dataset": site})
    state = tmp_path / "state"
    plain = build_client_data(cfg, 0, 1, site)
    first = build_client_data(cfg, 0, 1, site, str(state))
    assert "data cache: wrote" in caplog.text and len(entries(state)) == 1
    import pflower.data.client_arrays

    def no_decode(*args, **kwargs):
        raise AssertionError("the cached data were decoded again")

    with pytest.MonkeyPatch.context() as patch:  # a read of the cache, not a decode
        patch.setattr(pflower.data.client_arrays, "load_client_arrays", no_decode)
        again = build_client_data(cfg, 0, 1, site, str(state))
    assert "data cache: loaded" in caplog.text
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(plain, name), getattr(first, name))
        assert torch.equal(getattr(plain, name), getattr(again, name))
    assert again.x_train.is_contiguous() and again.x_train.dtype == torch.float32


def test_a_changed_data_set_or_config_gets_its_own_entry(site, tmp_path) -> None:
    state = tmp_path / "state"
    cfg = parse_run_config({"dataset": site})
    build_client_data(cfg, 0, 1, site, str(state))
    build_client_data(parse_run_config({"dataset": site, "seed": 3}), 0, 1, site, str(state))
    assert len(entries(state)) == 2
    Path(site).touch()  # the site's data changed (new modification time)
    build_client_data(cfg, 0, 1, site, str(state))
    assert len(entries(state)) == 3


def test_a_corrupt_cache_is_rebuilt_and_logged(site, tmp_path, caplog) -> None:
    state = tmp_path / "state"
    cfg = parse_run_config({"dataset": site})
    good = build_client_data(cfg, 0, 1, site, str(state))
    (entry,) = entries(state)
    x = np.load(entry / "x_train.npy")
    x[0] += 1.0
    np.save(entry / "x_train.npy", x)  # same shape, wrong values: the checksum catches it
    again = build_client_data(cfg, 0, 1, site, str(state))
    assert "unusable (checksum mismatch); rebuilding" in caplog.text
    assert torch.equal(good.x_train, again.x_train)
    (entry / "y_test.npy").write_bytes(b"not an array")
    build_client_data(cfg, 0, 1, site, str(state))
    assert caplog.text.count("rebuilding") == 2


def test_data_info_is_kept_on_site_and_follows_the_data(
    site, tmp_path, caplog, monkeypatch
) -> None:
    import pflower.data.hf

    cfg = parse_run_config({"dataset": site})
    state = str(tmp_path / "state")
    decoded = []
    real = pflower.data.hf.hf_data_info

    def counting(source: str, tabular: Tabular) -> DataInfo:
        decoded.append(source)
        return real(source, tabular)

    monkeypatch.setattr(pflower.data.hf, "hf_data_info", counting)
    first = data_info(cfg, site, state)
    assert first == real(site) and decoded == [site]
    assert data_info(cfg, site, state) == first and decoded == [site]  # read, not decoded
    (info,) = (tmp_path / "state" / "data-cache").glob("info-*.json")
    info.write_text("{not json")
    assert data_info(cfg, site, state) == first and len(decoded) == 2
    assert "unusable" in caplog.text and "rebuilding" in caplog.text
    Path(site).touch()  # the site's data changed: decoded again, under a new key
    assert data_info(cfg, site, state) == first and len(decoded) == 3
    assert len(list((tmp_path / "state" / "data-cache").glob("info-*.json"))) == 2


def test_the_cache_is_a_private_copy_readable_by_its_owner_only(site, tmp_path) -> None:
    """A copy of a site's records: folders 0700, files 0600, whatever the umask."""
    import os
    import stat

    cfg = parse_run_config({"dataset": site})
    state = tmp_path / "state"
    old = os.umask(0o022)  # the usual umask would give 0644 files
    try:
        build_client_data(cfg, 0, 1, site, str(state))
        data_info(cfg, site, str(state))
    finally:
        os.umask(old)
    root = state / "data-cache"
    written = [root, *root.rglob("*")]
    assert len([p for p in written if p.name.endswith(".npy")]) == 4
    assert any(p.name.startswith("info-") for p in written)
    for path in written:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode == 0o700, (path, oct(mode))
        elif path.name != "meta.json":  # a checksum, in a 0700 folder
            assert mode == 0o600, (path, oct(mode))


@pytest.mark.parametrize("asked", [None, "disk"])
def test_a_deployed_client_writes_no_copy_of_its_data_unless_its_site_asks(
    site, tmp_path, asked
) -> None:
    """A site's state directory gets a data cache only with node config
    ``data-cache="disk"`` (``deploy.site --data-cache``)."""
    from flwr.common import Context, RecordDict

    from client_app.app import build_client

    state = tmp_path / "state"
    node = {"site": "site-a", "data-path": site, "state-dir": str(state)}
    if asked:
        node["data-cache"] = asked
    run = {"dataset": site, "model": "cnn4", "method": "fedavg"}
    build_client(Context(1, 1, node, RecordDict(), run))
    assert (state / "data-cache").exists() == bool(asked)
