"""A real Flower deployment on this machine's loopback, for tests and benchmarks.

One SuperLink and any number of SuperNodes as separate processes (gRPC, optionally
TLS and SuperNode authentication), driven through the ``flwr`` CLI exactly as an
operator would. Every process is started here, owned here, and killed by pid
(with its descendants: Flower's SuperExec, ServerApp and ClientApp processes) in
``close()``. Each process gets its own ``FLWR_HOME``; nothing touches ``~/.flwr``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import tomli_w

from deploy.node_config import node_config
from pflower.flower_lines import fleet_over_http

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
CERTS_SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "make_certs.sh"


@functools.cache
def repo_app_hash() -> str:
    """The FAB hash of this checkout (what ``flwr run REPO`` submits), once a process."""
    from deploy.site_guard import installed_app_hash

    return installed_app_hash(REPO)


# Ray's own defaults (GCS 6379, client 10001, workers 10002-19999) lie below this
PORTS_FROM = 20000
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands to ``bind(0)`` and to outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1, free now, for processes started later.

    A port is bound by its process only later. An ephemeral port could be taken in
    that gap by any outgoing connection's source port (a deployed test failed that
    way), so the ports come from outside the ephemeral range, where only an explicit
    bind can take one. They are drawn at random and never handed out twice in one
    process. If the ephemeral range leaves no room, the kernel picks (the old race).
    """
    low, high = ephemeral_range()
    pool = [p for p in range(PORTS_FROM, 65536) if not low <= p <= high]
    pool = [p for p in pool if p not in _handed_out]
    if len(pool) < n:
        return _kernel_ports(n)
    ports: list[int] = []
    for port in secrets.SystemRandom().sample(pool, min(len(pool), 64 * n)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            _handed_out.update(ports)
            return ports
    raise OSError(f"no {n} free TCP ports on 127.0.0.1 among {64 * n} drawn outside {low}-{high}")


def _kernel_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def descendants(*pids: int) -> list[int]:
    """All live descendants of ``pids`` (children first found, then theirs), from
    one read of /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class CountingRelay:
    """A TCP relay 127.0.0.1:port -> 127.0.0.1:target counting bytes each way.

    Hand-written because what we want is the byte count of the
    real gRPC/HTTP2 stream, which no Flower hook exposes.
    """

    host = "127.0.0.1"  # where it listens (a subclass may listen on another address)

    def __init__(self, target: int) -> None:
        self.target = target
        (self.port,) = free_ports(1)
        self.up = 0  # SuperNodes -> SuperLink
        self.down = 0  # SuperLink -> SuperNodes
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        server = await asyncio.start_server(self._handle, self.host, self.port)
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool):
        try:
            while data := await reader.read(65536):
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False)
        )


@dataclass
class Proc:
    """One process this harness started, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class ProcessGroup:
    """The processes a harness started under ``root``: their environment, logs,
    waits and teardown (by pid, each with everything it started)."""

    root: Path
    procs: list[Proc]

    def env(self, home: Path) -> dict[str, str]:
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(home),
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # flower-superexec, flwr-*app
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",  # offline: no `uv sync`
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
            PYTHONUNBUFFERED="1",
        )
        return env

    def _spawn(self, name: str, cmd: list[str], home: Path) -> Proc:
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(home), cwd=self.root
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def wait_for(self, cond: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.text()}")
            time.sleep(0.5)
        raise TimeoutError(f"timed out ({timeout:.0f}s) waiting for {what}:\n{self.tail()}")

    def stop(self, proc: Proc, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        """Stop one process and everything it started (by pid)."""
        family = descendants(proc.popen.pid)
        if proc.alive():
            proc.popen.send_signal(sig)
            try:
                proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=10)
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pause(self, proc: Proc, sig: int = signal.SIGSTOP) -> None:
        """Freeze one process and everything it started (by pid), as a site that stops
        answering does; ``resume`` lets it go on where it was."""
        for pid in [proc.popen.pid, *descendants(proc.popen.pid)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def resume(self, proc: Proc) -> None:
        self.pause(proc, signal.SIGCONT)

    def close(self) -> None:
        """Kill every process started here (SuperNodes first), whatever state it is in."""
        for proc in reversed(self.procs):
            try:
                self.stop(proc, signal.SIGTERM, timeout=5)
            except Exception:  # noqa: BLE001 - teardown must reach every process
                proc.popen.kill()

    def tail(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {p.name} ---\n" + "\n".join(p.text().splitlines()[-lines:]) for p in self.procs
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# wait_run: the run's status asked every STATUS_EVERY s, every STATUS_WHILE_SERVING s
# while a ServerApp process is alive, which is looked for every WATCH_EVERY s
STATUS_EVERY, STATUS_WHILE_SERVING, WATCH_EVERY = 2.0, 15.0, 0.5


class FlwrCli(ProcessGroup):
    """The ``flwr`` CLI against this federation's SuperLink (its home ``cli_home``)."""

    http_port: int
    tls: bool
    pki: Path
    cli_home: Path

    def key(self, site: str) -> Path:
        return self.pki / "keys" / site

    def _write_cli_config(self) -> None:
        conn: dict[str, Any] = {"address": f"127.0.0.1:{self.http_port}"}
        if self.tls:
            conn["root-certificates"] = str(self.pki / "ca.crt")
        else:
            conn["insecure"] = True
        config = {"superlink": {"default": "loopback", "loopback": conn}}
        self.cli_home.mkdir(parents=True, exist_ok=True)
        (self.cli_home / "config.toml").write_text(tomli_w.dumps(config))

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            capture_output=True,
            text=True,
            env=self.env(self.cli_home),
            cwd=self.root,
            timeout=timeout,
        )

    @staticmethod
    def _json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        start = out.stdout.find("{")
        if start < 0:
            raise RuntimeError(f"flwr printed no JSON:\n{out.stdout}\n{out.stderr}")
        return json.loads(out.stdout[start:])

    def register(self, site: str) -> int:
        """``flwr supernode register`` of the site's public key; returns the node id."""
        out = self.flwr(
            "supernode", "register", str(self.key(site)) + ".pub", "loopback", "--format", "json"
        )
        reply = self._json(out)
        if not reply.get("success"):
            raise RuntimeError(f"registering {site} failed: {out.stdout}{out.stderr}")
        return int(reply["node-id"])

    def run(self, run_config: dict[str, Any], app: Path = REPO) -> int:
        """``flwr run`` of ``app`` with these run-config overrides; returns the run id."""
        overrides = self.root / f"run-config-{time.monotonic_ns()}.toml"
        overrides.write_text(tomli_w.dumps(run_config))
        out = self.flwr(
            "run", str(app), "loopback", "--run-config", str(overrides), "--format", "json"
        )
        reply = self._json(out)
        if not reply.get("success"):
            raise RuntimeError(f"flwr run failed: {out.stdout}{out.stderr}")
        return int(reply["run-id"])

    def status(self, run_id: int) -> str:
        out = self.flwr("list", "--run-id", str(run_id), "--format", "json")
        return str(self._json(out)["runs"][0]["status"])

    def serverapp_running(self) -> bool:
        """Whether a ServerApp process (``flwr-serverapp``) started by this harness's
        processes is alive."""
        for pid in descendants(*(proc.popen.pid for proc in self.procs)):
            try:
                if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def wait_run(self, run_id: int, timeout: float) -> str:
        """Wait until the run finishes; returns its final status (e.g. finished:completed).

        Each status is a ``flwr`` CLI process, about 1 s of CPU: asked every 2 s it
        took 0.27 s from every deployed round on a 2-core machine (docs/PERFORMANCE.md).
        So it is asked every 2 s only while no ServerApp process is alive (the run
        starting, or ended), and every STATUS_WHILE_SERVING s while one is."""
        deadline = time.monotonic() + timeout
        asked = float("-inf")
        while time.monotonic() < deadline:
            every = STATUS_WHILE_SERVING if self.serverapp_running() else STATUS_EVERY
            if time.monotonic() - asked >= every:
                asked = time.monotonic()
                status = self.status(run_id)
                if status.startswith("finished"):
                    return status
            time.sleep(WATCH_EVERY)
        raise TimeoutError(f"run {run_id} did not finish in {timeout:.0f}s:\n{self.tail()}")


@dataclass
class LoopbackFederation(FlwrCli):
    """SuperLink + SuperNodes on 127.0.0.1 under ``root`` (logs, homes, certificates)."""

    root: Path
    tls: bool = False
    auth: bool = False
    # "subprocess": the SuperLink/SuperNode start their own SuperExec; "process": a
    # separate `flower-superexec` per SuperLink/SuperNode (the docker/ topology), each
    # authenticated with the SuperExec secret
    isolation: str = "subprocess"
    # with isolation "process": the sites' SuperExec is deploy.warm_superexec
    # (ClientApps forked from a process that has imported their libraries), their
    # SuperNodes deploy.fast_supernode (an idle poll that backs off) and the SuperLink
    # deploy.fast_superlink (an empty pull held open until a message comes)
    warm: bool = False
    # the SuperLink's --database (runs and registrations survive its restart); None: memory
    database: Path | None = None
    procs: list[Proc] = field(default_factory=list)
    nodes: dict[str, Proc] = field(default_factory=dict)  # for callers' bookkeeping

    def __post_init__(self) -> None:
        if self.warm and self.isolation != "process":
            raise ValueError("warm ClientApps need isolation='process' (their own SuperExec)")
        if self.auth and not self.tls:
            raise ValueError("SuperNode authentication needs TLS (Flower refuses otherwise)")
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.http_port, self.grpc_fleet_port = free_ports(2)
        # the port SuperNodes dial: 1.42's HTTP Fleet shares the SuperLink's port
        self.fleet_port = self.http_port if fleet_over_http() else self.grpc_fleet_port
        self.pki = self.root / "pki"
        self.cli_home = self.root / "home" / "cli"
        self.secret = self.root / "superexec.secret"
        if self.isolation == "process":
            self.secret.write_text(secrets.token_hex(32))

    # ---- environment -------------------------------------------------------------------------

    def make_certs(self, sites: list[str]) -> None:
        """The demo CA, the SuperLink certificate and a key pair per site."""
        subprocess.run(
            ["bash", str(CERTS_SCRIPT), str(self.pki), "--nodes", ",".join(sites)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    # ---- SuperLink ---------------------------------------------------------------------------

    def start_superlink(self, name: str = "superlink") -> Proc:
        """The SuperLink (``name``: its log's name, a new one for a restart), and with
        isolation "process" the ServerApp's SuperExec unless one is running."""
        # warm: deploy.fast_superlink, whose Fleet API holds an empty pull open
        superlink = [sys.executable, "-m", "deploy.fast_superlink"] if self.warm else []
        cmd = [
            *(superlink or [str(BIN / "flower-superlink")]),
            "--port",
            str(self.http_port),
            "--disable-runtime-dependency-installation",
        ]
        if not fleet_over_http():  # 1.42: deprecated, its gRPC Fleet is off
            cmd += ["--fleet-api-address", f"127.0.0.1:{self.grpc_fleet_port}"]
        if self.tls:
            cmd += [
                "--ssl-ca-certfile", str(self.pki / "ca.crt"),
                "--ssl-certfile", str(self.pki / "server.pem"),
                "--ssl-keyfile", str(self.pki / "server.key"),
            ]  # fmt: skip
        else:
            cmd.append("--insecure")
        if self.auth:
            cmd.append("--enable-supernode-auth")
        if self.database is not None:
            cmd += ["--database", str(self.database)]
        cmd += self._isolation_args()
        proc = self._spawn(name, cmd, self.root / "home" / "superlink")
        self._write_cli_config()
        self.wait_for(lambda: "Uvicorn running on" in proc.text(), 60, "SuperLink start", proc)
        serving = any(p.name == "superexec-serverapp" and p.alive() for p in self.procs)
        if self.isolation == "process" and not serving:  # the ServerApp's SuperExec
            tls = [f"--root-certificates={self.pki / 'ca.crt'}"] if self.tls else ["--insecure"]
            runtime = f"--runtime-api-address=127.0.0.1:{self.http_port}"
            auth = f"--superexec-auth-secret-file={self.secret}"
            cmd = [str(BIN / "flower-superexec"), runtime, *tls, auth]
            self._spawn("superexec-serverapp", cmd, self.root / "home" / "superexec-serverapp")
        return proc

    def _isolation_args(self) -> list[str]:
        if self.isolation == "subprocess":
            return []
        return ["--isolation=process", f"--superexec-auth-secret-file={self.secret}"]

    # ---- SuperNodes --------------------------------------------------------------------------

    def start_supernode(
        self,
        site: str,
        partition_id: int,
        num_partitions: int,
        state_dir: Path,
        key: Path | None = None,
        name: str | None = None,
        policy: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        superexec_args: list[str] | None = None,
    ) -> Proc:
        """A SuperNode for ``site``; ``policy`` adds the site's policy keys to its
        node config (pflower/privacy/policy.py; without it the default, shared only);
        ``extra_args`` go to the SuperNode's command line as they are, and
        ``superexec_args`` to its SuperExec's (isolation "process")."""
        (runtime_port,) = free_ports(1)
        values: dict[str, str | int] = {
            "site": site,
            "state-dir": str(state_dir),
            "partition-id": partition_id,
            "num-partitions": num_partitions,
            **(policy or {}),
        }
        supernode = [sys.executable, "-m", "deploy.fast_supernode"] if self.warm else []
        cmd = [
            *(supernode or [str(BIN / "flower-supernode")]),
            "--superlink",
            f"127.0.0.1:{self.fleet_port}",
            "--port",
            str(runtime_port),
            "--node-config",
            node_config(values),
        ]
        if self.tls:
            cmd += ["--root-certificates", str(self.pki / "ca.crt")]
        else:
            cmd.append("--insecure")
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        cmd += self._isolation_args() + list(extra_args or [])
        name = name or f"supernode-{site}"
        proc = self._spawn(name, cmd, self.root / "home" / name)
        if self.isolation == "process":  # the ClientApp's SuperExec, on the site's machine
            superexec = [sys.executable, "-m", "deploy.warm_superexec"] if self.warm else []
            if self.warm and not any(a.startswith("--approved-apps") for a in superexec_args or []):
                # its default, the build of this checkout, hashed once here: Flower's
                # build walks the whole tree (.venv too), seconds for every SuperExec
                superexec_args = [*(superexec_args or []), f"--approved-apps={repo_app_hash()}"]
            self._spawn(
                f"superexec-{name}",
                [
                    *(superexec or [str(BIN / "flower-superexec")]),
                    f"--runtime-api-address=127.0.0.1:{runtime_port}",
                    "--insecure",  # the site-local Runtime API, as in docker/
                    f"--superexec-auth-secret-file={self.secret}",
                    *(superexec_args or []),
                ],
                self.root / "home" / f"superexec-{name}",
            )
        return proc

    def start_site(
        self,
        site: str,
        data_path: Path | None,
        device: str = "cpu",
        extra: tuple[str, ...] = (),
        prefix: tuple[str, ...] = (),
    ) -> Proc:
        """A site as an operator starts one: ``python -m deploy.site`` on its own data
        folder (None: none, for ``--partition-id`` in ``extra``; warm by default;
        ``extra`` adds launcher flags, ``prefix`` goes before
        the command, e.g. ``ip netns exec NS``), its state in ``root/state-<site>``,
        with this federation's CA and the site's key when TLS / authentication are on."""
        (runtime_port,) = free_ports(1)
        cmd = [
            sys.executable,
            "-m",
            "deploy.site",
            "--superlink",
            f"127.0.0.1:{self.fleet_port}",
            "--site",
            site,
            *(["--data-path", str(data_path)] if data_path is not None else []),
            "--device",
            device,
            "--state-dir",
            str(self.state_dir(site)),
            "--runtime-port",
            str(runtime_port),
        ]
        cmd += ["--root-certificates", str(self.pki / "ca.crt")] if self.tls else ["--insecure"]
        if self.auth:
            cmd += ["--auth-key", str(self.key(site))]
        proc = self._spawn(site, [*prefix, *cmd, *extra], self.root / site)
        self.nodes[site] = proc
        return proc

    def state_dir(self, site: str) -> Path:
        return self.root / f"state-{site}"
