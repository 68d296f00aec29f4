"""A simulation past one machine (#60): a Ray cluster of two nodes, a head and a
worker in two network namespaces joined by a veth pair, each with its own address,
and ``bash scripts/dev.sh run`` (the real ``flwr run``) joining it through
``RAY_ADDRESS``: clients run on both nodes (docs/DEPLOYMENT.md section 11)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from server_app.loopback import BIN, REPO, free_ports

pytestmark = pytest.mark.slow


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def pids_in(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def actors_in(name: str) -> list[int]:
    """Ray's ClientApp actors whose process lives in the network namespace ``name``."""
    inode, found = netns_inode(name), []
    for proc in Path("/proc").iterdir():
        try:
            if (
                os.stat(proc / "ns" / "net").st_ino == inode
                and b"ClientAppActor" in (proc / "cmdline").read_bytes()
            ):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def temp_of(ns: str) -> Path:
    """The Ray temp folder of the node in ``ns`` (short: Ray's socket paths)."""
    return Path(f"/tmp/pflr{ns}")


def stop_and_delete(ns: str) -> None:
    """Stop every process in ``ns`` (TERM, then KILL), delete it and its temp folder."""
    for signal_name in ("TERM", "KILL"):
        pids = pids_in(ns)
        if pids:
            subprocess.run(["kill", f"-{signal_name}", *map(str, pids)])
            time.sleep(3)
    subprocess.run(["ip", "netns", "del", ns])
    shutil.rmtree(temp_of(ns), ignore_errors=True)


def sweep_leftovers() -> list[str]:
    """The namespaces an earlier run of this test left when it was killed (its
    ``finally`` never ran): named by this test (``pflh``/``pflw`` and the pid of the
    test process that made them) and that process gone. What is in them was started
    by that run; stopped, and deleted with their temp folders. Returns their names."""
    swept = []
    for path in Path("/run/netns").glob("pfl[hw]*"):
        owner = path.name[4:]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            stop_and_delete(path.name)
            swept.append(path.name)
    return swept


def ray_node(ns: str, address: str, temp: Path, head: str = "") -> subprocess.Popen:
    role = ["--address", f"{head}"] if head else ["--head", f"--port={address.split(':')[1]}"]
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, str(BIN / "ray"), "start", "--block", *role]
        + [f"--node-ip-address={address.split(':')[0]}", "--num-cpus=1", "--num-gpus=0"]
        + ["--object-store-memory=100000000", "--disable-usage-stats", f"--temp-dir={temp}"]
        + (["--include-dashboard=false"] if not head else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def test_flwr_run_places_clients_on_both_nodes_of_a_two_namespace_ray_cluster(tmp_path):
    # not skipped: CI runs as root (the compose end-to-end needs it too)
    assert os.geteuid() == 0, "network namespaces need root"
    (port,) = free_ports(1)
    nodes: list[subprocess.Popen] = []
    sweep_leftovers()
    # named by this process: a run killed before its cleanup is swept by the next
    head_ns, worker_ns = f"pflh{os.getpid()}", f"pflw{os.getpid()}"
    net = f"10.{200 + port % 50}.{port % 250}"
    head_ip, worker_ip = f"{net}.1", f"{net}.2"
    temp = {ns: temp_of(ns) for ns in (head_ns, worker_ns)}
    sh("ip", "netns", "add", head_ns)
    sh("ip", "netns", "add", worker_ns)
    try:
        sh("ip", "link", "add", f"h{port}", "type", "veth", "peer", "name", f"w{port}")
        for ns, dev, ip in ((head_ns, f"h{port}", head_ip), (worker_ns, f"w{port}", worker_ip)):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        address = f"{head_ip}:{port}"
        nodes = [ray_node(head_ns, address, temp[head_ns])]
        deadline = time.monotonic() + 120
        while not list(temp[head_ns].glob("session_*/logs/gcs_server.out")):
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        nodes.append(ray_node(worker_ns, f"{worker_ip}:0", temp[worker_ns], head=address))
        alive = [
            str(BIN / "python"),
            "-c",
            f"import ray; ray.init(address='{address}', logging_level='ERROR'); "
            "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))",
        ]
        while True:  # the worker registered with the head, from its own address
            out = subprocess.run(
                ["ip", "netns", "exec", head_ns, *alive], capture_output=True, text=True
            ).stdout
            if str(sorted([head_ip, worker_ip])) in out:
                break
            assert time.monotonic() < deadline, f"the worker did not join: {out}"
            time.sleep(2)

        home = tmp_path / "flwr-home"
        env = {
            **os.environ,
            "RAY_ADDRESS": address,
            "FLWR_HOME": str(home),
            "PFLOWER_SKIP_SETUP": "1",
            "VENV": str(BIN.parent),
        }
        out_dir = tmp_path / "out"
        run = subprocess.Popen(
            ["ip", "netns", "exec", head_ns, "bash", "scripts/dev.sh", "run"]
            + ["--run-config", f"num-server-rounds=3 output-dir='{out_dir}'"]
            + ["--federation-config", "num-supernodes=6"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        on_head: set[int] = set()
        on_worker: set[int] = set()
        while run.poll() is None:  # the actors each node runs, while they run
            on_head.update(actors_in(head_ns))
            on_worker.update(actors_in(worker_ns))
            time.sleep(0.5)
        log = run.stdout.read() if run.stdout else ""
        assert run.returncode == 0, log[-3000:]
        assert on_worker, "no ClientApp actor ran in the worker's namespace"
        assert on_head, "no ClientApp actor ran in the head's namespace"
        (results,) = out_dir.glob("*/results.json")
        rounds = json.loads(results.read_text())["rounds"]
        assert [r["round"] for r in rounds] == [1, 2, 3]
        assert len(rounds[-1]["per_client_accuracy"]) == 6
    finally:
        for ns in (head_ns, worker_ns):  # every process in them was started here
            stop_and_delete(ns)
        for node in nodes:  # reaped: no zombie left to the test process
            node.wait(timeout=30)


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
