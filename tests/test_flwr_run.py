"""The README's main job through the real CLI: ``flwr run . --stream``.

flwr 1.39 starts a detached local SuperLink for simulation; the test gives it
its own FLWR_HOME and stops it (found by that FLWR_HOME in its command line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import bare_flwr_env, local_superlink_env

ROOT = Path(__file__).resolve().parents[1]


def _stop_local_superlink(flwr_home: Path) -> None:
    """Stop the local SuperLink this test's `flwr run` started. flwr 1.39 starts it
    detached and records no pid: it is the flower-superlink process whose command
    line holds this test's own temporary FLWR_HOME (its database lives there), so
    it is found by that unique path and stopped by pid, and waited for."""
    ours = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any("flower-superlink" in a for a in p.info["cmdline"] or [])
        and any(str(flwr_home) in a for a in p.info["cmdline"] or [])
    ]
    for proc in ours:
        proc.terminate()
    _, alive = psutil.wait_procs(ours, timeout=15)
    for proc in alive:
        proc.kill()


@pytest.mark.slow
@pytest.mark.flower142
def test_the_readme_main_job_runs_offline(tmp_path: Path) -> None:
    """`bash scripts/dev.sh run` (set-up skipped: this environment is installed), the
    main job for two rounds: it prints no warning from Flower or Ray (#95: none a user
    can act on), and its plot draws FedAvg's and Local's committed curves beside it."""
    home = tmp_path / "flwr-home"
    env = {
        **os.environ,
        **local_superlink_env(home),
        "VENV": str(Path(sys.executable).parent.parent),
        "PFLOWER_SKIP_SETUP": "1",
    }
    env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", None)  # dev.sh must set it
    out_dir = tmp_path / "out"
    cmd = [
        "bash",
        "scripts/dev.sh",
        "run",
        "--run-config",
        f"num-server-rounds=2 output-dir='{out_dir}' run-name='cli'",
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    finally:
        _stop_local_superlink(home)
    log = proc.stdout + proc.stderr
    results = out_dir / "cli" / "results.json"
    assert results.exists(), log[-4000:]
    assert proc.returncode == 0, log[-4000:]
    assert "run finished: every round recorded" in proc.stdout
    assert "options.` fields" not in log  # the project's Flower config is current
    data = json.loads(results.read_text())
    assert [r["round"] for r in data["rounds"]] == [1, 2]
    # the project's federation (scripts/federation.toml): 100 clients
    assert len(data["rounds"][-1]["per_client_accuracy"]) == 100
    assert "History (metrics" not in log  # no metric repeated a round at the end
    assert "round 2/2 model (scored at the end)" in log and f"results: {results}" in log
    assert "round 1/2 model (scored in round 2)" in log  # Flower's [ROUND 2]
    assert "configure_evaluate: no clients selected" not in log  # eval-in-fit, by design
    assert (home / "config.toml").read_text() == (ROOT / "scripts/flower-config.toml").read_text()
    # a first run prints the project's progress and its result: no warning of Flower's
    # (its note on its default federation) or Ray's (its FutureWarning on GPU variables)
    warned = [ln for ln in log.splitlines() if re.search(r"warn", ln, re.IGNORECASE)]
    assert not warned, warned
    assert "federation: 100 simulated SuperNodes (scripts/federation.toml)" in log
    # the main job's plot: this run, and FedAvg's and Local's committed curves
    from pflower.results import plotted_series

    series = plotted_series(out_dir / "cli" / "accuracy.png")
    assert list(series) == [
        "fedfac-static (this run, seed 0)",
        "FedAvg (committed, seeds 0, 1, 2): mean",
        "Local (committed, seeds 0, 1, 2): mean",
    ]
    assert all(rounds == [1, 2] for rounds, _ in series.values())


@pytest.mark.slow
def test_flwr_run_rejects_a_bad_config_before_training(tmp_path: Path) -> None:
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or shutil.which("flwr")
    home = tmp_path / "flwr-home"
    env = bare_flwr_env(home)
    cmd = [flwr, "run", ".", "--stream", "--run-config", f"alpha=0 output-dir='{tmp_path}'"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        _stop_local_superlink(home)
    log = proc.stdout + proc.stderr
    assert "config key 'alpha'" in log, log[-3000:]
    assert "configure_fit" not in log


@pytest.mark.slow
def test_a_bare_flwr_run_prints_no_warning_from_flower_or_ray(tmp_path: Path) -> None:
    """#95: `flwr run .` as a new user types it (Flower's own default federation, a
    fresh FLWR_HOME), one round: the environment the README's set-up made drops
    Flower's warnings a user cannot act on where Flower logs them
    (pflower/flower_notes.py), and Ray says nothing; the run completes."""
    import sysconfig

    from pflower.flower_notes import PTH_NAME, pth_line

    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    assert pth.is_file() and pth.read_text() == pth_line(), "scripts/dev.sh's set-up writes it"
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or shutil.which("flwr")
    home = tmp_path / "flwr-home"
    env = bare_flwr_env(home)
    config = f"num-server-rounds=1 output-dir='{tmp_path / 'out'}'"
    cmd = [flwr, "run", ".", "--stream", "--run-config", config]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        _stop_local_superlink(home)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Run finished 1 round(s)" in log, log[-3000:]
    assert "(2 simulated SuperNodes)" in log  # Flower's default federation, named at INFO
    warned = [ln for ln in log.splitlines() if re.search(r"warn", ln, re.IGNORECASE)]
    assert not warned, warned
