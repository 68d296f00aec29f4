"""The server checkpoint: saved after every aggregation, resumed with `resume-from`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays

from pflower.config.schema import ConfigError, RunConfig
from pflower.engine.simulate import simulate
from pflower.results import RunRecorder
from strategies.base import PFLStrategy
from strategies.checkpoint import SERVER_STATE
from tests.helpers import FakeProxy, config, fit_res, make_strategy


def _with_recorder(cfg: RunConfig) -> PFLStrategy:
    return make_strategy(cfg, RunRecorder(cfg))


def _one_round(strategy: PFLStrategy, server_round: int, clients: int = 4) -> None:
    rng = np.random.default_rng(server_round)
    replies = []
    for k in range(clients):
        spec = strategy.wire.up_spec()
        arrays = [
            rng.normal(size=[d if d >= 0 else 3 for d in s.shape]).astype(s.dtype) for s in spec
        ]
        replies.append((FakeProxy(k + 1), fit_res(arrays, f"client-{k}", 10 + k)))
    strategy.aggregate_fit(server_round, replies, [])
    if strategy.rounds.writing is not None:  # the checkpoint, written on its own thread
        strategy.rounds.writing.thread.join()


@pytest.mark.parametrize("method", ["fedavg", "fedper", "fedfac-static", "fedfac-dynamic"])
def test_a_resumed_server_has_what_the_saved_one_learned(method: str, tmp_path: Path) -> None:
    first = _with_recorder(config(method=method, output_dir=str(tmp_path), run_name="a"))
    for r in (1, 2):
        _one_round(first, r)
    saved = tmp_path / "a" / SERVER_STATE
    assert saved.exists()

    second = _with_recorder(
        config(method=method, output_dir=str(tmp_path), run_name="b", resume_from=str(saved))
    )
    second.resume(str(saved))
    assert second.rounds.offset == 2
    for got, want in zip(second.global_arrays, first.global_arrays, strict=True):
        np.testing.assert_array_equal(got, want)
    if method.startswith("fedfac"):
        assert first.shared is not None and second.shared is not None
        for layer, mask in first.shared.items():
            np.testing.assert_array_equal(second.shared[layer], mask)
        # static: no second FA, so the uploads carry the shared elements only
        assert second.wire.full_upload() == (method == "fedfac-dynamic")
    # rounds go on from the saved one, on the wire and in the checkpoint
    _one_round(second, 1)
    assert json.loads(str(np.load(tmp_path / "b" / SERVER_STATE)["__meta__"]))["round"] == 3


def test_a_checkpoint_is_written_beside_the_next_round_and_told_as_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Round 2's checkpoint is written on its own thread while round 3 runs: round 3's
    clients are told round 1's as written and round 2's as being written (they keep
    their state as of both); the next checkpoint waits for it first."""
    strategy = _with_recorder(
        config(method="fedavg", output_dir=str(tmp_path), run_name="a", num_server_rounds=4)
    )
    saved = tmp_path / "a" / SERVER_STATE
    _one_round(strategy, 1)
    _one_round(strategy, 2)
    writing = strategy.rounds.writing
    assert writing is not None and writing.round == 2
    told = strategy.rounds.instructions(3, True, True)
    assert (told["checkpoint-round"], told["checkpoint-writing"]) == (1, 2)
    kept = np.load(saved)
    assert json.loads(str(kept["__meta__"]))["round"] == 2
    for got, want in zip(
        (kept[f"global/{s.name}"] for s in strategy.spec), strategy.global_arrays, strict=True
    ):
        np.testing.assert_array_equal(got, want)
    assert not list(saved.parent.glob("*.tmp"))
    # a write that fails stops the run at the next checkpoint, the last good file kept
    monkeypatch.setattr(
        "strategies.checkpoint.write_checked_npz",
        lambda path, arrays, *digest: (_ for _ in ()).throw(OSError("disk full")),
    )
    with caplog.at_level(logging.ERROR, logger="flwr.pflower"):
        _one_round(strategy, 3)  # settles round 2's, starts round 3's (which fails)
    assert "checkpoint of round 3 not written: disk full" in caplog.text
    assert strategy.rounds.checkpointed == 2
    with pytest.raises(OSError, match="disk full"):
        _one_round(strategy, 4)
    assert json.loads(str(np.load(saved)["__meta__"]))["round"] == 2


def test_factorized_fl_resumes_every_clients_own_aggregate(tmp_path: Path) -> None:
    cfg = config(method="factorized-fl-alpha", output_dir=str(tmp_path), run_name="a")
    first = _with_recorder(cfg)
    _one_round(first, 1)
    second = _with_recorder(config(method="factorized-fl-alpha", output_dir=str(tmp_path)))
    second.resume(str(tmp_path / "a"))  # the run directory names its checkpoint too
    assert sorted(second.payloads.per_client) == [f"client-{k}" for k in range(4)]
    for key, payload in first.payloads.per_client.items():
        for got, want in zip(
            parameters_to_ndarrays(second.payloads.per_client[key]), parameters_to_ndarrays(payload)
        ):
            np.testing.assert_array_equal(got, want)
    assert second.payload_for("client-2", 1) is second.payloads.per_client["client-2"]


def test_checkpoint_every_zero_writes_none(tmp_path: Path) -> None:
    strategy = _with_recorder(
        config(method="fedavg", output_dir=str(tmp_path), run_name="a", checkpoint_every=0)
    )
    _one_round(strategy, 1)
    assert not (tmp_path / "a" / SERVER_STATE).exists()


@pytest.mark.parametrize("problem", ["missing", "corrupt", "other-method", "other-model"])
def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_key(
    problem: str, tmp_path: Path
) -> None:
    saver = _with_recorder(config(method="fedavg", output_dir=str(tmp_path), run_name="a"))
    _one_round(saver, 1)
    path = tmp_path / "a" / SERVER_STATE
    method, hidden = "fedavg", 32
    if problem == "missing":
        path = tmp_path / "nowhere" / SERVER_STATE
    elif problem == "corrupt":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif problem == "other-method":
        method = "fedper"
    else:
        hidden = 16
    loader = make_strategy(config(method=method, hidden_dim=hidden))
    with pytest.raises(ConfigError, match="config key 'resume-from'"):
        loader.resume(str(path))
    assert loader.rounds.offset == 0


@pytest.mark.slow
def test_two_rounds_then_a_resumed_round_equal_three_rounds(tmp_path: Path) -> None:
    """FedAvg (no personal state): the resumed run is the uninterrupted one."""
    base = {"method": "fedavg", "output-dir": str(tmp_path), "seed": 3}
    straight = simulate({**base, "num-server-rounds": 3, "run-name": "straight"}, num_clients=3)
    simulate({**base, "num-server-rounds": 2, "run-name": "first"}, num_clients=3)
    resumed = simulate(
        {
            **base,
            "num-server-rounds": 1,
            "run-name": "resumed",
            "resume-from": str(tmp_path / "first"),
        },
        num_clients=3,
    )
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3]  # earlier rounds carried over
    assert resumed["resumed_from"]["round"] == 2
    for a, b in zip(straight["rounds"], resumed["rounds"], strict=True):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]
    with (
        np.load(tmp_path / "straight" / SERVER_STATE) as x,
        np.load(tmp_path / "resumed" / SERVER_STATE) as y,
    ):
        for name in x.files:
            np.testing.assert_array_equal(x[name], y[name])


def test_the_store_writes_what_np_load_reads_and_refuses_a_corrupt_or_cut_file(
    tmp_path: Path,
) -> None:
    """A checked file (either digest) is an .npz whose arrays ``np.load`` gives back
    as they were (0-d, unicode, int64, a non-contiguous array, one above a write piece);
    a file of before (``np.savez`` with a sha256 member) still reads; a flipped bit in
    any member's data, a member dropped or a digest of other arrays is refused."""
    import zipfile

    from pflower.store import DIGESTS, _digest, read_checked_npz, write_checked_npz

    rng = np.random.default_rng(0)
    arrays = {
        "global/w": rng.normal(size=(3 << 18) + 5).astype(np.float32),  # 3 MB + 20 bytes
        "global/t": rng.normal(size=(6, 4)).T,
        "n": np.array(7, np.int64),
        "__meta__": np.array('{"method": "fedavg", "round": 2}'),
    }
    for algorithm in DIGESTS:
        path = tmp_path / f"{algorithm}.npz"
        written = write_checked_npz(path, arrays, algorithm)
        got, digest = read_checked_npz(path)
        assert digest == written == _digest(arrays, algorithm)
        assert set(got) == set(arrays)
        for k, a in arrays.items():
            assert got[k].dtype == a.dtype and np.array_equal(got[k], a)
        with np.load(path) as npz:
            assert sorted(npz.files) == sorted([*arrays, DIGESTS[algorithm]])
        raw = path.read_bytes()
        for at in (raw.index(b"NUMPY") + 200, len(raw) // 2):
            broken = bytearray(raw)
            broken[at] ^= 0x01
            path.write_bytes(bytes(broken))
            with pytest.raises(ValueError, match="unreadable|checksum"):
                read_checked_npz(path)
        path.write_bytes(raw)
        with zipfile.ZipFile(path) as whole, zipfile.ZipFile(tmp_path / "cut.npz", "w") as cut:
            for info in whole.infolist():
                if info.filename != "n.npy":
                    cut.writestr(info, whole.read(info))
        with pytest.raises(ValueError, match="checksum mismatch"):
            read_checked_npz(tmp_path / "cut.npz")
    before = tmp_path / "before.npz"
    np.savez(before, **arrays, __sha256__=np.array(_digest(arrays)))
    got, digest = read_checked_npz(before)
    assert digest == _digest(arrays) and np.array_equal(got["global/w"], arrays["global/w"])
    other = dict(arrays, n=np.array(8, np.int64))
    np.savez(before, **other, __sha256__=np.array(_digest(arrays)))
    with pytest.raises(ValueError, match="checksum mismatch"):
        read_checked_npz(before)
