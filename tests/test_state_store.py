"""The on-disk personal state cannot be steered or clobbered (#32): names that reach the
file system are validated, two models never share a state file, a file that does not
fit is kept aside (never a crash), and two SuperNodes never share a state directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client_app.app import experiment_id
from deploy.site import lock_state_dir
from deploy.site import main as site_main
from methods import get_method, parse_run_config
from pflower.config.schema import ConfigError
from pflower.data import data_info
from pflower.engine.inprocess import run_inprocess

SMALL = {"sim-samples": 60, "num-server-rounds": 2, "method": "fedper"}


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "/abs", "x y", "."])
def test_a_run_name_that_is_not_one_folder_name_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="'run-name'"):
        parse_run_config({"run-name": name})
    assert parse_run_config({"run-name": "fedper-seed0_v1.2"}).run_name


def test_the_default_experiment_id_differs_between_models() -> None:
    ids = set()
    for hidden in (16, 32):
        cfg = parse_run_config({"method": "fedper", "hidden-dim": hidden})
        ids.add(experiment_id(cfg, get_method("fedper").build_model(cfg, data_info(cfg))))
    assert len(ids) == 2 and all(i.startswith("fedper-seed0-") for i in ids)


def test_two_runs_with_different_models_in_one_state_directory_both_complete(tmp_path) -> None:
    state = tmp_path / "state"
    nodes = [{"state-dir": str(state)} for _ in range(2)]  # simulated nodes, on disk
    for hidden in (16, 32):  # same run-name: the second finds the first's files
        cfg = {**SMALL, "hidden-dim": hidden, "output-dir": str(tmp_path / f"o{hidden}")}
        res = run_inprocess({**cfg, "run-name": "same"}, 2, None, nodes)
        assert [r["round"] for r in res["rounds"]] == [1, 2]
    aside = sorted(p.name for p in (state / "same").glob("*.foreign-*.npz"))
    assert len(aside) == 2  # the hidden-16 files, kept, not deleted


def test_two_supernodes_never_share_a_state_directory(tmp_path: Path) -> None:
    fd = lock_state_dir(str(tmp_path))
    try:
        holder = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from deploy.site import lock_state_dir; lock_state_dir({str(tmp_path)!r})",
            ],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert holder.returncode == 1
        assert f"state directory {tmp_path} is in use by pid {os.getpid()}" in holder.stderr
    finally:
        os.close(fd)
    os.close(lock_state_dir(str(tmp_path)))  # free again once the holder is gone


def test_the_site_launcher_turns_flowers_telemetry_off(monkeypatch) -> None:
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "1")
    monkeypatch.delenv("FLWR_DISABLE_UPDATE_CHECK", raising=False)
    site_main(["--superlink=h:1", "--site=a", "--state-dir=s", "--insecure", "--dry-run"])
    assert os.environ["FLWR_TELEMETRY_ENABLED"] == "0"  # inherited by the SuperNode's exec
    assert os.environ["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    docker = Path(__file__).resolve().parents[1] / "docker"
    for dockerfile in docker.glob("*.Dockerfile"):
        assert "FLWR_TELEMETRY_ENABLED=0" in dockerfile.read_text(), dockerfile.name
    dev = (docker.parent / "scripts" / "dev.sh").read_text()
    assert "export FLWR_TELEMETRY_ENABLED=0" in dev
