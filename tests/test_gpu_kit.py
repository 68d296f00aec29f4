"""The GPU kit (benchmarks/gpu_kit.py): the carry it builds fits the device tool, its
dry run does the device's steps on this CPU, and a preset's cells stopped at different
rounds are compared at the last round they all reached."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from benchmarks import gpu_kit, presets, report, runner

ROOT = Path(__file__).resolve().parents[1]


def test_a_preset_is_compared_at_the_last_round_every_cell_reached(tmp_path):
    preset = presets.load("tiny")  # fedavg and local, 3 clients, 2 rounds
    runs = tmp_path / "runs"
    two = preset.cells(rounds=2, runs=runs)
    # local stops after round 1 (as at a deadline), fedavg completes its 2 rounds
    one_local = [c for c in preset.cells(rounds=1, runs=runs) if c.label == "local"]
    assert runner.run_preset(preset, [c for c in two if c.label == "fedavg"] + one_local) == []
    assert [gpu_kit.rounds_reached(c) for c in two] == [2, 1]

    common, view = gpu_kit.common_view(preset, two, tmp_path / "view")
    assert common == 1
    full = runner.load_results(two[0])
    cut = runner.load_results(view[0])
    assert [r["round"] for r in cut["rounds"]] == [1]
    assert cut["final_accuracy_mean"] == full["rounds"][0]["accuracy_mean"]
    assert cut["total_bytes_up"] == full["rounds"][0]["bytes_up"] < full["total_bytes_up"]
    # the reporter counts both rows as complete at the common round
    text = report.write(preset, view, ["note"], tmp_path / "out").read_text()
    assert "3 clients, 1 rounds" in text
    assert "| `fedavg` | 1 |" in text and "| `local` | 1 |" in text
    assert gpu_kit.failed_cells(two) == []  # one complete, one stopped after round 1
    # stopped at the deadline before its first round: nothing learned, the call failed
    (stopped,) = [c for c in preset.cells(rounds=2, runs=tmp_path / "other") if c.label == "local"]
    stopped.dir.mkdir(parents=True)
    (stopped.dir / "cell.json").write_text(json.dumps({"ok": False, "reason": "timed out"}))
    assert gpu_kit.cell_status(stopped) == "stopped at the deadline after round 0"
    assert gpu_kit.failed_cells([*two, stopped]) == [stopped]
    lines = gpu_kit.summary_lines(preset, two, common)
    assert "Compared at round 1" in lines[2]
    assert any(line.startswith("| `fedavg` | 0 | 2 |") for line in lines)


def test_the_speed_patches_go_off_only_for_a_version_they_were_not_checked_against(
    monkeypatch,
):
    import pflower.patches as patches

    # set through monkeypatch, so the switch the kit turns off is restored after the test
    monkeypatch.setenv(patches.SWITCH, "1")
    gpu_kit.patches_or_off()  # this environment's torch and flwr: checked
    assert patches.enabled()
    monkeypatch.setitem(patches.TESTED, "torch", ("0.0.",))
    gpu_kit.patches_or_off()
    assert not patches.enabled()


def _runs_on_the_device(wheel: Path) -> bool:
    """A wheel that CPython 3.12 on x86-64 Linux (glibc 2.39) installs."""
    _, _, _, tags = parse_wheel_filename(wheel.name)
    for tag in tags:
        python = tag.interpreter in ("py3", "cp312", "py312") or (
            tag.abi == "abi3" and tag.interpreter.startswith("cp3")
        )
        platform = tag.platform == "any" or (
            tag.platform.endswith("_x86_64") and tag.platform.startswith("manylinux")
        )
        if python and platform:
            return True
    return False


@pytest.mark.slow
def test_prepare_builds_a_carry_under_the_device_limit(tmp_path):
    """The wheels come from the package index (as in CI): one of each missing package,
    at its tested version, each one the device's Python installs; with the project
    tree and the dev set, under 64 MiB. A carry over the limit is refused."""
    wheels, kit = tmp_path / "whl", tmp_path / "kit"
    try:
        _check_the_carry(wheels, kit)
    finally:  # 50 MB of wheels and data: not left in pytest's kept temporary folders
        shutil.rmtree(wheels, ignore_errors=True)
        shutil.rmtree(kit, ignore_errors=True)


def _check_the_carry(wheels: Path, kit: Path) -> None:
    sizes = gpu_kit.prepare(wheels, kit)
    pins = gpu_kit.pinned_versions()
    found = {gpu_kit.wheel_dist(w): w for w in wheels.glob("*.whl")}
    assert set(found) == set(gpu_kit.DEVICE_LACKS)
    for name, wheel in found.items():
        assert str(parse_wheel_filename(wheel.name)[1]) == pins[name], wheel.name
        assert _runs_on_the_device(wheel), wheel.name
    assert (kit / "data" / presets.CIFAR10_DEV.name).stat().st_size > 20e6
    assert sizes["total"] == sizes["tree"] + sizes["wheels"] + sizes["data"] < gpu_kit.CARRY_LIMIT
    # a sparse 70 MB file in the kit's folder: the carry would not travel
    with open(kit / "big.bin", "wb") as f:
        f.truncate(70 * 2**20)
    args = ["prepare", "--wheels", str(wheels), "--kit", str(kit)]
    assert gpu_kit.main(args) == 1


@pytest.mark.slow
def test_the_dry_run_does_the_device_steps_on_this_cpu(tmp_path):
    """Both presets' cells, one round each on a subset of the dev set, the Flower
    path on the CPU, the summary, reports, plots and the tarball of the runs."""
    out, work = tmp_path / "out", tmp_path / "work"
    try:
        _dry_run(out, work)
    finally:  # its runs hold ResNet-18 checkpoints and personal state: hundreds of MB
        shutil.rmtree(work, ignore_errors=True)


def _dry_run(out: Path, work: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_kit", "dry-run", "--out", str(out)]
        + ["--work", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "gpu-kit-summary.md").read_text()
    assert "'devices': {'cpu': 3}" in summary
    assert summary.count("Compared at round 1, the last round every cell reached") == 2
    assert "did not complete" not in summary
    cells = [c for name in gpu_kit.PRESETS for c in presets.load(name).cells([0], 1)]
    for name in gpu_kit.PRESETS:
        assert (out / f"{name}.md").exists()
        assert list(out.glob(f"{name}-*.png"))
    with tarfile.open(out / "gpu-kit-runs.tar.gz") as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile(f"runs/{gpu_kit.MANIFEST}"))
    for cell in cells:
        member = f"runs/{cell.preset}/{cell.setting}/{cell.config['run-name']}/results.json"
        assert member in names
    assert not [n for n in names if "personal-state/" in n and n.endswith(".npz")]
    assert manifest["dry_run"] and manifest["calls"][0]["command"].startswith(
        "bash scripts/gpu_kit.sh dry-run"
    )
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back


def test_the_script_names_its_steps():
    proc = subprocess.run(["bash", "scripts/gpu_kit.sh"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "prepare | device" in proc.stderr


def test_the_gpu_efficiency_steps_dry_run_measures_every_way_on_the_cpu(tmp_path, monkeypatch):
    """``bash scripts/gpu_kit.sh dry-run gpu-efficiency``'s steps on this CPU, on a small
    subset: the plain loop, the bare vmap step and both engines of both workloads ran
    (a rate each), and the report names the call."""
    monkeypatch.setattr(gpu_kit, "DRY_RUN_ROWS", 400)
    out = tmp_path / "out"
    data, env = gpu_kit.presets.CIFAR10_DEV, os.environ.get("PFLOWER_DATA_DIR")
    code = gpu_kit.main(["dry-run", "gpu-efficiency", "--out", str(out), "--work", str(tmp_path)])
    assert code == 0
    # the dry run's data subset was this call's: the next test reads the dev set again
    assert gpu_kit.presets.CIFAR10_DEV == data and os.environ.get("PFLOWER_DATA_DIR") == env
    measured = json.loads((out / "gpu-efficiency.json").read_text())["results"]
    assert set(measured) == {"resnet18", "cnn4"}
    for res in measured.values():
        assert set(res["rows"]) == {"plain", "vmap", "per-client", "cohort"}
        assert all(row["img_s"] > 0 for row in res["rows"].values())
    text = (out / "gpu-efficiency.md").read_text()
    assert "bash scripts/gpu_kit.sh dry-run gpu-efficiency" in text and "| cnn4 | cohort |" in text
