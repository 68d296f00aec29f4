"""A soak: a real loopback deployment trained for a while under seeded faults.

    python -m harness.soak --minutes 60 --seed 0 [--out outputs/soak] [--no-netns]

A SuperLink on its ``--database`` (TLS, SuperNode authentication, the ServerApp in
its own SuperExec) and four sites started with ``python -m deploy.site`` (warm
SuperExec, a roster, personal state on disk in a small tmpfs each; one site in a
network namespace of its own unless ``--no-netns``), every site dialing the SuperLink
through a relay the harness can cut. FedPer trains on the embedded data (the light
preset: four partitions of the synthetic set, an MLP), in runs of ``--segment``
rounds of one experiment, each submitted by ``deploy.supervise`` (the server
launcher's supervisor: a run whose SuperLink or ServerApp crashed goes on from its
last checkpoint), with the reply log on; one run in the middle is SecAgg+. Meanwhile
the seeded schedule (harness/soak_faults.py) kills and restarts sites (one at once),
stalls them past the round timeout and within it, cuts them off, fills a state
directory, corrupts a state file, kills and restarts the SuperLink and kills the
ServerApp; each fault goes to ``faults.jsonl`` with its time, kind and target.

At the end the invariants are checked and printed as a table (harness/soak_check.py),
a report ``soak-<seed>-<minutes>min.md`` (and .json) and a timeline plot go to
``--out``, and the exit code is 0 only when every invariant holds. Everything the
harness starts, mounts or makes is stopped, unmounted or deleted by it, also when it
is killed with SIGTERM or SIGINT; a run killed harder is swept by the next.
Needs root (the tmpfs; the namespace).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.loopback import BIN, CERTS_SCRIPT, REPO, LoopbackFederation, descendants
from harness.soak_faults import (
    PREFIX,
    TMP,
    CuttableRelay,
    Fault,
    SiteNetns,
    SmallDisk,
    corrupt,
    netns_available,
    schedule,
    sweep,
)

SITES = ["site-a", "site-b", "site-c", "site-d"]
WORKLOAD = {  # the light preset: FedPer on the embedded data, four partitions
    "method": "fedper",
    "sim-samples": 120,
    "hidden-dim": 32,
    "sim-dim": 20,
}
SAMPLE_EVERY = 5.0  # seconds between the monitor's samples
FIRST_WINDOW = 300.0  # the memory reference: a site's first 5 minutes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness.soak", description=__doc__.split("\n")[0])
    p.add_argument(
        "--minutes",
        type=float,
        required=True,
        help="how long the soak trains (faults in its first 85%%)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the fault schedule and the runs")
    p.add_argument("--out", default="outputs/soak", help="where the report and plot go")
    p.add_argument(
        "--no-netns",
        action="store_true",
        help="no network namespace (a machine without them): the proxy cut still runs",
    )
    p.add_argument("--segment", type=int, default=40, help="rounds a FedPer run adds")
    p.add_argument("--secagg-rounds", type=int, default=6, help="rounds of the SecAgg+ run")
    p.add_argument("--round-timeout", type=float, default=20.0, help="the runs' round-timeout")
    p.add_argument("--keep", action="store_true", help="keep the deployment's folder")
    return p.parse_args(argv)


class Soak:
    """One soak: its deployment, runs, faults, samples; ``close`` removes it all."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.root = TMP / f"{PREFIX}-{os.getpid()}"
        self.root.mkdir(mode=0o700)
        self.runs_dir = self.root / "out"
        self.t0 = time.time()
        self.stop = threading.Event()
        self.faults_done = threading.Event()
        self.disks: dict[str, SmallDisk] = {}
        self.relays: dict[str, CuttableRelay] = {}
        self.netns: SiteNetns | None = None
        self.fed: LoopbackFederation | None = None
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.samples: list[dict[str, Any]] = []
        self.rounds_seen: list[dict[str, Any]] = []
        self.segments: list[dict[str, Any]] = []
        self.superlinks = 0
        self.errors: list[str] = []
        self.fault_log = self.out / "faults.jsonl"
        self.fault_log.write_text("")

    def now(self) -> float:
        return time.time() - self.t0

    # ---- the deployment ----------------------------------------------------------------

    def setup(self) -> None:
        args = self.args
        use_netns = not args.no_netns
        if use_netns and not netns_available():
            raise SystemExit(
                "soak: cannot make a network namespace here (root and iproute2 needed); "
                "run with --no-netns (the proxy cut still runs)"
            )
        if os.geteuid() != 0:
            raise SystemExit("soak: needs root (each site's state directory is a small tmpfs)")
        fed = self.fed = LoopbackFederation(
            self.root / "fed",
            tls=True,
            auth=True,
            isolation="process",
            warm=True,
            database=self.root / "fed" / "superlink.db",
        )
        if use_netns:
            self.netns = SiteNetns.make(0)
        hosts = [self.netns.host_ip] if self.netns else []
        subprocess.run(
            ["bash", str(CERTS_SCRIPT), str(fed.pki), *hosts, "--nodes", ",".join(SITES)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.repo, self.app_hash = snapshot_app(REPO, self.root / "app")
        fed.start_superlink()
        self.superlinks = 1
        roster = self.root / "roster.toml"
        roster.write_text("".join(f'[sites.{s}]\npublic-key = "{fed.key(s)}.pub"\n' for s in SITES))
        from deploy.roster import register

        register(roster, ["loopback"], str(BIN / "flwr"), fed.env(fed.cli_home))
        for i, site in enumerate(SITES):
            netns = self.netns if (i == 0 and self.netns) else None
            self.relays[site] = CuttableRelay(
                fed.fleet_port, netns.host_ip if netns else "127.0.0.1"
            )
            self.disks[site] = SmallDisk(fed.state_dir(site))
            self.start_site(site)
        for site in SITES:
            proc = fed.nodes[site]
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 300, site, proc)
        self.roster = roster

    def start_site(self, site: str) -> None:
        assert self.fed is not None
        i = SITES.index(site)
        netns = self.netns if (i == 0 and self.netns) else None
        relay = self.relays[site]
        extra = (
            "--partition-id", str(i), "--num-partitions", str(len(SITES)),
            "--roster", str(self.root / "roster.toml"), "--accept-disclosures", "metrics",
            "--superlink", f"{relay.host}:{relay.port}",  # the relay (the last flag wins)
        )  # fmt: skip
        extra += ("--approved-apps", self.app_hash)  # the snapshot's build, not the checkout's
        self.fed.start_site(site, None, extra=extra, prefix=netns.prefix() if netns else ())

    def site_pids(self, site: str) -> list[int]:
        assert self.fed is not None
        proc = self.fed.nodes[site]
        if not proc.alive():
            return []
        return [proc.popen.pid, *descendants(proc.popen.pid)]

    # ---- the runs ------------------------------------------------------------------------

    def run_config(self, name: str, rounds: int, secure: bool) -> dict[str, Any]:
        config = {
            **WORKLOAD,
            "num-server-rounds": rounds,
            "run-name": name,
            "output-dir": str(self.runs_dir),
            "round-timeout": self.args.round_timeout,
            "min-available-clients": 3 if secure else 2,
            "seed": self.args.seed,
        }
        if secure:
            config["secure-aggregation"] = True
        else:
            config["reply-log"] = True
        return config

    def supervise(self, name: str, rounds: int, secure: bool) -> dict[str, Any]:
        """One run, submitted and kept going by deploy.supervise until it completes."""
        assert self.fed is not None
        config = self.run_config(name, rounds, secure)
        events = self.root / f"supervise-{len(self.segments)}.jsonl"
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in config.items())
        cmd = [
            sys.executable, "-m", "deploy.supervise", str(self.repo), "loopback",
            "--run-config", text, "--poll", "5", "--events", str(events),
        ]  # fmt: skip
        log = open(self.root / f"supervise-{len(self.segments)}.log", "wb")  # noqa: SIM115
        segment = {"name": name, "rounds": rounds, "secure": secure, "started": self.now()}
        self.segments.append(segment)
        self.supervisor = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.fed.env(self.fed.cli_home)
        )
        while self.supervisor.poll() is None:
            watch_rounds(self, name)
            time.sleep(SAMPLE_EVERY)
        log.close()
        watch_rounds(self, name)
        segment.update(ended=self.now(), exit=self.supervisor.returncode, events=str(events))
        return segment

    def train(self) -> None:
        """FedPer runs of ``--segment`` rounds, one experiment, until the faults are
        done and ``--minutes`` have passed; the SecAgg+ run once half the time has passed."""
        minutes = self.args.minutes
        total, secure_done = 0, False
        while not self.stop.is_set():
            if not secure_done and self.now() > minutes * 30:
                secure_done = True
                self.supervise("soak-secagg", self.args.secagg_rounds, True)
                continue
            # the soak lasts its --minutes: the faults end at 85% of it, the rest is
            # the quiet tail that shows the recoveries
            if self.faults_done.is_set() and secure_done and total and self.now() >= minutes * 60:
                break
            total += self.args.segment
            self.supervise("soak-fedper", total, False)

    # ---- all of it ------------------------------------------------------------------------

    def run(self) -> list[Fault]:
        """Train and inject faults; the schedule's times count from here."""
        self.setup_seconds, self.t0 = self.now(), time.time()
        plan = schedule(
            self.args.minutes,
            self.args.seed,
            SITES,
            self.args.round_timeout,
            SITES[0] if self.netns else None,
        )
        threads = [
            threading.Thread(target=monitor, args=(self,), daemon=True),
            threading.Thread(target=run_faults, args=(self, plan), daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.train()
        self.stop.set()
        return plan

    def close(self) -> None:
        """Stop, unmount and delete everything this soak made (by pid, by name)."""
        self.stop.set()
        if self.supervisor is not None and self.supervisor.poll() is None:
            self.supervisor.kill()
        if self.fed is not None:
            for site in SITES:  # a stalled site must not hold its teardown
                for pid in self.site_pids(site) if site in self.fed.nodes else []:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            self.fed.close()
        for relay in self.relays.values():
            relay.set_cut(False)
        for disk in self.disks.values():
            disk.free()
            disk.remove(keep=self.args.keep)
        if self.netns is not None:
            self.netns.remove()


# ---- the runs' configs and rounds, and the faults: functions of a soak -----------------


def snapshot_app(repo: Path, dest: Path) -> tuple[Path, str]:
    """A copy of the app as it is now (the files git does not ignore, as ``flwr build``
    takes them), which every run of the soak submits and every site approves, and its
    build's hash: an edit to the checkout during an hour-long soak changes neither (it
    once got every later run refused by hash). Without git, the tree less its venvs,
    .git and outputs."""
    import shutil

    from deploy.site_guard import installed_app_hash

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        timeout=60,
    )
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            source = repo / name
            if source.is_file():  # a deleted but still-indexed file is not there
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / name)
    else:
        skip = shutil.ignore_patterns(".git", ".venv*", "outputs", "__pycache__")
        shutil.copytree(repo, dest, ignore=skip)
    return dest, installed_app_hash(dest)


def monitor(soak: Soak) -> None:
    """Every SAMPLE_EVERY s: each site's processes and their resident memory."""
    while not soak.stop.wait(SAMPLE_EVERY):
        sample: dict[str, Any] = {"t": soak.now()}
        for site in SITES:
            pids = soak.site_pids(site)
            sample[site] = {"procs": len(pids), "rss_mb": sum(map(rss_mb, pids))}
        soak.samples.append(sample)


def watch_rounds(soak: Soak, name: str) -> None:
    """Note each round of run ``name`` the first time its results show it."""
    path = soak.runs_dir / name / "results.json"
    try:
        rounds = json.loads(path.read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return
    seen = {(r["name"], r["round"]) for r in soak.rounds_seen}
    for r in rounds:
        if (name, r["round"]) not in seen:
            soak.rounds_seen.append(
                {
                    "name": name,
                    "round": r["round"],
                    "t": soak.now(),
                    "acc": r.get("accuracy_mean"),
                }
            )


def note(fault: Fault, **fields: Any) -> None:
    fault.log.update(fields)


def inject(soak: Soak, fault: Fault) -> None:
    """One fault, from its start to its end (healed, restarted, freed)."""
    assert soak.fed is not None
    fed, site = soak.fed, fault.target
    fault.log["start"] = soak.now()
    if fault.kind == "site-kill":
        pids = soak.site_pids(site)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        fed.nodes[site].popen.wait(timeout=30)
        note(fault, killed=len(pids))
        time.sleep(fault.seconds)
        old = len(fed.nodes[site].text())
        soak.start_site(site)
        note(fault, restarted=soak.now(), log_offset=old)
    elif fault.kind in ("site-stall-long", "site-stall-short"):
        pids = soak.site_pids(site)
        for sig, pause in ((signal.SIGSTOP, fault.seconds), (signal.SIGCONT, 0.0)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(pause)
    elif fault.kind == "partition-netns":
        assert soak.netns is not None
        soak.netns.set_cut(True)
        time.sleep(fault.seconds)
        soak.netns.set_cut(False)
    elif fault.kind == "partition-proxy":
        soak.relays[site].set_cut(True)
        time.sleep(fault.seconds)
        soak.relays[site].set_cut(False)
    elif fault.kind == "disk-full":
        note(fault, filled_bytes=soak.disks[site].fill())
        time.sleep(fault.seconds)
        soak.disks[site].free()
    elif fault.kind == "corrupt-state":
        path = soak.fed.state_dir(site) / "soak-fedper" / f"{site}.npz"
        note(fault, file=path.name, corrupted=corrupt(path))
    elif fault.kind == "superlink-restart":
        link = next(p for p in reversed(fed.procs) if p.name.startswith("superlink"))
        for pid in [link.popen.pid, *descendants(link.popen.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        link.popen.wait(timeout=30)
        time.sleep(fault.seconds)
        soak.superlinks += 1
        fed.start_superlink(name=f"superlink-{soak.superlinks}")
    elif fault.kind == "serverapp-kill":
        deadline = time.monotonic() + 120
        pids: list[int] = []
        while not pids and time.monotonic() < deadline:  # between runs: the next one's
            pids = serverapp_pids(soak)
            time.sleep(0.5)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        note(fault, killed=len(pids))
    fault.log["end"] = soak.now()


def serverapp_pids(soak: Soak) -> list[int]:
    assert soak.fed is not None
    found = []
    for pid in descendants(*(p.popen.pid for p in soak.fed.procs)):
        try:
            if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def run_faults(soak: Soak, plan: list[Fault]) -> None:
    try:
        for fault in plan:
            while soak.now() < fault.at and not soak.stop.is_set():
                time.sleep(0.2)
            if soak.stop.is_set():
                return
            try:
                inject(soak, fault)
            except Exception as err:  # noqa: BLE001 - logged with the fault, the soak goes on
                fault.log["error"] = f"{type(err).__name__}: {err}"
                soak.errors.append(f"{fault.kind} on {fault.target}: {err}")
            with open(soak.fault_log, "a") as out:
                out.write(json.dumps({"at": fault.at, "kind": fault.kind, "target": fault.target,
                                      "seconds": fault.seconds, **fault.log}) + "\n")  # fmt: skip
    finally:
        soak.faults_done.set()


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    for what in sweep():
        print(f"soak: swept {what} (left by a killed earlier soak)", flush=True)
    soak = Soak(args)

    def stop(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):  # the teardown must not be cut short
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(f"soak: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ok = False
    try:
        soak.setup()
        print(f"soak: deployment up in {soak.now():.0f} s under {soak.root}", flush=True)
        plan = soak.run()
        from harness.soak_check import report

        ok = report(soak, plan, sys.argv if argv is None else ["python -m harness.soak", *argv])
    finally:
        soak.close()
        if not args.keep:
            import shutil

            shutil.rmtree(soak.root, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
