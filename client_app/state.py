"""Where a client keeps its personal state between rounds.

Simulation: Flower's ``context.state`` (kept by the engine per node, in memory).
Deployment: an atomic on-disk store under the site's state directory, so the
personal part survives a SuperNode restart.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Protocol

import numpy as np
from flwr.common import Array, ArrayRecord, Context

from pfl_store import read_checked_npz, write_checked_npz

log = logging.getLogger("flwr.pflower")

_RECORD = "pflower.personal"


class PersonalStore(Protocol):
    def load(self) -> dict[str, np.ndarray] | None: ...

    def save(self, arrays: dict[str, np.ndarray]) -> None: ...

    def set_aside(self, why: str) -> None:
        """Keep what ``load`` returned out of the way (never delete it), and log why."""


class ContextStore:
    """Personal arrays in ``context.state`` (the simulation fast path)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def load(self) -> dict[str, np.ndarray] | None:
        if _RECORD not in self.context.state:
            return None
        record = self.context.state[_RECORD]
        return {k: v.numpy() for k, v in record.items()}

    def set_aside(self, why: str) -> None:
        log.warning("personal state in this node's context dropped: %s", why)
        del self.context.state[_RECORD]

    def save(self, arrays: dict[str, np.ndarray]) -> None:
        self.context.state[_RECORD] = ArrayRecord(
            # np.require keeps 0-d entries (BN num_batches_tracked) 0-d; ascontiguousarray would not
            array_dict={k: Array(np.require(v, requirements="C")) for k, v in arrays.items()}
        )


class DiskStore:
    """Personal arrays in ``<state_dir>/<experiment>/<site>.npz``, written
    atomically, with a checksum checked on load."""

    def __init__(self, state_dir: str | Path, experiment: str, site: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in site)
        self.path = Path(state_dir) / experiment / f"{safe}.npz"

    def load(self) -> dict[str, np.ndarray] | None:
        if not self.path.exists():
            return None
        try:
            arrays, digest = read_checked_npz(self.path)
        except ValueError as err:
            log.error(
                "personal state %s is corrupt (%s): re-initialising the personal part",
                self.path,
                err,
            )
            return None
        log.info("restored personal state from %s (sha256 %s)", self.path, digest)
        return arrays

    def set_aside(self, why: str) -> None:
        aside = self.path.with_name(
            f"{self.path.stem}.foreign-{time.strftime('%Y%m%d-%H%M%S')}.npz"
        )
        self.path.replace(aside)
        log.warning("personal state %s %s: kept as %s, starting afresh", self.path, why, aside.name)

    def save(self, arrays: dict[str, np.ndarray]) -> None:
        write_checked_npz(self.path, arrays)
