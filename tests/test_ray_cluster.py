"""A simulation past one machine (#60, #94): a Ray cluster of two nodes, a head and a
worker in two network namespaces joined by a veth pair, each with its own address
(harness/ray_cluster.py), and the scale benchmark's ``flwr run`` cell (``bash
scripts/dev.sh run``, the real ``flwr run``) joining it through ``RAY_ADDRESS``:
clients run on both nodes (docs/DEPLOYMENT.md section 11)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness.ray_cluster import pids_in, sh, sweep_leftovers, temp_of, two_node_cluster

pytestmark = pytest.mark.slow


def test_the_scale_cell_runs_through_flwr_run_on_both_nodes_of_a_two_namespace_cluster(tmp_path):
    """scale-1m's ci-2000 cell (2,000 clients, 20 a round, 2 rounds) as ``python -m
    benchmarks scale --ray-cluster`` runs it: from the head's namespace, joined to the
    cluster; a ClientApp actor ran in each namespace, every round has its 20 clients,
    and the cluster report has the cell's row."""
    # not skipped: CI runs as root (the compose end-to-end needs it too)
    from benchmarks.scale import cluster_cells, cluster_report

    runs = tmp_path / "runs"
    with two_node_cluster() as cluster:
        nodes = cluster.node_pids()
        seen = cluster_cells(cluster, ["ci-2000"], runs)
    log = next(runs.glob("scale-1m/ci-2000/*/cell.log"), None)
    assert seen["ci-2000"]["exit"] == 0, log.read_text()[-3000:] if log else "no cell log"
    assert seen["ci-2000"]["worker"], "no ClientApp actor ran in the worker's namespace"
    assert seen["ci-2000"]["head"], "no ClientApp actor ran in the head's namespace"
    (results,) = runs.glob("scale-1m/ci-2000/flwr_run-seed0/results.json")
    res = json.loads(results.read_text())
    assert res["federation_size"] == 2000
    assert [len(r["per_client_train_loss"]) for r in res["rounds"]] == [20, 20]
    assert json.loads((results.parent / "cell.json").read_text())["peak_rss"] > 0
    table = cluster_report(tmp_path / "none", runs, ["ci-2000"], ["(the test)"])
    (row,) = [line for line in table if line.startswith("| 2,000 |")]
    assert row.endswith(f"| {seen['ci-2000']['head']}, {seen['ci-2000']['worker']} |")
    assert not any(Path(f"/proc/{pid}").exists() for pid in nodes)  # Ray stopped


def test_a_killed_runs_namespaces_are_swept_and_a_live_runs_are_not() -> None:
    """What a killed run leaves (its namespace, a process in it, its temp folder) is
    swept by the next; the namespaces of a run whose process still lives are not."""
    assert os.geteuid() == 0, "network namespaces need root"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    dead, alive = f"pflh{gone.pid}", f"pflw{os.getpid()}"
    for ns in (dead, alive):
        sh("ip", "netns", "add", ns)
    temp_of(dead).mkdir(exist_ok=True)
    left = subprocess.Popen(["ip", "netns", "exec", dead, "sleep", "600"])
    try:
        time.sleep(0.5)
        assert pids_in(dead) == [left.pid]
        assert dead in sweep_leftovers()
        assert left.wait(timeout=10) != 0  # stopped
        assert not Path(f"/run/netns/{dead}").exists()
        assert not temp_of(dead).exists()
        assert Path(f"/run/netns/{alive}").exists()  # its process (this one) lives
    finally:
        left.kill()
        for ns in (dead, alive):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
