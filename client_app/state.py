"""Where a client keeps its personal state between rounds.

Simulation: Flower's ``context.state`` (kept by the engine per node, in memory), or,
on disk, one file per round in the run's directory, so that a run resumed from the
server's checkpoint gets every client's state as it was at that round.
Deployment: an atomic on-disk store under the site's state directory, so the
personal part survives a SuperNode restart.

``load(upto)`` reads the newest state saved at round ``upto`` or before (None: the
newest); ``save(arrays, server_round, checkpointed, writing)`` names the round that
wrote it, the round of the server's last checkpoint and of the one it is writing.
Only the per-round store uses them.

A deployed site's store keeps its newest state and the one before, each naming its
parent (the sha256 of the state it was trained from) and its generation (the fits
that made it): a corrupt newest file falls back to the one before, and the site's
ledger lists what each task restored and saved, a SHA-256 chain (pflower.store's
``STATE_EVENTS``, deploy/site_guard.py).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Protocol

import numpy as np
from flwr.common import Array, ArrayRecord, Context

from pflower.store import STATE_EVENTS, read_checked_npz, write_checked_npz

log = logging.getLogger("flwr.pflower")

_RECORD = "pflower.personal"


class PersonalStore(Protocol):
    def load(self, upto: int | None = None) -> dict[str, np.ndarray] | None: ...

    def save(
        self,
        arrays: dict[str, np.ndarray],
        server_round: int | None = None,
        checkpointed: int | None = None,
        writing: int | None = None,
    ) -> None: ...

    def set_aside(self, why: str) -> None:
        """Keep what ``load`` returned out of the way (never delete it), and log why."""


class ContextStore:
    """Personal arrays in ``context.state`` (the simulation fast path)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def load(self, upto: int | None = None) -> dict[str, np.ndarray] | None:
        if _RECORD not in self.context.state:
            return None
        record = self.context.state[_RECORD]
        return {k: v.numpy() for k, v in record.items()}

    def set_aside(self, why: str) -> None:
        log.warning("personal state in this node's context dropped: %s", why)
        del self.context.state[_RECORD]

    def save(
        self,
        arrays: dict[str, np.ndarray],
        server_round: int | None = None,
        checkpointed: int | None = None,
        writing: int | None = None,
    ) -> None:
        self.context.state[_RECORD] = ArrayRecord(
            # np.require keeps 0-d entries (BN num_batches_tracked) 0-d; ascontiguousarray would not
            array_dict={k: Array(np.require(v, requirements="C")) for k, v in arrays.items()}
        )


class DiskStore:
    """Personal arrays in ``<state_dir>/<experiment>/<site>.npz``, written
    atomically, with a checksum checked on load; the state before it is kept as
    ``<site>.previous.npz`` and read when the newest is corrupt."""

    CHAIN = "__chain__"  # in each file: a JSON string, its parent's sha256 and generation
    DIGEST = "sha256"  # a deployed site's state: the digest its ledger's chain names

    def __init__(self, state_dir: str | Path, experiment: str, site: str) -> None:
        self.path = Path(state_dir) / experiment / f"{file_name(site)}.npz"
        self.restored: tuple[str, int] | None = None  # sha256 and generation of the last load
        self.newest_corrupt = False  # the last load found the newest file corrupt

    @property
    def previous(self) -> Path:
        return self.path.with_name(f"{self.path.stem}.previous.npz")

    def load(self, upto: int | None = None) -> dict[str, np.ndarray] | None:
        self.restored, self.newest_corrupt = None, False
        for path in (self.path, self.previous):
            if not path.exists():
                continue
            try:
                arrays, digest = read_checked_npz(path)
            except ValueError as err:
                then = "the state before it" if path == self.path else "the initial personal part"
                log.error("personal state %s is corrupt (%s): using %s", path, err, then)
                STATE_EVENTS.append({"corrupt": path.name, "why": str(err)[:120]})
                self.newest_corrupt |= path == self.path
                continue
            chain = json.loads(str(arrays.pop(self.CHAIN, "{}")))
            self.restored = (digest, int(chain.get("generation", 0)))
            kind = "sha256" if len(digest) == 64 else "xxh3"  # by its length (pflower/store)
            log.info("restored personal state from %s (%s %s)", path, kind, digest)
            STATE_EVENTS.append(
                {"restored": digest, "parent": chain.get("parent"), "generation": self.restored[1]}
                | ({"from": "previous"} if path != self.path else {})
            )
            return arrays
        return None

    def set_aside(self, why: str) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.stem}.foreign-{stamp}.npz")
        kept = False  # the newest file is kept aside (the one before only if it is all)
        for path in (self.path, self.previous):
            if path.exists() and not kept:
                path.replace(aside)
                kept = True
            elif path.exists():
                path.unlink()
        self.restored = None
        log.warning("personal state %s %s: kept as %s, starting afresh", self.path, why, aside.name)

    def save(
        self,
        arrays: dict[str, np.ndarray],
        server_round: int | None = None,
        checkpointed: int | None = None,
        writing: int | None = None,
    ) -> None:
        parent, generation = self.restored or (None, 0)
        chain = {"parent": parent, "generation": generation + 1}
        if self.path.exists() and not self.newest_corrupt:  # the newest becomes the one
            # before (a hard link: the newest stays in place until the rename replaces it)
            linked = self.previous.with_suffix(".link")
            linked.unlink(missing_ok=True)
            os.link(self.path, linked)
            os.replace(linked, self.previous)
        digest = write_checked_npz(
            self.path, {**arrays, self.CHAIN: np.array(json.dumps(chain))}, self.DIGEST
        )
        self.restored = (digest, chain["generation"])
        STATE_EVENTS.append({"saved": digest, **chain})


def file_name(site: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in site)


class RoundStore(DiskStore):
    """A simulated client's personal state, one file per round that saved it:
    ``<root>/<site>/r<round>.npz``. A save keeps, beside the new file, the newest one
    at or before the server's last checkpoint (and at or before the one it is
    writing), so a run resumed from that checkpoint
    finds the client as it was then, even if the client had trained again before
    the run stopped. A site with no file of its own reads ``fallback`` (the
    personal state of the run it resumes from)."""

    DIGEST = "xxh3"  # a client-round's file: the fast digest (pflower/store)

    def __init__(self, root: Path, site: str, fallback: Path | None = None) -> None:
        self.dir = root / file_name(site)
        self.fallback = fallback / file_name(site) if fallback is not None else None
        self.path = self.dir / "r0.npz"

    @staticmethod
    def versions(folder: Path) -> dict[int, Path]:
        """The saved rounds in ``folder`` (files set aside or half-written are not)."""
        out = {}
        for path in folder.glob("r*.npz"):
            if path.stem[1:].isdigit():
                out[int(path.stem[1:])] = path
        return out

    def load(self, upto: int | None = None) -> dict[str, np.ndarray] | None:
        own = self.versions(self.dir)
        found = own or (self.versions(self.fallback) if self.fallback is not None else {})
        usable = [r for r in found if upto is None or r <= upto]
        if not usable:
            return None
        self.path = found[max(usable)]
        return super().load()

    def save(
        self,
        arrays: dict[str, np.ndarray],
        server_round: int | None = None,
        checkpointed: int | None = None,
        writing: int | None = None,
    ) -> None:
        before = self.versions(self.dir)
        now = server_round if server_round is not None else max(before, default=0)
        self.path = self.dir / f"r{now}.npz"
        write_checked_npz(self.path, arrays, self.DIGEST)
        # a run resumes from the server's last checkpoint, or from the one it is
        # writing: the newest state at or before each is kept beside this round's
        kept = {now}
        for limit in (checkpointed, writing):
            if limit is not None:
                kept.add(max((r for r in before if r <= limit), default=now))
        for r, path in before.items():
            if r not in kept:
                path.unlink(missing_ok=True)
