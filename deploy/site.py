"""Start one site's SuperNode against a remote SuperLink.

    python -m deploy.site --superlink superlink.example.org:9092 --site hospital-a \\
        --data-path /data/site --device cuda:0 --state-dir /var/lib/pflower \\
        --root-certificates ca.crt --auth-key keys/hospital-a

    python -m deploy.site --check --site hospital-a --data-path /data/site \\
        --state-dir /var/lib/pflower --insecure --run-config "method='fedper' ..."

    python -m deploy.site --print-app-hash               # the build this site runs
    python -m deploy.site --ledger --state-dir /var/lib/pflower   # what left the site

``--superlink`` is the SuperLink's Fleet API: port 9092 on flwr 1.39, its HTTP port
(8000) on flwr 1.42 (docs/FLOWER_VERSIONS.md).

Builds the ``flower-supernode`` command line (the site's identity, data, device
and state directory go into the node config, which the ClientApp reads), prints
it, and replaces this process with it (``--dry-run`` only prints, and exits 2 if a
path, key or device would stop the site). A thin
wrapper on purpose: every flag maps one-to-one to a ``flower-supernode`` flag.
The SuperNode runs with ``--isolation process`` beside the site's own SuperExec
(deploy/warm_superexec.py), which checks each run's app against the builds the
site approved (``--approved-apps``; default: the one installed here) before any of
its code is unpacked, and writes every reply to the site's ledger
(deploy/site_guard.py). By default (``--warm``) it forks each ClientApp from a
process that has imported its libraries.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.node_config import node_config, node_values
from pflower.flower_lines import default_fleet_port
from pflower.privacy.policy import DEFAULT_MIN_SECAGG_SITES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m deploy.site", description=__doc__.split("\n")[0])
    p.add_argument(
        "--superlink",
        help=f"SuperLink Fleet API, HOST:PORT ({default_fleet_port()} with this Flower: 9092 on "
        "flwr 1.39, the SuperLink's HTTP port 8000 on 1.42)",
    )
    p.add_argument("--site", help="stable site identity (keys personal state)")
    p.add_argument("--data-path", default="", help="this site's own data (file or directory)")
    p.add_argument("--device", default="", help="torch device, e.g. cuda:0 (default: auto)")
    p.add_argument("--state-dir", help="where personal tensors persist between rounds")
    p.add_argument("--partition-id", type=int, help="demo only: a partition of a shared data set")
    p.add_argument("--num-partitions", type=int, help="demo only: with --partition-id")
    pol = p.add_argument_group(
        "site policy (pflower/privacy/policy.py): checked by the ClientApp before any work"
    )
    pol.add_argument(
        "--accept-disclosures",
        default="",
        help="comma-separated disclosure kinds beyond the shared tensors this site accepts "
        "(head-blend, head-sum, matching-vector, personal-rows, whole-model) or 'all'; "
        "default: none",
    )
    pol.add_argument(
        "--require-secure-aggregation",
        action="store_true",
        help="refuse every run without SecAgg+ and every unmasked fit",
    )
    pol.add_argument(
        "--allowed-methods", default="all", help="comma-separated methods, or 'all' (default)"
    )
    pol.add_argument(
        "--roster",
        help="this site's own copy of the deployment's roster (public key and node id per "
        "site): every SecAgg+ neighbour's signed keys are checked against it; needs "
        "--auth-key (this site signs its own with it)",
    )
    pol.add_argument(
        "--min-secagg-sites",
        type=int,
        default=DEFAULT_MIN_SECAGG_SITES,
        help="fewest distinct roster sites a SecAgg+ round may have among this site's "
        "neighbours (default 3)",
    )
    pol.add_argument(
        "--unverified-secagg-keys",
        action="store_true",
        help="development only: --require-secure-aggregation without --roster (a server "
        "could then play this site's neighbours and read its upload)",
    )
    pol.add_argument(
        "--approved-apps",
        default="",
        help="comma-separated app builds (sha256:<hex>) this site runs, checked by its own "
        "SuperExec before any of a run's code is unpacked; default: the build installed "
        "here (--print-app-hash); 'any': no check (development only)",
    )
    p.add_argument(
        "--print-app-hash", action="store_true", help="print the installed app's build hash"
    )
    p.add_argument(
        "--ledger", action="store_true", help="print what this site sent (<state-dir>/ledger.jsonl)"
    )
    p.add_argument("--json", action="store_true", help="with --ledger: one JSON line an entry")
    sec = p.add_argument_group("security")
    sec.add_argument("--root-certificates", help="CA certificate that signed the SuperLink's")
    sec.add_argument("--auth-key", help="this site's ECDSA private key (OpenSSH format)")
    sec.add_argument(
        "--insecure", action="store_true", help="plain-text gRPC; must be asked for explicitly"
    )
    p.add_argument(
        "--runtime-port",
        type=int,
        default=9094,
        help="the SuperNode's local Runtime API port (one per SuperNode on a host)",
    )
    p.add_argument("--max-wait-time", type=float, help="give up reconnecting after N seconds")
    p.add_argument(
        "--warm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ClientApps forked from a process that has imported their libraries, and an "
        "idle poll that backs off (deploy/warm_superexec.py, deploy/fast_supernode.py); "
        "--no-warm: Flower's own flower-supernode, each ClientApp started cold (the site's "
        "SuperExec still checks the app and keeps the ledger)",
    )
    data = p.add_argument_group("the site's own data (they replace the run's for this site)")
    for key, what in (
        ("label-column", "its label column"),
        ("split-column", "its train/test column"),
        ("feature-columns", "its feature columns, comma-separated"),
        ("categorical-columns", "its categorical columns and levels (name:a/b/c,...)"),
    ):
        data.add_argument(f"--{key}", help=f"a table's {what}")
    p.add_argument(
        "--data-cache",
        action="store_true",
        help="keep a decoded copy of the site's data in <state-dir>/data-cache (owner-only) "
        "so cold ClientApps do not decode it each message; off: nothing of the data is "
        "written (a warm site reads it once a process anyway)",
    )
    p.add_argument(
        "--task-timeout",
        type=float,
        default=900.0,
        help="warm SuperExec: kill a ClientApp task after this many seconds (0: never)",
    )
    p.add_argument(
        "--max-tasks", type=int, default=1, help="warm SuperExec: ClientApp tasks at once"
    )
    p.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument(
        "--check",
        action="store_true",
        help="do not join: check this site's paths, policy and data against the run config "
        "given with --run-config (deploy/site_check.py), exit 0 or 2",
    )
    p.add_argument(
        "--connect",
        action="store_true",
        help="with --check: also resolve --superlink, complete the TLS handshake with "
        "--root-certificates and wait for its gRPC endpoint, without joining",
    )
    p.add_argument(
        "--run-config",
        dest="check_run_config",
        default="",
        help="with --check: the run's config, as for flwr run --run-config",
    )
    p.add_argument("extra", nargs="*", help="after --: passed to flower-supernode unchanged")
    args = p.parse_args(argv)
    if args.print_app_hash:
        return args
    if args.ledger and not args.state_dir:
        p.error("--ledger reads <state-dir>/ledger.jsonl: give --state-dir")
    if args.ledger:
        return args
    for flag in ("site", "state_dir"):
        if not getattr(args, flag):
            p.error(f"the following arguments are required: --{flag.replace('_', '-')}")
    if args.approved_apps:
        from deploy.site_guard import parse_approved

        try:
            parse_approved(args.approved_apps)
        except ValueError as err:
            p.error(f"--approved-apps: {err}")
    if not args.superlink and not args.check:
        p.error("the following arguments are required: --superlink")
    if args.check_run_config and not args.check:
        p.error("--run-config goes with --check (a joining site gets the run from the server)")
    if args.connect and not (args.check and args.superlink):
        p.error("--connect goes with --check and --superlink HOST:PORT")
    if args.insecure == bool(args.root_certificates) and (args.connect or not args.check):
        p.error("give exactly one of --root-certificates (TLS) or --insecure")
    if args.auth_key and args.insecure:
        p.error("--auth-key needs TLS (--root-certificates), Flower refuses it over --insecure")
    if (args.partition_id is None) != (args.num_partitions is None):
        p.error("--partition-id and --num-partitions go together")
    if args.roster and not args.auth_key and not args.check:
        p.error("--roster needs --auth-key: the other sites check this site's signed keys")
    if args.require_secure_aggregation and not args.roster and not args.unverified_secagg_keys:
        p.error(
            "--require-secure-aggregation needs --roster: without it a server can play this "
            "site's SecAgg+ neighbours and read its upload (--unverified-secagg-keys: "
            "development only)"
        )
    if args.min_secagg_sites < 2:
        p.error("--min-secagg-sites must be at least 2")
    try:  # the node config as its ClientApp will parse it: one line naming a bad key
        node_config(node_values(args))
    except ValueError as err:  # pflower's ConfigError, or a value --node-config cannot carry
        p.error(str(err))
    return args


def supernode_executable() -> str:
    """``flower-supernode`` beside this interpreter (a venv), else from PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "flower-supernode")
    return beside if os.path.exists(beside) else shutil.which("flower-supernode") or beside


def supernode_command(args: argparse.Namespace) -> list[str]:
    """The ``flower-supernode`` argv for these launcher arguments."""
    values = node_values(args)
    if args.warm:  # Flower's SuperNode, its idle poll backing off
        cmd = [sys.executable, "-m", "deploy.fast_supernode", "--superlink", args.superlink]
    else:
        cmd = [supernode_executable(), "--superlink", args.superlink]
    # ClientApps always from the site's own SuperExec (the app check, the ledger)
    cmd += ["--isolation", "process", "--superexec-auth-secret-file", secret_file(args)]
    if args.insecure:
        cmd.append("--insecure")
    else:
        cmd += ["--root-certificates", args.root_certificates]
    if args.auth_key:
        cmd += ["--auth-supernode-private-key", args.auth_key]
    cmd += ["--port", str(args.runtime_port)]
    if args.max_wait_time is not None:
        cmd += ["--max-wait-time", str(args.max_wait_time)]
    cmd += ["--node-config", node_config(values)]
    return cmd + list(args.extra)


def secret_file(args: argparse.Namespace) -> str:
    """The site-local secret its SuperNode and SuperExec share (never leaves the site)."""
    return os.path.join(args.state_dir, "superexec.secret")


def superexec_command(args: argparse.Namespace, parent_pid: int) -> list[str]:
    """The warm SuperExec beside the SuperNode; it exits when ``parent_pid`` does."""
    return [
        sys.executable,
        "-m",
        "deploy.warm_superexec",
        "--runtime-api-address",
        f"127.0.0.1:{args.runtime_port}",
        "--insecure",  # the site-local Runtime API, on loopback
        "--superexec-auth-secret-file",
        secret_file(args),
        "--parent-pid",
        str(parent_pid),
        f"--task-timeout={args.task_timeout:g}",
        f"--max-tasks={args.max_tasks}",
        *(["--approved-apps", args.approved_apps] if args.approved_apps else []),
        *([] if args.warm else ["--no-preload"]),
    ]


def lock_state_dir(state_dir: str) -> int:
    """An exclusive lock on ``<state-dir>/.lock``, kept across the exec into the
    SuperNode (its fd is inheritable): two SuperNodes never share one state
    directory. Exits with one line naming the holder if another process has it."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    os.chmod(state_dir, 0o700)  # personal tensors, the ledger, a data cache: this user's
    path = os.path.join(state_dir, ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        sys.exit(
            f"deploy.site: state directory {state_dir} is in use by pid {holder}; give "
            "each SuperNode its own --state-dir"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)  # the SuperNode keeps this pid (exec)
    os.set_inheritable(fd, True)
    return fd


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.print_app_hash:
        from deploy.site_guard import installed_app_hash

        print(installed_app_hash(), flush=True)
        return
    if args.ledger:
        from deploy.site_guard import LEDGER_FILE, ledger_table, read_ledger

        if not (Path(args.state_dir) / LEDGER_FILE).is_file():
            print(
                f"deploy.site: no ledger in {args.state_dir} (the site's --state-dir?)",
                file=sys.stderr,
            )
            sys.exit(2)
        lines = read_ledger(args.state_dir)
        if args.json:
            print("\n".join(json.dumps(e, sort_keys=True) for e in lines), flush=True)
        else:
            print(ledger_table(lines), flush=True)
        return
    from deploy.site_check import SiteCheckFailed, check_site, path_problems

    if args.check:
        try:
            check_site(args)
        except SiteCheckFailed as err:
            print(f"site check FAILED: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
        print(f"site {args.site!r}: ready for this run", flush=True)
        return
    problems = path_problems(args)  # before joining: a wrong path fails here, not mid-run
    if problems and not args.dry_run:
        print(f"deploy.site: {problems[0]}", file=sys.stderr, flush=True)
        sys.exit(2)
    # a site talks only to its SuperLink: no usage events to Flower's telemetry server
    # (read when flwr is imported, so set before the SuperNode and SuperExec start)
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"  # nor version checks
    cmd = supernode_command(args)
    # it watches this pid, which the SuperNode keeps after exec: one stops, both stop
    superexec = superexec_command(args, os.getpid())
    print(shlex.join(superexec) + " &", flush=True)
    print(shlex.join(cmd), flush=True)
    if args.dry_run:  # the command as it would run, then what would stop it
        for problem in problems:
            print(f"deploy.site: {problem}", file=sys.stderr, flush=True)
        if problems:
            sys.exit(2)
        return
    lock_state_dir(args.state_dir)
    secret = secret_file(args)
    if not os.path.exists(secret):
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    subprocess.Popen(superexec)
    os.execvp(cmd[0], cmd)  # the SuperNode takes over this process (signals, exit code)


if __name__ == "__main__":
    main(sys.argv[1:])
