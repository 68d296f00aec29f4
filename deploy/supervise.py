"""Keep a run going through SuperLink and ServerApp crashes, from its checkpoints.

    python -m deploy.supervise [APP] [FEDERATION] --run-config "method='fedper' \\
        run-name='exp1' output-dir='/srv/pflower/runs' num-server-rounds=500"

Run it on the server machine, beside the SuperLink (it reads the run's checkpoint in
``output-dir``), as the operator (it uses the operator's ``flwr`` and its
``FLWR_HOME``). It submits the run with ``resume-from="latest"`` and watches its
status (``flwr list``, every ``--poll`` s). Flower 1.39 ends a run ``finished:failed``
when its ServerApp stops heartbeating (about 60 s after the process died) and when
the SuperLink was away longer than that; a shorter SuperLink outage the ServerApp
rides out by itself (``--database`` keeps the run). A run that ends failed before
its last round is submitted again with the same command: the ServerApp goes on from
the run's own last checkpoint (strategies/checkpoint.py), the sites from their own
personal state. While the SuperLink does not answer, it asks again every ``--poll`` s.

It stops with 0 when the run completes (a run that crashed after its last checkpoint
is submitted again and ends at once); with 1 when it was stopped (``flwr stop``), when
its ServerApp judged it failed after its last round (its verdict, in results.json),
or after ``--max-stalls`` failed tries in a row that did not move the checkpoint (a
run that cannot start: its log says why). Each try is a line on stdout and, with
``--events FILE``, a JSON line there.

Flower 1.42 behaves the same way here: a run whose ServerApp stopped heartbeating is
failed by the SuperLink, and nothing in Flower submits it again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from pflower.config.schema import RESUME_LATEST

CHECKPOINT = "server-state.npz"  # strategies/checkpoint.py's SERVER_STATE
# how Flower's status details begin when the ServerApp itself raised (its verdict on the
# run, e.g. a round with no reply), not when its process died or stopped heartbeating
VERDICT = "ServerApp failed with exception"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m deploy.supervise", description=__doc__.split("\n")[0]
    )
    p.add_argument("app", nargs="?", default=".", help="the app to submit (default: .)")
    p.add_argument("federation", nargs="?", default="", help="the flwr federation")
    p.add_argument(
        "--run-config",
        required=True,
        help="as flwr run takes it (key=value pairs, or a .toml file); needs run-name and "
        "an absolute output-dir; resume-from='latest' is added (in "
        "<output-dir>/.<run-name>.supervise.toml, what is submitted)",
    )
    p.add_argument("--poll", type=float, default=10.0, help="seconds between status checks")
    p.add_argument(
        "--max-stalls",
        type=int,
        default=3,
        help="give up after this many failed tries in a row with no new checkpoint",
    )
    p.add_argument("--events", help="append one JSON line per try to this file")
    p.add_argument("--flwr", default="", help="the flwr CLI (default: beside this Python)")
    args = p.parse_args(argv)
    config = run_config(args.run_config)
    if not config.get("run-name"):
        p.error("--run-config needs run-name: the run's checkpoint is found by it")
    if not Path(str(config.get("output-dir", ""))).is_absolute():
        p.error("--run-config needs an absolute output-dir: the ServerApp writes there")
    args.config = config
    return args


def run_config(text: str) -> dict[str, Any]:
    """The run config as flwr reads ``--run-config`` (a TOML file or key=value pairs)."""
    from flwr.common.config import parse_config_args

    return dict(parse_config_args([text]))


def checkpoint_round(run_dir: Path) -> int:
    """The round of the run's last checkpoint (0: none yet). Read from its metadata
    only; a file being replaced is read again."""
    path = run_dir / CHECKPOINT
    for _ in range(3):
        if not path.exists():
            return 0
        try:
            from pflower.store import read_checked_npz

            arrays, _ = read_checked_npz(path)
            return int(json.loads(str(arrays["__meta__"]))["round"])
        except (ValueError, KeyError):
            time.sleep(0.5)
    return 0


class Supervisor:
    """Submit, watch and submit again; ``flwr(*args)`` runs the CLI."""

    def __init__(
        self,
        args: argparse.Namespace,
        flwr: Callable[..., subprocess.CompletedProcess[str]],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.args, self.flwr, self.sleep = args, flwr, sleep
        self.total = int(args.config.get("num-server-rounds", 10))
        self.run_dir = Path(args.config["output-dir"]) / str(args.config["run-name"])
        self.federation = [args.federation] if args.federation else []

    def note(self, event: str, **fields: Any) -> None:
        fields = {"time": time.time(), "event": event, **fields}
        text = ", ".join(f"{k}={v}" for k, v in fields.items() if k not in ("time", "event"))
        print(f"supervise: {event}: {text}", flush=True)
        if self.args.events:
            with open(self.args.events, "a") as out:
                out.write(json.dumps(fields) + "\n")

    def _json(self, out: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
        start = out.stdout.find("{")
        try:
            return json.loads(out.stdout[start:]) if start >= 0 else None
        except ValueError:
            return None

    def submit(self) -> int:
        """Submit the run (again), waiting out a SuperLink that does not answer."""
        config = self.run_dir.parent / f".{self.run_dir.name}.supervise.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(tomli_w.dumps({**self.args.config, "resume-from": RESUME_LATEST}))
        while True:
            out = self.flwr(
                "run",
                self.args.app,
                *self.federation,
                "--run-config",
                str(config),
                "--format",
                "json",
            )
            reply = self._json(out) or {}
            if reply.get("success"):
                return int(reply["run-id"])
            self.note("submit failed", why=(reply.get("error-message") or out.stderr)[-200:])
            self.sleep(self.args.poll)

    def status(self, run_id: int) -> tuple[str, str]:
        """(status, details) of the run; ("", why) while the SuperLink does not answer."""
        out = self.flwr("list", *self.federation, "--run-id", str(run_id), "--format", "json")
        reply = self._json(out) or {}
        runs = reply.get("runs") or []
        if not runs:
            return "", (reply.get("error-message") or out.stderr or out.stdout)[-200:]
        return str(runs[0]["status"]), str(runs[0].get("status-details", ""))

    def watch(self, run_id: int) -> tuple[str, str]:
        away = False
        while True:
            status, details = self.status(run_id)
            if not status and not away:
                self.note("superlink not answering", run=run_id, why=details)
            away = not status
            if status.startswith("finished"):
                return status, details
            self.sleep(self.args.poll)

    def keep_going(self) -> int:
        stalls, tries = 0, 0
        while True:
            before = checkpoint_round(self.run_dir)
            run_id = self.submit()
            tries += 1
            self.note("submitted", run=run_id, attempt=tries, checkpoint=before, rounds=self.total)
            status, details = self.watch(run_id)
            after = checkpoint_round(self.run_dir)
            self.note("ended", run=run_id, status=status, details=details, checkpoint=after)
            if status == "finished:completed":
                return 0
            if status == "finished:stopped":
                self.note("giving up", why="the run was stopped by an operator")
                return 1
            if after >= self.total and VERDICT in details:
                self.note("giving up", why=f"the run failed after its last round ({after})")
                return 1
            stalls = stalls + 1 if after <= before else 0
            if stalls >= self.args.max_stalls:
                self.note(
                    "giving up",
                    why=f"{stalls} tries in a row ended failed without a new checkpoint "
                    f"(round {after}); see flwr log {run_id}",
                )
                return 1
            self.note("resuming", run=run_id, checkpoint=after, rounds_left=self.total - after)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    flwr = args.flwr or str(Path(sys.executable).parent / "flwr")
    if not Path(flwr).exists():
        flwr = shutil.which("flwr") or flwr

    def cli(*cmd: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([flwr, *cmd], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as err:
            return subprocess.CompletedProcess(err.cmd, 1, "", "flwr timed out")

    sys.exit(Supervisor(args, cli).keep_going())


if __name__ == "__main__":
    main(sys.argv[1:])
