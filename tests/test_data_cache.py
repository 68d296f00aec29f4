"""The site-local data cache of a deployed ClientApp (pflower/data/cache.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.presets import subset_parquet
from methods import parse_run_config
from pflower.data import DataInfo, data_info, load_client_data
from pflower.data.hf import Tabular


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
    plain = load_client_data.__wrapped__(cfg, 0, 1, site)
    first = load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
    assert "data cache: wrote" in caplog.text and len(entries(state)) == 1
    import pflower.data.hf

    def no_decode(*args, **kwargs):
        raise AssertionError("the cached data were decoded again")

    with pytest.MonkeyPatch.context() as patch:  # a read of the cache, not a decode
        patch.setattr(pflower.data.hf, "load_client_arrays", no_decode)
        again = load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
    assert "data cache: loaded" in caplog.text
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(plain, name), getattr(first, name))
        assert torch.equal(getattr(plain, name), getattr(again, name))
    assert again.x_train.is_contiguous() and again.x_train.dtype == torch.float32


def test_a_changed_data_set_or_config_gets_its_own_entry(site, tmp_path) -> None:
    state = tmp_path / "state"
    cfg = parse_run_config({"dataset": site})
    load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
    load_client_data.__wrapped__(
        parse_run_config({"dataset": site, "seed": 3}), 0, 1, site, str(state)
    )
    assert len(entries(state)) == 2
    Path(site).touch()  # the site's data changed (new modification time)
    load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
    assert len(entries(state)) == 3


def test_a_corrupt_cache_is_rebuilt_and_logged(site, tmp_path, caplog) -> None:
    state = tmp_path / "state"
    cfg = parse_run_config({"dataset": site})
    good = load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
    (entry,) = entries(state)
    x = np.load(entry / "x_train.npy")
    x[0] += 1.0
    np.save(entry / "x_train.npy", x)  # same shape, wrong values: the checksum catches it
    again = load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
    assert "unusable (checksum mismatch); rebuilding" in caplog.text
    assert torch.equal(good.x_train, again.x_train)
    (entry / "y_test.npy").write_bytes(b"not an array")
    load_client_data.__wrapped__(cfg, 0, 1, site, str(state))
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
