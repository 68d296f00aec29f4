"""The ``flwr-run`` engine: a cell run as a user runs the project, ``bash scripts/dev.sh
run`` (the pre-flight, then ``flwr run . --stream`` on the local SuperLink flwr starts,
which runs Flower's Ray simulation in a ``flwr-simulation`` process of its own).

The cell gets its own FLWR_HOME (``<cell dir>/flwr-home``) and free ports, never
Flower's default ones; flwr 1.39 starts the local SuperLink detached, so its
processes are not the cell's children: ``run_processes`` finds them by that FLWR_HOME
in their command line (for the runner's memory samples), and they are stopped by pid
when the cell ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from benchmarks.presets import REPO, Cell

FLWR_HOME = "flwr-home"


def home(cell: Cell) -> Path:
    return cell.dir / FLWR_HOME


def toml_value(value: Any) -> str:
    """A run-config value as ``--run-config`` takes it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def command(cell: Cell) -> list[str]:
    """``dev.sh run`` with the cell's whole config and its federation."""
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in sorted(cell.config.items()))
    cpus = int(cell.num_cpus) if float(cell.num_cpus).is_integer() else cell.num_cpus  # flwr's type
    federation = f"num-supernodes={cell.clients} client-resources-num-cpus={cpus}"
    federation += f" client-resources-num-gpus={cell.num_gpus}"
    return ["bash", "scripts/dev.sh", "run", "--run-config", run_config, "--federation-config"] + [
        federation
    ]


def environment(cell: Cell) -> dict[str, str]:
    from server_app.loopback import free_ports

    http, control = free_ports(2)
    return {
        **os.environ,
        "FLWR_HOME": str(home(cell)),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "VENV": str(Path(sys.executable).parent.parent),
        "PFLOWER_SKIP_SETUP": "1",  # this environment is the project's
    }


def run_processes(flwr_home: Path) -> list[psutil.Process]:
    """The local SuperLink's processes of the cell whose FLWR_HOME is ``flwr_home``
    (flwr 1.39 starts it detached: it is no child of the cell's process)."""
    marker = str(flwr_home)
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if any(marker in a for a in cmdline) and any("flower-superlink" in a for a in cmdline):
            out.append(p)
    return out


def stop(flwr_home: Path) -> None:
    """Stop the cell's local SuperLink (and what it started) by pid."""
    procs = []
    for root in run_processes(flwr_home):
        try:
            procs += [*root.children(recursive=True), root]
        except psutil.Error:
            continue
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue


def run_flwr(cell: Cell) -> None:
    """The cell through ``dev.sh run``; RuntimeError with its exit code if it failed."""
    home(cell).mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(command(cell), cwd=REPO, env=environment(cell))
    finally:
        stop(home(cell))
    if proc.returncode != 0:
        raise RuntimeError(f"dev.sh run exited with {proc.returncode}")
