"""``python -m pflower.cli check|run [flwr run options]`` (what scripts/dev.sh calls).

Exit status: 0 the run finished every round (``check``: the config is good);
2 a bad config (one line, no traceback, before anything of Flower starts);
1 the run failed (Flower says ``finished:failed``: a ServerApp error, a round that
aggregated no reply, a site that failed every round it was asked; no results, or
fewer rounds than asked), or flwr's own non-zero status.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from pflower.cli.preflight import preflight
from pflower.config.schema import RESUME_LATEST, ConfigError, describe_settings
from pflower.flower_notes import WARNINGS as FLOWER_WARNINGS

PROJECT = Path(__file__).resolve().parents[2]
FEDERATION_DEFAULTS = PROJECT / "scripts" / "federation.toml"
EXIT_CONFIG, EXIT_FAILED = 2, 1
RUN_STARTED = re.compile(r"Successfully started run (\d+)")
CONFIG_ERROR = re.compile(r"config error: (.+)$")  # the ServerApp's (pflower/config/refusal.py)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Flower's simulation says these on every run, whatever its federation (flwr's
# simulation/app.py, before any of the app is loaded): a note that its own default
# changed, and a command that does not change a run that gives --federation-config,
# as every run of this CLI does (the pre-flight line says which federation runs);
# and, as a WARNING, that it stops its own Ray actors at the end of a run. The two
# warnings are dropped where they are logged in an environment dev.sh set up
# (pflower/flower_notes.py); here too, for one made some other way.
FLOWER_NOTES = (
    FLOWER_WARNINGS[0],
    "To change federation size, use the following command:",
    "flwr federation simulation-config ",
    "Manually terminating ClientAppActor",
)


def split_args(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(run-config overrides, federation-config overrides, the other flwr args)."""
    run_cfg: list[str] = []
    fed_cfg: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        for flags, sink in ((("--run-config", "-c"), run_cfg), (("--federation-config",), fed_cfg)):
            if arg in flags and i + 1 < len(argv):
                sink.append(argv[i + 1])
                i += 2
                break
            prefix = next((f"{f}=" for f in flags if arg.startswith(f"{f}=")), None)
            if prefix:
                sink.append(arg[len(prefix) :])
                i += 1
                break
        else:
            rest.append(arg)
            i += 1
    return run_cfg, fed_cfg, rest


def federation_values(overrides: list[str]) -> dict[str, Any]:
    """The project's default federation (scripts/federation.toml) with the user's
    ``--federation-config`` values on top, checked by Flower's own conversion;
    ConfigError naming a bad one."""
    from flwr.common.config import parse_config_args
    from flwr.supercore.utils import simulation_config_from_json

    values: dict[str, Any] = tomllib.loads(FEDERATION_DEFAULTS.read_text())
    try:
        values.update(parse_config_args(overrides or None))
        simulation_config_from_json({k.replace("-", "_"): v for k, v in values.items()})
    except Exception as err:  # noqa: BLE001 - click's, protobuf's and Flower's own messages
        message = getattr(err, "message", None) or str(err)
        raise ConfigError(f"--federation-config: {message}") from None
    n = values.get("num-supernodes")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"--federation-config: num-supernodes must be a positive integer ({n!r})")
    return values


def federation_config(values: dict[str, Any]) -> str:
    """The federation as one ``--federation-config`` value."""
    return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


def deployment_named(rest: list[str]) -> bool:
    """Whether ``flwr run``'s arguments name a federation (``flwr run . pflower``) that
    is not a local simulation: a deployment, whose size the SuperLink knows and whose
    data are at the sites."""
    args = rest[1:] if rest[:1] == ["run"] else rest  # `check . pflower` or `check run . pflower`
    named = len(args) > 1 and not args[1].startswith("-")
    return named and not superlink_connection(args).startswith(":local")


def check(argv: list[str]) -> int:
    """``check [run . FEDERATION] [--run-config ...] [--federation-config ...]``."""
    run_cfg, fed_cfg, rest = split_args(argv)
    try:
        federation = federation_values(fed_cfg)
        clients = None if deployment_named(rest) else federation["num-supernodes"]
        cfg, raw, data = preflight(PROJECT, run_cfg, clients)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"ok: {describe_settings(cfg)}; data: {data}")
    return 0


def results_status(path: Path, started: float, rounds: int, whole: bool = False) -> str | None:
    """None if ``path`` holds every round of this run, else what is wrong. ``rounds``:
    after the rounds a resumed run went on from, or ``whole``, the whole run's
    (``resume-from='latest'``)."""
    if not path.exists():
        return f"no results at {path}"
    if path.stat().st_mtime < started:
        return f"{path} was not written by this run"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"unreadable results {path} ({err})"
    failed = (data.get("outcome") or {}).get("status") == "failed"
    if failed:  # the ServerApp judged it (strategies/outcome.py): its first problems
        return "; ".join(data["outcome"].get("problems", [])[:5]) or "the run failed"
    done = (data.get("resumed_from") or {}).get("round", 0)
    recorded = [r.get("round") for r in data.get("rounds", [])]
    expected = rounds if whole else done + rounds
    if not recorded or max(recorded) < expected:
        got = max(recorded) if recorded else 0
        return f"{got} of {expected} rounds in {path}"
    return None


class Interrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM while ``dev.sh run`` waits on its run: the exit code
    (128 + the signal's number) and the run id, once flwr printed it."""

    def __init__(self, signum: int, run_id: int | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.run_id = signum, run_id


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def run_flwr(cmd: list[str]) -> tuple[int, int | None, str | None]:
    """``flwr run``'s exit code, the run id it printed and the first config error the
    run logged; its output passes through, less Flower's FLOWER_NOTES. flwr runs in a
    session of its own, so a terminal's Ctrl-C reaches this process only: Interrupted,
    with the run id, after flwr is stopped."""
    run_id, config_error = None, None
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if any(note in line for note in FLOWER_NOTES):
                continue
            sys.stdout.write(line)
            sys.stdout.flush()
            found = RUN_STARTED.search(line)
            if found and run_id is None:
                run_id = int(found.group(1))
            refused = CONFIG_ERROR.search(ANSI.sub("", line).rstrip())
            if refused and config_error is None:
                config_error = refused.group(1)
    except Interrupted as stop:
        proc.terminate()  # the log stream only: the run goes on at the SuperLink
        raise Interrupted(stop.signum, run_id) from None
    finally:
        proc.stdout.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode, run_id, config_error


def stop_run(stop: Interrupted, rest: list[str], run_name: str) -> int:
    """Stop the run ``stop`` interrupted at its SuperLink (``flwr stop``); one line
    saying so and how to go on; 128 + the signal's number."""
    code = 128 + stop.signum
    if stop.run_id is None:
        print(f"stopped ({stop}) before the run was submitted", file=sys.stderr)
        return code
    connection = [a for a in rest[1:2] if not a.startswith("-")]
    done = subprocess.run(
        ["flwr", "stop", str(stop.run_id), *connection], capture_output=True, text=True
    )
    said = "stopped" if done.returncode == 0 else "could not stop (flwr stop failed)"
    print(
        f"{said} run {stop.run_id} ({stop}); to go on from its last checkpoint: the same "
        f"command with --run-config \"run-name='{run_name}' resume-from='latest'\"",
        file=sys.stderr,
    )
    return code


def run_status(rest: list[str], run_id: int, wait: float = 30.0) -> str:
    """Flower's status of the run (``finished:completed``, ``finished:failed``...),
    asked of the SuperLink the run went to: ``flwr run --stream`` exits 0 whatever
    the run's end. Waits up to ``wait`` s for the run to be marked finished."""
    connection = [a for a in rest[1:2] if not a.startswith("-")]
    deadline, status = time.monotonic() + wait, "unknown"
    while True:
        out = subprocess.run(
            ["flwr", "ls", *connection, "--run-id", str(run_id), "--format", "json"],
            capture_output=True,
            text=True,
        )
        try:
            status = str(json.loads(out.stdout[out.stdout.find("{") :])["runs"][0]["status"])
        except (ValueError, KeyError, IndexError):
            status = f"unknown ({(out.stderr or out.stdout).strip()[:200]})"
        if status.startswith("finished") or time.monotonic() > deadline:
            return status
        time.sleep(1.0)


def record_command(results: Path, command: list[str]) -> None:
    """The ServerApp runs from flwr's installed copy of the app and sees neither the
    user's command nor this checkout: fill both into the run's provenance."""
    from pflower.results import git_commit

    data = json.loads(results.read_text())
    data.setdefault("provenance", {}).update(
        command=shlex.join(command), git_commit=git_commit(PROJECT)
    )
    tmp = results.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, results)


def superlink_connection(rest: list[str]) -> str:
    """The address of the SuperLink connection ``flwr run`` will use: the one named
    after the app directory, or the default of $FLWR_HOME/config.toml."""
    from flwr.supercore.utils import get_flwr_home

    try:
        links = tomllib.loads((get_flwr_home() / "config.toml").read_text())["superlink"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return ""
    name = rest[1] if len(rest) > 1 and not rest[1].startswith("-") else links.get("default")
    entry = links.get(name, {})
    return str(entry.get("address", "")) if isinstance(entry, dict) else ""


def foreign_superlink(flwr_home: Path, port: int) -> str | None:
    """Why a run must not go to the local SuperLink listening on ``port``, or None.

    flwr starts that SuperLink once, detached, and sends every later local run to it,
    with the code and environment it was started from. One whose database and log
    live outside this run's FLWR_HOME belongs to another checkout (perhaps a deleted
    one: its runs then hang), so the run is refused with the pid to stop.
    """
    import psutil

    try:
        pid = next(
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        )
        cmdline = psutil.Process(pid).cmdline()
    except (StopIteration, psutil.Error):
        return None  # none listening, or not ours to inspect
    if not any("flower-superlink" in a for a in cmdline):
        return None
    paths = [b for a, b in zip(cmdline, cmdline[1:]) if a in ("--database", "--log-file")]
    home = flwr_home.resolve()
    if not paths or any(Path(p).resolve().is_relative_to(home) for p in paths):
        return None
    return (
        f"a local SuperLink from another Flower home (pid {pid}, {', '.join(paths)}) holds "
        f"port {port}: this run would go to it, with the code and environment it was "
        f"started from; stop it (kill {pid}) and run again"
    )


def federation_line(values: dict[str, Any], fed_cfg: list[str]) -> str:
    """Which federation the run gets, and where its size comes from."""
    from flwr.common.config import parse_config_args

    given = "num-supernodes" in parse_config_args(fed_cfg or None)
    where = "--federation-config" if given else FEDERATION_DEFAULTS.relative_to(PROJECT)
    return f"federation: {values['num-supernodes']} simulated SuperNodes ({where})"


def run(argv: list[str]) -> int:
    run_cfg, fed_cfg, rest = split_args(argv)
    local = not deployment_named(rest)  # a deployment's size and data are the SuperLink's
    try:
        values = federation_values(fed_cfg)
        clients = values["num-supernodes"] if local else None
        cfg, raw, data = preflight(PROJECT, run_cfg, clients)
        federation = federation_config(values)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    where = f"; {federation_line(values, fed_cfg)}" if local else ""
    print(f"pre-flight ok: {describe_settings(cfg)}{where}; data: {data}", flush=True)
    run_name = cfg.run_name or f"{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir = Path(cfg.output_dir).expanduser()
    if not out_dir.is_absolute():
        out_dir = PROJECT / out_dir  # where dev.sh starts the local SuperLink
    results = out_dir / run_name / "results.json"
    pinned = f"run-name={json.dumps(run_name)} output-dir={json.dumps(str(out_dir))}"
    # as the pre-flight read it, whatever the apps' working directory ('latest': the
    # ServerApp finds the run's own checkpoint under the pinned output-dir and run-name)
    if cfg.resume_from and cfg.resume_from.strip() != RESUME_LATEST:
        resume = Path(cfg.resume_from).expanduser().resolve()
        pinned += f" resume-from={json.dumps(str(resume))}"
    rest = [a for a in rest if a != "--stream"]
    cmd = [
        "flwr",
        "run",
        *(rest or ["."]),
        "--stream",
        *[a for c in run_cfg for a in ("--run-config", c)],
        "--run-config",
        pinned,
        "--federation-config",
        federation,
    ]
    if superlink_connection(rest).startswith(":local"):  # :local: or :local-in-memory:
        from flwr.cli.constant import LOCAL_SUPERLINK_HTTP_API_PORT
        from flwr.supercore.utils import get_flwr_home

        problem = foreign_superlink(get_flwr_home(), int(LOCAL_SUPERLINK_HTTP_API_PORT))
        if problem:
            print(f"run REFUSED: {problem}", file=sys.stderr)
            return EXIT_FAILED
    started = time.time() - 1.0
    handlers = {n: signal.signal(n, _interrupt) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        code, run_id, config_error = run_flwr(cmd)
    except Interrupted as stop:
        return stop_run(stop, rest, run_name)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    status = run_status(rest, run_id) if code == 0 and run_id is not None else None
    if code == 0 and run_id is None:
        print("warning: flwr run printed no run id; its status is not checked", file=sys.stderr)
    if config_error and status != "finished:completed":  # refused once started: one line
        print(f"config error: {config_error}", file=sys.stderr)
        return EXIT_CONFIG
    whole = cfg.resume_from.strip() == RESUME_LATEST  # its rounds count the whole run
    problem = results_status(results, started, cfg.num_server_rounds, whole) if local else None
    if local and results.exists() and results.stat().st_mtime >= started:
        record_command(results, ["bash", "scripts/dev.sh", "run", *argv])
    if problem is None and code == 0 and status in ("finished:completed", None):
        where = results.parent / "accuracy.png" if local else "on the server"
        print(f"run finished: every round recorded (run {run_id}); the plot: {where}")
        return 0
    why = problem or (f"flwr exited with {code}" if code else f"Flower says {status}")
    print(f"run FAILED: {why} (run {run_id}; its log: flwr log {run_id})", file=sys.stderr)
    return code or EXIT_FAILED


USAGE = """usage: bash scripts/dev.sh check|run [--run-config "KEY=VALUE ..."]
                                     [--federation-config "KEY=VALUE ..."] [flwr run options]

  check  validate the run config and pre-flight the data (no training), exit 0 or 2
  run    check, then `flwr run` the app on the local simulation (scripts/federation.toml:
         num-supernodes=100 ...; override with --federation-config "num-supernodes=10")

Every run-config key, its default and meaning: docs/USAGE.md. Exit status: 0 done,
2 a bad config (one line naming the key), 1 the run failed."""


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("check", "run"):
        print(USAGE, file=sys.stderr)
        return EXIT_CONFIG
    if {"-h", "--help"} & set(sys.argv[2:]):
        print(USAGE)
        return 0
    os.chdir(PROJECT)
    command, argv = sys.argv[1], sys.argv[2:]
    return check(argv) if command == "check" else run(argv)


if __name__ == "__main__":
    sys.exit(main())
