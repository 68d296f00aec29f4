"""The server's checkpoint: what the federation has learned, kept on disk.

``<run dir>/server-state.npz`` holds the global shared tensors (by wire-spec
name), the method's own server state (Factorized-FL's per-client aggregates,
FedFac's split) and the round it was taken after; it is checksummed and written
atomically, like a client's personal state (both through ``pflower.store``). The run config
key ``resume-from`` (the file or its run directory) starts a new run from it:
rounds go on from the saved one, and the results so far are carried over.
``resume-from="latest"`` names the run's own checkpoint, if it has one: the same
command, given again after a crash (by ``deploy.supervise`` or a restart policy), goes
on where the run stopped, to the same last round.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pflower.config.schema import RESUME_LATEST, ConfigError
from pflower.store import PERSONAL_STATE_DIR, read_checked_npz, write_checked_npz

if TYPE_CHECKING:
    from strategies.recording import Rounds

log = logging.getLogger("flwr.pflower")

SERVER_STATE = "server-state.npz"
_META = "__meta__"  # a JSON string: method and round


def save_server_state(
    run_dir: Path, method: str, server_round: int, arrays: dict[str, np.ndarray]
) -> Path:
    path = run_dir / SERVER_STATE
    meta = json.dumps({"method": method, "round": server_round})
    write_checked_npz(
        path, {**arrays, _META: np.array(meta)}, "xxh3"
    )  # a fast hash: a large model is written every round
    return path


class CheckpointWrite:
    """A checkpoint written (atomically, and synced) on a thread of its own while the
    next round runs: the clients are told its round as the one being written beside
    the last one written, and keep their personal state as of each
    (client_app/state.py), so a run resumed from either file finds its clients'
    states. The arrays are written as ``server_state`` returned them: the strategy
    replaces its global tensors each round, never changes them in place."""

    def __init__(
        self, run_dir: Path, method: str, server_round: int, arrays: dict[str, np.ndarray]
    ) -> None:
        self.round = server_round
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._write, args=(run_dir, method, arrays), name=f"checkpoint-{server_round}"
        )
        self.thread.start()

    def _write(self, run_dir: Path, method: str, arrays: dict[str, np.ndarray]) -> None:
        try:
            save_server_state(run_dir, method, self.round, arrays)
        except BaseException as err:  # noqa: BLE001 - raised again by wait
            # logged now too: a run whose last round aggregates nothing never waits
            log.error("checkpoint of round %d not written: %s", self.round, err)
            self.error = err

    def wait(self) -> int:
        """The round written, once it is; raises what the write raised (the run stops
        there, as on a failed synchronous write)."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.round


class RunComplete(Exception):
    """``resume-from="latest"``: the run's checkpoint is of its last round already."""


def latest(cfg: Any) -> dict[str, Any]:
    """The run config keys that make ``resume-from="latest"`` concrete for ``cfg``:
    this run-name's checkpoint and the rounds left of ``num-server-rounds`` (the whole
    run's); no resume while there is no checkpoint yet; {} for any other resume-from.
    RunComplete when the checkpoint is of the run's last round."""
    if cfg.resume_from.strip() != RESUME_LATEST:
        return {}
    if not cfg.run_name:
        raise ConfigError(
            f"config key 'resume-from': '{RESUME_LATEST}' resumes the run of this run-name "
            "from its own checkpoint: give run-name"
        )
    run_dir = Path(cfg.output_dir).expanduser().resolve() / cfg.run_name
    path = run_dir / SERVER_STATE
    if not path.exists():
        log.info("resume-from latest: no checkpoint at %s yet; the run starts at round 1", path)
        return {"resume-from": ""}
    done, _ = load_server_state(path, cfg.method)
    left = cfg.num_server_rounds - done
    if left <= 0:
        raise RunComplete(f"{path} holds round {done} of {cfg.num_server_rounds}: nothing to run")
    log.info(
        "resume-from latest: %s holds round %d of %d; %d to go",
        path,
        done,
        cfg.num_server_rounds,
        left,
    )
    return {"resume-from": str(run_dir), "num-server-rounds": left}


def checkpoint_path(resume_from: str) -> Path:
    """The checkpoint file named by ``resume-from`` (the file or its run directory)."""
    path = Path(resume_from).expanduser().resolve()
    return path / SERVER_STATE if path.is_dir() else path


def load_server_state(path: Path, method: str) -> tuple[int, dict[str, np.ndarray]]:
    """(round, arrays) of a checkpoint file; ConfigError naming ``resume-from`` if it
    is missing, corrupt or from another method."""
    if not path.exists():
        raise ConfigError(f"config key 'resume-from': no server checkpoint at {path}")
    try:
        arrays, _ = read_checked_npz(path)
        meta: dict[str, Any] = json.loads(str(arrays.pop(_META)))
    except (ValueError, KeyError) as err:
        raise ConfigError(f"config key 'resume-from': {path} is corrupt ({err})") from None
    if meta.get("method") != method:
        raise ConfigError(
            f"config key 'resume-from': {path} was saved by method {meta.get('method')!r}, "
            f"this run is {method!r}"
        )
    return int(meta["round"]), arrays


def rounds_before(path: Path, server_round: int) -> list[dict[str, Any]]:
    """The per-round records of a checkpoint's run, up to its round (if kept)."""
    results = path.parent / "results.json"
    try:
        rounds = json.loads(results.read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return []
    return [r for r in rounds if int(r.get("round", 0)) <= server_round]


def clear_stale_personal_state(run_dir: Path, resume_from: str) -> None:
    """A run starts without the simulated clients' personal state an earlier run of
    the same name left in its directory, unless it resumes from that very run."""
    if resume_from and checkpoint_path(resume_from).parent == run_dir:
        return
    stale = run_dir / PERSONAL_STATE_DIR
    if stale.is_dir():
        shutil.rmtree(stale)
        log.info("removed %s: an earlier run of this name left it", stale)


def checkpoint_due(server_round: int, every: int, last_round: int) -> bool:
    """``checkpoint-every`` rounds (0: never), and always after the last round."""
    return every > 0 and (server_round % every == 0 or server_round == last_round)


def resume(
    resume_from: str, method: str, restore: Callable[[dict[str, np.ndarray]], None]
) -> tuple[int, Path]:
    """Load the checkpoint ``resume-from`` names into ``restore`` (the strategy's);
    returns (the rounds it had done, its path). ConfigError naming ``resume-from``
    if it is missing, corrupt, another method's, or does not fit this model."""
    path = checkpoint_path(resume_from)
    server_round, arrays = load_server_state(path, method)
    try:
        restore(arrays)
    except ValueError as err:
        raise ConfigError(
            f"config key 'resume-from': {path} does not fit this run's model and method ({err})"
        ) from None
    log.info("resumed from %s: %d rounds done before", path, server_round)
    return server_round, path


def save_if_due(
    rounds: Rounds, server_round: int, server_state: Callable[[], dict[str, np.ndarray]]
) -> None:
    """After ``server_round`` aggregated: write ``server_state()`` when
    ``checkpoint-every`` asks for it, and after the run's last round (which
    ``max-minutes`` may bring forward); nothing without a run directory."""
    cfg, recorder = rounds.cfg, rounds.recorder
    done = rounds.offset + server_round  # rounds are counted across resumes
    last = rounds.offset + rounds.num_rounds  # the run's last (max-minutes may end it early)
    if (
        recorder is not None
        and cfg is not None
        and checkpoint_due(done, cfg.checkpoint_every, last)
    ):
        rounds.settle_checkpoint()  # the one before first: they land in order
        state = server_state()
        if done == last:  # the last: written at once
            save_server_state(recorder.dir, cfg.method, done, state)
            rounds.checkpointed = done
        else:  # settled by the next checkpoint (Rounds.settle_checkpoint)
            rounds.writing = CheckpointWrite(recorder.dir, cfg.method, done, state)
