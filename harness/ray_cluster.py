"""A two-node Ray cluster on this machine, for tests and benchmarks: a head and a
worker in two network namespaces joined by a veth pair, each with its own address
(docs/DEPLOYMENT.md section 11; the commands are in
docs/notes/2026-11-27-a-ray-cluster-across-two-network-namespaces.md). A run joins it
through ``RAY_ADDRESS`` from inside the head's namespace (``Cluster.env``,
``Cluster.exec``).

Needs root. The namespaces are named by a prefix and the id of the process that
made them (``pflh<pid>``, ``pflw<pid>``): every process in them was started here and
is stopped by pid, and a run killed before its cleanup is swept by the next
(``sweep_leftovers``: only namespaces whose owner process is gone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.loopback import BIN, free_ports

START_SECONDS = 120  # the head's start and the worker's joining, each


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
    return Path(f"/tmp/{ns}")


def stop_and_delete(ns: str) -> None:
    """Stop every process in ``ns`` (TERM, then KILL), delete it and its temp folder."""
    for signal_name in ("TERM", "KILL"):
        pids = pids_in(ns)
        if pids:
            subprocess.run(["kill", f"-{signal_name}", *map(str, pids)])
            time.sleep(3)
    subprocess.run(["ip", "netns", "del", ns])
    shutil.rmtree(temp_of(ns), ignore_errors=True)


def sweep_leftovers(prefix: str = "pfl") -> list[str]:
    """The namespaces an earlier run left when it was killed (its cleanup never ran):
    named ``<prefix>h<pid>`` / ``<prefix>w<pid>`` and that process gone. What is in
    them was started by that run; stopped, and deleted with their temp folders.
    Returns their names."""
    swept = []
    for path in sorted(Path("/run/netns").glob(f"{prefix}[hw]*")):
        owner = path.name[len(prefix) + 1 :]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            stop_and_delete(path.name)
            swept.append(path.name)
    return swept


def ray_node(ns: str, address: str, temp: Path, head: str = "") -> subprocess.Popen:
    """``ray start --block`` in ``ns`` (one CPU): the head at ``address``, or a worker
    joining ``head``. ``ip netns exec`` execs it: the Popen's pid is Ray's."""
    role = ["--address", f"{head}"] if head else ["--head", f"--port={address.split(':')[1]}"]
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, str(BIN / "ray"), "start", "--block", *role]
        + [f"--node-ip-address={address.split(':')[0]}", "--num-cpus=1", "--num-gpus=0"]
        + ["--object-store-memory=100000000", "--disable-usage-stats", f"--temp-dir={temp}"]
        + (["--include-dashboard=false"] if not head else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


@dataclass
class Cluster:
    """A started two-node cluster: its namespaces, addresses and Ray processes."""

    head_ns: str
    worker_ns: str
    head_ip: str
    worker_ip: str
    address: str  # the head's GCS, host:port
    nodes: list[subprocess.Popen] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        """This environment with ``RAY_ADDRESS`` set: a run joins the cluster."""
        return {**os.environ, "RAY_ADDRESS": self.address, **extra}

    def exec(self, *command: str) -> list[str]:
        """``command`` run inside the head's namespace."""
        return ["ip", "netns", "exec", self.head_ns, *command]

    def node_pids(self) -> list[int]:
        """The two ``ray start`` processes: Ray's services and workers descend from them."""
        return [n.pid for n in self.nodes]

    def actors(self) -> tuple[list[int], list[int]]:
        """The ClientApp actors running now on the head and on the worker."""
        return actors_in(self.head_ns), actors_in(self.worker_ns)


@contextmanager
def two_node_cluster(prefix: str = "pfl") -> Iterator[Cluster]:
    """Start the cluster, yield it once the worker has joined from its own address,
    then stop every process in both namespaces and delete them."""
    assert os.geteuid() == 0, "network namespaces need root"
    (port,) = free_ports(1)
    sweep_leftovers(prefix)
    net = f"10.{200 + port % 50}.{port % 250}"
    cluster = Cluster(
        f"{prefix}h{os.getpid()}", f"{prefix}w{os.getpid()}", f"{net}.1", f"{net}.2", ""
    )
    cluster.address = f"{cluster.head_ip}:{port}"
    head, worker = cluster.head_ns, cluster.worker_ns
    sh("ip", "netns", "add", head)
    sh("ip", "netns", "add", worker)
    try:
        h, w = f"{prefix}h{port}", f"{prefix}w{port}"
        sh("ip", "link", "add", h, "type", "veth", "peer", "name", w)
        for ns, dev, ip in ((head, h, cluster.head_ip), (worker, w, cluster.worker_ip)):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        cluster.nodes.append(ray_node(head, cluster.address, temp_of(head)))
        deadline = time.monotonic() + START_SECONDS
        while not list(temp_of(head).glob("session_*/logs/gcs_server.out")):
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        worker_address = f"{cluster.worker_ip}:0"
        cluster.nodes.append(ray_node(worker, worker_address, temp_of(worker), cluster.address))
        alive = [
            str(BIN / "python"),
            "-c",
            f"import ray; ray.init(address='{cluster.address}', logging_level='ERROR'); "
            "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))",
        ]
        deadline = time.monotonic() + START_SECONDS
        while True:  # the worker registered with the head, from its own address
            out = subprocess.run(cluster.exec(*alive), capture_output=True, text=True).stdout
            if str(sorted([cluster.head_ip, cluster.worker_ip])) in out:
                break
            assert time.monotonic() < deadline, f"the worker did not join: {out}"
            time.sleep(2)
        yield cluster
    finally:
        for ns in (head, worker):  # every process in them was started here
            stop_and_delete(ns)
        for node in cluster.nodes:  # reaped: no zombie left to this process
            node.wait(timeout=30)
