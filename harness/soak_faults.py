"""The soak's faults (harness/soak.py): the seeded schedule, and the means it cuts,
fills and stops with, each made and removed by the harness.

A site's link to the SuperLink is cut two ways:

- **network namespace** (``partition-netns``): one site runs in a network namespace of
  its own, joined to the host by a veth pair; the cut sets its end of the pair down,
  so its packets vanish in the kernel, as in a real partition (no reset: its
  connections time out). Needs root and ``ip``; ``--no-netns`` leaves it out.
- **a proxy the harness controls** (``partition-proxy``): every site dials the
  SuperLink through a relay of its own; the cut stops forwarding and holds every
  connection open in silence, new ones too, then closes them all when it heals (the
  peers reconnect). It needs nothing but a socket, so it runs on any machine.

A full disk is a small tmpfs the harness mounts on each site's state directory and
fills with one file; a corrupt state file is one byte flipped in the site's newest
personal state. Everything here is named with ``PREFIX`` and the harness's pid, so a
run that was killed is swept by the next (``sweep``).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.loopback import CountingRelay

PREFIX = "pfsoak"  # namespaces pfsoak<pid>s<i>, veths pfs<pid>[hp]<i>, folders /tmp/pfsoak-<pid>
TMP = Path("/tmp")

SITE_KINDS = (
    "site-kill",
    "site-stall-long",
    "site-stall-short",
    "partition-netns",
    "partition-proxy",
    "disk-full",
    "corrupt-state",
)
SERVER_KINDS = ("superlink-restart", "serverapp-kill")
KINDS = SITE_KINDS + SERVER_KINDS


@dataclass
class Fault:
    """One planned fault: when (seconds after the soak started), what, whom, and its
    own numbers (a wait, a stall, an outage, seconds)."""

    at: float
    kind: str
    target: str
    seconds: float = 0.0
    log: dict[str, Any] = field(default_factory=dict)  # what happened: times, outcome


def schedule(
    minutes: float,
    seed: int,
    sites: list[str],
    round_timeout: float,
    netns_site: str | None,
    warm_up: float = 45.0,
) -> list[Fault]:
    """The seeded fault plan: at least one fault of every kind (two SuperLink restarts,
    one short and one longer than the SuperLink's 60 s node patience, and two
    ServerApp kills from 30 minutes on), more drawn at random to about one every 100
    s, spread over the soak after ``warm_up`` s and shuffled; the last starts before
    the final 15% of the soak."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS if k != "partition-netns" or netns_site is not None]
    long_run = minutes >= 30
    plan = list(kinds)
    if long_run:
        plan += ["superlink-restart", "serverapp-kill"]
    total = max(len(plan), round(minutes * 60 / 100))
    plan += [rng.choice(kinds) for _ in range(total - len(plan))]
    rng.shuffle(plan)
    span = minutes * 60 * 0.85 - warm_up
    faults = []
    outages = iter([rng.uniform(2, 10), rng.uniform(65, 90)] if long_run else [])
    for i, kind in enumerate(plan):
        at = warm_up + span * (i + rng.uniform(0.1, 0.9)) / len(plan)
        target = netns_site if kind == "partition-netns" else rng.choice(sites)
        if kind in SERVER_KINDS:
            target = "server"
        seconds = {
            "site-kill": rng.choice([0.0, 0.0, rng.uniform(2, 40)]),  # the restart's wait
            "site-stall-long": round_timeout + rng.uniform(5, 15),
            "site-stall-short": rng.uniform(2, round_timeout / 2),
            "partition-netns": rng.uniform(15, 60 if long_run else 25),
            "partition-proxy": rng.uniform(15, 60 if long_run else 25),
            "disk-full": rng.uniform(15, 45 if long_run else 25),
            "corrupt-state": 0.0,
            "superlink-restart": next(outages, None) or rng.uniform(1, 75 if long_run else 8),
            "serverapp-kill": 0.0,
        }[kind]
        faults.append(Fault(round(at, 1), kind, target, round(seconds, 1)))
    restarts = [f for f in faults if f.kind == "superlink-restart"]
    if long_run and min(f.seconds for f in restarts) >= 10:  # both outages, whatever the draw
        restarts[0].seconds = 5.0
    if long_run and max(f.seconds for f in restarts) <= 60:
        restarts[-1].seconds = 75.0
    return faults


# ---- a relay the harness can cut ------------------------------------------------------------


class _Silenced:
    """A stream reader whose bytes are dropped while ``relay`` is cut (the partition:
    what is sent is lost, and nothing says so)."""

    def __init__(self, reader: asyncio.StreamReader, relay: CuttableRelay) -> None:
        self.reader, self.relay = reader, relay

    async def read(self, n: int) -> bytes:
        while True:
            data = await self.reader.read(n)
            if not data or not self.relay.cut:
                return data


class CuttableRelay(CountingRelay):
    """The byte-counting relay of the loopback harness, listening on ``host``, that
    the harness can cut (every connection held open and silent, new ones too) and
    heal (every held connection closed: the peers reconnect)."""

    def __init__(self, target: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.cut = False
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        super().__init__(target)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await super()._main()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool):
        self.writers.add(writer)
        try:
            await super()._pipe(_Silenced(reader, self), writer, up)  # type: ignore[arg-type]
        finally:
            self.writers.discard(writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:  # accepted, and never answered until the link heals
            self.writers.add(writer)
            while self.cut and not writer.is_closing():
                await asyncio.sleep(0.2)
            self.writers.discard(writer)
            writer.close()
            return
        await super()._handle(reader, writer)

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if not cut and self.loop is not None:  # healed: every connection starts afresh
            for writer in list(self.writers):
                self.loop.call_soon_threadsafe(writer.close)


# ---- a network namespace per site -----------------------------------------------------------


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def netns_available() -> bool:
    """Whether this machine lets the harness make network namespaces (root, ``ip``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        sh("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError):
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


@dataclass
class SiteNetns:
    """A site's own network namespace and its veth pair: the host's end ``host_ip``
    (where the site's relay listens), the site's ``site_ip``."""

    name: str
    host_dev: str
    site_dev: str
    host_ip: str
    site_ip: str

    @classmethod
    def make(cls, index: int) -> SiteNetns:
        pid = os.getpid()
        net = f"10.{100 + pid % 100}.{200 + index}"
        ns = cls(
            f"{PREFIX}{pid}s{index}",
            f"pfs{pid}h{index}",
            f"pfs{pid}p{index}",
            f"{net}.1",
            f"{net}.2",
        )
        sh("ip", "netns", "add", ns.name)
        sh("ip", "link", "add", ns.host_dev, "type", "veth", "peer", "name", ns.site_dev)
        sh("ip", "link", "set", ns.site_dev, "netns", ns.name)
        sh("ip", "addr", "add", f"{ns.host_ip}/24", "dev", ns.host_dev)
        sh("ip", "link", "set", ns.host_dev, "up")
        sh("ip", "-n", ns.name, "addr", "add", f"{ns.site_ip}/24", "dev", ns.site_dev)
        sh("ip", "-n", ns.name, "link", "set", ns.site_dev, "up")
        sh("ip", "-n", ns.name, "link", "set", "lo", "up")
        return ns

    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def set_cut(self, cut: bool) -> None:
        sh("ip", "-n", self.name, "link", "set", self.site_dev, "down" if cut else "up")

    def remove(self) -> None:
        delete_netns(self.name)


def delete_netns(name: str) -> None:
    """Stop every process in the namespace (by pid), then delete it (and its veth)."""
    for sig in (signal.SIGKILL,):
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in out.stdout.split():
            try:
                os.kill(int(pid), sig)
            except (ProcessLookupError, ValueError):
                pass
    time.sleep(0.5)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


# ---- a state directory that can fill up ----------------------------------------------------


class SmallDisk:
    """A tmpfs of ``mb`` MB mounted on ``path`` (a site's state directory)."""

    def __init__(self, path: Path, mb: int = 64) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0700", f"{PREFIX}", str(path))
        self.filler = path / ".soak-filler"

    def fill(self) -> int:
        """Fill what is left with one file; the bytes it took."""
        stat = os.statvfs(self.path)
        free = stat.f_bavail * stat.f_frsize
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(free, 1))
        except OSError:
            pass  # full before the whole of it: full all the same
        finally:
            os.close(fd)
        return free

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def remove(self, keep: bool = False) -> None:
        """Unmount it; ``keep``: its files first copied onto the folder beneath."""
        kept = self.path.with_name(self.path.name + ".kept")
        if keep:
            shutil.copytree(self.path, kept, ignore=shutil.ignore_patterns(self.filler.name))
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        if keep:
            shutil.copytree(kept, self.path, dirs_exist_ok=True)
            shutil.rmtree(kept)


def corrupt(path: Path) -> bool:
    """Flip one byte in the middle of ``path`` (written in place, as a bad disk
    would); False when there is no such file yet."""
    try:
        raw = bytearray(path.read_bytes())
    except OSError:
        return False
    if not raw:
        return False
    raw[len(raw) // 2] ^= 0xFF
    with open(path, "r+b") as out:
        out.write(raw)
    return True


# ---- what a killed earlier run left ----------------------------------------------------------


def _owner_gone(pid_text: str) -> bool:
    return pid_text.isdigit() and not Path(f"/proc/{pid_text}").exists()


def sweep() -> list[str]:
    """What soaks that were killed left (their harness process gone): processes
    started under their folders, namespaces (and their veths), tmpfs mounts, folders.
    A live soak's are left alone. Returns what was removed."""
    swept = []
    folders = [p for p in TMP.glob(f"{PREFIX}-*") if _owner_gone(p.name.split("-")[1])]
    for folder in folders:  # processes whose command line names the folder
        needle = str(folder).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if needle in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
                    swept.append(f"process {proc.name}")
            except (OSError, ProcessLookupError):
                continue
    netns = Path("/run/netns")
    for path in netns.glob(f"{PREFIX}*") if netns.is_dir() else []:
        owner = path.name[len(PREFIX) :].split("s")[0]
        if _owner_gone(owner):
            delete_netns(path.name)
            swept.append(f"netns {path.name}")
    for link in Path("/sys/class/net").glob("pfs*"):
        found = re.fullmatch(r"pfs(\d+)[hp]\d+", link.name)
        if found and _owner_gone(found.group(1)):
            subprocess.run(["ip", "link", "del", link.name], capture_output=True)
            swept.append(f"veth {link.name}")
    for folder in folders:
        for line in Path("/proc/mounts").read_text().splitlines():
            mount = line.split()[1]
            if mount.startswith(str(folder)):
                subprocess.run(["umount", "-l", mount], capture_output=True)
                swept.append(f"mount {mount}")
        shutil.rmtree(folder, ignore_errors=True)
        swept.append(f"folder {folder}")
    return swept
