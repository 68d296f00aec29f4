"""Run one simulation in-process (tests, benchmarks): the same apps as ``flwr run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flwr.simulation import run_simulation

from client_app.app import make_client_app
from pflower.results import git_commit_once
from server_app.app import make_server_app


def simulate(
    config: dict[str, Any],
    num_clients: int,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    ray_init_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run a simulation with ``config`` over the defaults; return results.json.

    ``config`` must set ``output-dir`` and ``run-name`` so the results can be found.
    """
    if not config.get("run-name"):
        raise ValueError("simulate() needs a 'run-name' to find its results")
    backend: dict[str, Any] = {"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus}}
    if ray_init_args:
        backend["init_args"] = ray_init_args
    git_commit_once(Path.cwd())  # here, not in the server thread while Ray forks
    run_simulation(
        server_app=make_server_app(config),
        client_app=make_client_app(config),
        num_supernodes=num_clients,
        backend_config=backend,
    )
    path = Path(config.get("output-dir", "outputs")).resolve() / config["run-name"] / "results.json"
    if not path.exists():
        raise RuntimeError(f"the simulation wrote no results at {path}: see the log above")
    return json.loads(path.read_text())
