"""The run's log of accepted replies (run config ``reply-log``): an audit trail a
replay checks.

``<run dir>/replies/index.jsonl`` gets one line per fit reply as it entered a round's
running sum (its Flower run and round, the run-wide round, its node and client key,
the sha256 of its bytes as they arrived, the weight it was added with, and the file
``<run>-r<round>-<seq>.npz`` holding its arrays as they were added, after the round's
bounds), and one line per round's aggregate (the sha256 of the global tensors it
became). Summing a round's logged replies with their weights gives that aggregate
(``replay``): nothing was added that the log does not show, nothing twice. Streamed
rounds only (a mean of the replies, strategies/streaming.py): a held round's rule
(median, SecAgg+'s masked sum, DP's noise) is not a sum of what the log could hold.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import NDArrays

from pflower.store import append_line
from strategies.robust import RunningMean

REPLIES = "replies"
INDEX = "index.jsonl"


def arrays_digest(arrays: Iterable[np.ndarray]) -> str:
    """sha256 of tensors: each one's dtype, shape and bytes, in order."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def bytes_digest(parts: Iterable[bytes]) -> str:
    """sha256 of a reply's tensors as they travelled (what the site's ledger lists)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


class ReplyLog:
    """Writes ``<run dir>/replies/``; one per ServerApp process (Flower run)."""

    def __init__(self, run_dir: Path, run_id: int) -> None:
        self.dir = run_dir / REPLIES
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.seq = 0
        self.lock = threading.Lock()

    def _line(self, entry: dict[str, Any]) -> None:
        data = (json.dumps({"time": time.time(), "run": self.run_id, **entry}) + "\n").encode()
        append_line(self.dir / INDEX, data)

    def reply(
        self,
        server_round: int,
        done: int,
        node: int | None,
        client_key: str,
        received: str,
        weight: float | list[float],
        arrays: NDArrays,
    ) -> None:
        """One reply, as it was added to round ``server_round``'s sum (run-wide round
        ``done``); ``received``: the sha256 of its bytes as they arrived."""
        with self.lock:
            seq, self.seq = self.seq, self.seq + 1
        name = f"{self.run_id}-r{server_round}-{seq}.npz"
        with open(self.dir / name, "wb") as out:
            np.savez(out, *arrays)
        self._line(
            {
                "kind": "reply",
                "round": server_round,
                "done": done,
                "seq": seq,
                "node": node,
                "client_key": client_key,
                "sha256": received,
                "weight": weight,
                "file": name,
            }
        )

    def aggregate(self, server_round: int, done: int, arrays: NDArrays, replies: int) -> None:
        """Round ``server_round``'s aggregate: the global tensors it became."""
        self._line(
            {
                "kind": "aggregate",
                "round": server_round,
                "done": done,
                "sha256": arrays_digest(arrays),
                "replies": replies,
            }
        )


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / REPLIES / INDEX
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay(run_dir: Path, replies: list[dict[str, Any]]) -> NDArrays:
    """The weighted mean of logged replies (as the round's running sum made it)."""
    total = RunningMean()
    for entry in sorted(replies, key=lambda e: e["seq"]):
        with np.load(run_dir / REPLIES / entry["file"]) as z:
            weight = entry["weight"]  # one per array where the method's mean is in parts
            weight = [float(w) for w in weight] if isinstance(weight, list) else float(weight)
            total.add([z[f"arr_{i}"] for i in range(len(z.files))], weight)
    return total.mean()
