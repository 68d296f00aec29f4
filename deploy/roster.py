"""Register a roster's sites with the SuperLink and write their node ids into it.

    python -m deploy.roster register roster.toml [FEDERATION]

For each ``[sites.<name>]`` without a ``node-id``: ``flwr supernode register`` of
its ``public-key`` (a path relative to the roster, or the OpenSSH key text), and
the node id it prints goes into the roster (the file is rewritten: comments are
not kept). The server's run config then names it: ``roster="roster.toml"``
(strategies/roster.py says what the server does with it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

import tomli_w


def public_key_file(roster: Path, value: str, tmp: Path) -> Path:
    """The public key's file: ``value`` as a path (relative to the roster), or its text."""
    if value.startswith(("ecdsa-", "ssh-")):
        path = tmp / "key.pub"
        path.write_text(value.strip() + "\n")
        return path
    path = Path(value).expanduser()
    return path if path.is_absolute() else roster.parent / path


def register(
    roster: Path, federation: Sequence[str] = (), flwr: str = "", env: dict[str, str] | None = None
) -> dict[str, int]:
    """Register every site lacking a node id (``flwr`` with ``env``: the operator's
    CLI and its SuperLink connection); returns the ids written."""
    data = tomllib.loads(roster.read_text())
    flwr = flwr or shutil.which("flwr") or str(Path(sys.executable).parent / "flwr")
    written = {}
    with tempfile.TemporaryDirectory() as tmp:
        for site, entry in data.get("sites", {}).items():
            if "node-id" in entry:
                continue
            key = public_key_file(roster, str(entry.get("public-key", "")), Path(tmp))
            out = subprocess.run(
                [flwr, "supernode", "register", str(key), *federation, "--format", "json"],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            start = out.stdout.find("{")
            reply = json.loads(out.stdout[start:]) if start >= 0 else {}
            if not reply.get("success"):
                raise SystemExit(
                    f"deploy.roster: registering {site} failed: {out.stdout}{out.stderr}"
                )
            entry["node-id"] = written[site] = int(reply["node-id"])
    roster.write_text(tomli_w.dumps(data))
    return written


def main(argv: Sequence[str]) -> None:
    if len(argv) < 2 or argv[0] != "register":
        raise SystemExit("usage: python -m deploy.roster register ROSTER [FEDERATION]")
    for site, node in register(Path(argv[1]), argv[2:]).items():
        print(f"{site}: node {node}")


if __name__ == "__main__":
    main(sys.argv[1:])
