"""The patches of Flower and torch internals (pflower.patches): one table of what is
patched and the versions checked, a refusal in one line for any other version, and
a switch that runs Flower and torch as they are."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import pytest

import pflower.patches

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_the_table_lists_every_patch_and_every_patch_function_is_in_it() -> None:
    doc = pflower.patches.__doc__ or ""
    functions = {"linkstate-index", "supernode-backoff", "object-retries", "superexec-fork"}
    functions |= {"fleet-long-poll"}
    functions |= {"fab-reuse", "clientapp-task-end"}
    functions |= {"optimizers-without-dynamo", "secagg-masks", "npy-headers"}
    functions |= {"engine-wakeups", "ray-app-once", "ray-two-in-flight", "ray-weights-once"}
    functions |= {"serverapp-after-ray", "sparse-node-stores", "activation-retry"}
    functions |= {"clientapp-site-checks", "reply-downloads-apart", "resident-model-hooks"}
    assert set(pflower.patches.PATCHES) == functions
    for name in functions:
        assert f"``{name}``" in doc  # the table row
    for library in pflower.patches.TESTED:
        assert all(v.rstrip(".") in doc for v in pflower.patches.TESTED[library])


def _fab(note: str) -> bytes:
    """A FAB as ``flwr build`` makes one: the project's pyproject.toml, a file, the
    hash manifest."""
    import hashlib
    import io
    import zipfile
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_bytes()
    files = {"pyproject.toml": pyproject, "note.txt": note.encode()}
    manifest = "\n".join(f"{n},{hashlib.sha256(b).hexdigest()},{len(b)}" for n, b in files.items())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as fab:
        for name, data in files.items():
            fab.writestr(name, data)
        fab.writestr(".info/CONTENT", manifest)
    return buf.getvalue()


def test_fab_reuse_unpacks_each_fab_once(tmp_path, monkeypatch) -> None:
    import flwr.cli.install as flower_install
    from flwr.supernode.runtime import run_clientapp as runner

    monkeypatch.setattr(runner, "install_from_fab", runner.install_from_fab)  # undone after
    unpacked, unpack = [], flower_install.safe_extract_zip
    monkeypatch.setattr(
        flower_install, "safe_extract_zip", lambda z, to: unpacked.append(to) or unpack(z, to)
    )
    assert pflower.patches.fab_reuse()
    fab = _fab("one")
    assert pflower.patches.installed_fab(fab, tmp_path) is None  # not installed yet
    first = runner.install_from_fab(fab, tmp_path, skip_prompt=True)  # Flower installs it
    again = runner.install_from_fab(fab, tmp_path, skip_prompt=True)
    assert again == first == pflower.patches.installed_fab(fab, tmp_path)
    assert (first / "note.txt").read_text() == "one" and len(unpacked) == 1  # not again
    other = runner.install_from_fab(_fab("two"), tmp_path, skip_prompt=True)  # another build
    assert other != first and (other / "note.txt").read_text() == "two" and len(unpacked) == 2
    assert pflower.patches.installed_fab(b"not a FAB", tmp_path) is None  # Flower says why


def test_the_installed_versions_are_the_checked_ones() -> None:
    pflower.patches.check()  # raises on this machine's versions otherwise


def test_an_untested_version_is_refused_in_one_line_naming_the_switch(monkeypatch) -> None:
    monkeypatch.setattr(pflower.patches.core, "installed", lambda lib: "9.9.9")
    with pytest.raises(pflower.patches.UntestedVersion) as err:
        pflower.patches.check(("flwr",))
    message = str(err.value)
    assert "\n" not in message and "flwr 9.9.9" in message and "PFLOWER_FLOWER_PATCHES=0" in message
    assert "linkstate-index" in message
    monkeypatch.setenv("PFLOWER_FLOWER_PATCHES", "0")
    pflower.patches.check(("flwr", "torch"))  # the switch: nothing patched, nothing to check


def test_no_other_module_patches_a_flower_or_torch_internal() -> None:
    """Assignments into flwr or torch modules live in pflower.patches only."""
    import re

    assign = re.compile(
        r"^\s*(loop|superexec|vce_api|InMemoryLinkState|torch\.optim)\.\w+\s*=", re.M
    )
    kwdefaults = re.compile(r"__kwdefaults__\[")
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        rel = path.relative_to(ROOT)
        # hidden folders are not the product's: .venv*, and .flwr, where a local run
        # installs a copy of the app (its pflower/patches too)
        if rel.parts[0].startswith(".") or rel.parts[0] in ("tests", "outputs"):
            continue
        if rel.parts[:2] == ("pflower", "patches"):
            continue
        text = path.read_text()
        if assign.search(text) or kwdefaults.search(text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_switch_runs_flower_and_torch_as_they_are() -> None:
    code = (
        "import os; os.environ['PFLOWER_FLOWER_PATCHES'] = '0'; import torch; "
        "from client_app.train import SGD, Adam; import server_app.app; "
        "from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState as S; "
        "assert SGD is torch.optim.SGD and Adam is torch.optim.Adam; "
        "assert not getattr(S, '_pflower_indexed', False); "
        "from flwr.compat.common import parameter as P; import client_app.train; "
        "assert not getattr(P.bytes_to_ndarray, '_pflower_npy', False); print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_clientapp_task_ends_with_flowers_exit_handlers_and_the_worker_goes_on(
    monkeypatch,
) -> None:
    """In a warm worker, the end of a task runs what Flower's flwr_exit runs before it
    exits (the task's status to the SuperNode, its heartbeat stopped), then returns."""
    import threading

    from flwr.supercore.exit.exit_handler import add_exit_handler
    from flwr.supernode.runtime import run_clientapp as runner

    monkeypatch.setattr(runner, "flwr_exit", runner.flwr_exit)  # restored after the test
    assert pflower.patches.clientapp_task_end()
    ran: list[str] = []
    add_exit_handler(lambda: ran.append("status pushed"), run_before_force_exit=True)
    add_exit_handler(lambda: ran.append("heartbeat stopped"))
    threads = threading.active_count()
    with pytest.raises(pflower.patches.TaskEnded) as ended:
        runner.flwr_exit(0)  # as run_clientapp ends a task
    assert ended.value.code == 0 and ran == ["status pushed", "heartbeat stopped"]
    assert threading.active_count() == threads  # no force-exit timer left behind
    with pytest.raises(pflower.patches.TaskEnded):
        runner.flwr_exit(101)  # the next task's end: its own handlers only
    assert ran == ["status pushed", "heartbeat stopped"]


def _npy_cases() -> list[Any]:
    """Arrays of each dtype, shape and memory order Flower's ``ndarray_to_bytes`` writes."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [
        rng.normal(size=(64, 32, 5, 5)).astype(np.float32),
        rng.normal(size=(3, 4)).astype(">f8"),
        np.asfortranarray(rng.normal(size=(7, 5))),
        np.array(3.5),
        np.zeros((0, 4), np.float32),
        np.array([True, False, True]),
        rng.integers(0, 9, size=(5,), dtype=np.int64),
        np.array(["a", "bc"]),
    ]


def test_npy_headers_reads_what_np_load_reads_and_refuses_what_it_refuses() -> None:
    """Every dtype, shape and memory order Flower's ``ndarray_to_bytes`` writes reads
    back as ``np.load`` reads it: the same values, dtype, shape, order, writable and
    its own memory, on first sight of a header and from memory after; a truncated
    tensor is refused as np.load refuses it, and a non-.npy one goes to np.load."""
    import numpy as np
    from flwr.compat.common import parameter

    assert pflower.patches.npy_headers()
    fast = parameter.bytes_to_ndarray
    flower = fast._pflower_flower
    for array in _npy_cases():
        data = parameter.ndarray_to_bytes(array)
        want = flower(data)
        for _ in range(2):  # first sight of the header, then from memory
            got = fast(data)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(got, want)
            assert got.flags.f_contiguous == want.flags.f_contiguous
            assert got.flags.c_contiguous == want.flags.c_contiguous
            assert got.flags.writeable and got.flags.owndata
    short = parameter.ndarray_to_bytes(_npy_cases()[0])[:-4]
    for read in (fast, flower):
        with pytest.raises(ValueError):
            read(short)
    with pytest.raises(ValueError):  # not .npy at all: np.load's own refusal
        fast(b"not a tensor")
    # a header claiming a negative dimension, the data padded to fit what frombuffer's
    # count of -1 ("all of it") would read: refused, as np.load refuses it
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"
    header += b" " * (63 - len(header)) + b"\n"
    crafted = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(32)
    for read in (flower, fast):
        with pytest.raises(ValueError, match="negative"):
            read(crafted)


def test_read_only_arrays_are_np_loads_values_on_the_received_bytes() -> None:
    """The streamed fold's decode: every dtype, shape and memory order reads back with
    np.load's values, dtype, shape and order, as a read-only view on the bytes (no
    copy: a write is refused); a non-.npy tensor goes to Flower's path, which refuses it."""
    import numpy as np
    from flwr.compat.common import parameter

    tensors = [parameter.ndarray_to_bytes(a) for a in _npy_cases()]
    for got, data in zip(pflower.patches.read_only_arrays(tensors), tensors, strict=True):
        want = np.load(io.BytesIO(data), allow_pickle=False)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
        assert got.flags.f_contiguous == want.flags.f_contiguous
        assert got.flags.c_contiguous == want.flags.c_contiguous
        assert not got.flags.writeable and not got.flags.owndata
        if got.size:
            with pytest.raises(ValueError, match="read-only"):
                got[(0,) * got.ndim] = 0
    with pytest.raises(ValueError):
        pflower.patches.read_only_arrays([b"not a tensor"])


def _linkstate_with_a_node() -> tuple[Any, Any, int, int]:
    """Flower's in-memory LinkState as the simulation makes it: (its factory, the
    state, one online node, one run)."""
    import secrets

    from flwr.common.constant import HEARTBEAT_INTERVAL_INF, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.federation.noop_federation_manager import NOOP_FEDERATION_ID

    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    state = factory.state()
    node = state.create_node(
        NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32), HEARTBEAT_INTERVAL_INF
    )
    state.acknowledge_node_heartbeat(node_id=node, heartbeat_interval=HEARTBEAT_INTERVAL_INF)
    run = state.create_run(None, None, None, {}, NOOP_FEDERATION_ID, None, NOOP_FLWR_AID, "x")
    return factory, state, node, run


def test_engine_wakeups_hand_an_instruction_to_the_backend_when_it_is_stored(
    monkeypatch,
) -> None:
    """The engine's loop (``vce_api.add_messages_to_queue``, as patched; its look
    60 s apart here) queues an instruction for the backend as soon as the ServerApp
    stores it, and queues what Flower's loop would: that message, once."""
    import queue
    import threading
    import time
    import uuid

    from flwr.common import Message, Metadata, RecordDict
    from flwr.common.constant import (
        SUPERLINK_NODE_ID,
    )
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    assert pflower.patches.linkstate_index() and pflower.patches.engine_wakeups()
    monkeypatch.setattr(pflower.patches.timing, "ENGINE_POLL", 60.0)
    _, state, node, run = _linkstate_with_a_node()

    def store() -> str:
        meta = Metadata(
            run, str(uuid.uuid4()), SUPERLINK_NODE_ID, node, "", "1", time.time(), 30, "train"
        )
        stored = InMemoryLinkState.store_message_ins(
            state, Message(metadata=meta, content=RecordDict())
        )
        assert stored is not None
        return stored

    handed: queue.Queue = queue.Queue()
    stop = threading.Event()
    loop = threading.Thread(
        target=vce_api.add_messages_to_queue, args=(state, handed, {node: 0}, stop), daemon=True
    )
    loop.start()
    time.sleep(0.3)  # the loop has looked, found nothing, and waits (60 s, unpatched)
    first = store()
    assert handed.get(timeout=20).metadata.message_id == first
    stop.set()
    store()  # wakes the loop, which sees the stop
    loop.join(timeout=20)
    assert not loop.is_alive() and handed.qsize() <= 1


def test_engine_wakeups_hand_the_server_grid_its_last_reply_when_it_is_stored(
    monkeypatch,
) -> None:
    """In simulation (Flower's in-memory grid) the ServerApp's reply collector, its
    look 60 s apart here, returns a reply as soon as the engine stores it."""
    import threading
    import time

    from flwr.common import Message, Metadata, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from server_app import grid as polling

    assert pflower.patches.linkstate_index() and pflower.patches.engine_wakeups()
    monkeypatch.setattr(polling, "FIRST_WAIT", 60.0)
    monkeypatch.setattr(polling, "LONGEST_WAIT", 60.0)
    factory, state, node, run = _linkstate_with_a_node()
    flower_grid = InMemoryGrid(factory)
    flower_grid.set_run(state.run_ids[run].run)  # as run_simulation gives it
    grid = polling.PollingGrid(flower_grid)

    def reply_later() -> None:
        found: list = []
        for _ in range(400):  # the instruction pushed (at once, unless the machine is busy)
            if found := state.get_message_ins(node_id=node, limit=1):
                break
            time.sleep(0.05)
        (instruction,) = found
        time.sleep(0.5)  # the collector has looked once, found nothing, and waits
        reply = Message(RecordDict(), reply_to=instruction)
        reply.metadata.__dict__["_message_id"] = reply.object_id  # as a ClientApp's reply
        assert state.store_message_res(reply)

    replier = threading.Thread(target=reply_later, daemon=True)
    replier.start()
    meta = Metadata(run, "", SUPERLINK_NODE_ID, node, "", "1", time.time(), 30, "train")
    message = Message(metadata=meta, content=RecordDict())
    started = time.monotonic()
    (reply,) = grid.send_and_receive([message], timeout=30)
    assert time.monotonic() - started < 10  # not the collector's 60 s look
    assert reply.metadata.reply_to_message_id == message.metadata.message_id
    replier.join(timeout=10)


def _bare_pool(actors: int):
    """A Flower ``BasicActorPool`` without Ray: ``actors`` stand-ins, each recording
    the calls made on it."""
    from types import SimpleNamespace

    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    made: list = []

    class Actor:  # hashable by identity, as Ray's actor handles are by actor id
        def __init__(self) -> None:
            calls: list = []
            made.append(calls)
            self.terminate = SimpleNamespace(remote=lambda: calls.append("terminate"))

    pool = BasicActorPool.__new__(BasicActorPool)  # its __init__ asks Ray for the cluster
    pool.pool, pool.num_actors, pool._future_to_actor = [], 0, {}
    pool.create_actor_fn = Actor
    pool.add_actors_to_pool(actors)
    return pool, made


def test_ray_app_once_stores_the_client_app_once_and_passes_its_reference(monkeypatch) -> None:
    """Each submission hands the actor the reference Ray resolves to the ClientApp's
    loader; the loader is stored once a pool (a new loader: stored again)."""
    import ray

    assert pflower.patches.ray_app_once()
    stored: list = []
    monkeypatch.setattr(ray, "put", lambda value: stored.append(value) or f"ref{len(stored)}")
    pool, _ = _bare_pool(2)
    handed = []

    def actor_fn(actor, app_fn, message, cid, context):
        handed.append((app_fn, message, cid, context))
        return object()  # the future

    def load_app() -> str:
        return "the app"

    for n in range(2):
        pool.add_actor_back_to_pool(pool.submit(actor_fn, (load_app, f"m{n}", str(n), "ctx")))
    assert stored == [load_app]  # once, the function itself
    assert handed == [("ref1", "m0", "0", "ctx"), ("ref1", "m1", "1", "ctx")]
    pool.submit(actor_fn, (lambda: "another", "m2", "2", "ctx"))
    assert len(stored) == 2 and handed[-1][0] == "ref2"


@pytest.mark.parametrize("how", ["functools.wraps", "__wrapped__ only"])
def test_a_wrapper_on_top_of_the_patched_submit_does_not_get_the_patches_applied_twice(
    monkeypatch, how: str
) -> None:
    """A second simulation in the process applies the Ray patches again, each once;
    a wrapper put on top since (a benchmark's marks, another tool's) must not hide
    them: twice applied, the inner ``ray-app-once`` put the outer one's reference
    into Ray's store and every client of the run failed."""
    import functools

    import ray
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    from pflower.patches import ray_app

    assert pflower.patches.ray_app_once()
    patched = BasicActorPool.submit

    def on_top(*args, **kwargs):
        return patched(*args, **kwargs)

    if how == "functools.wraps":
        on_top = functools.wraps(patched)(on_top)
    else:
        on_top.__wrapped__ = patched  # type: ignore[attr-defined]
    monkeypatch.setattr(BasicActorPool, "submit", on_top)
    assert ray_app.in_place() and pflower.patches.ray_app_once()
    assert BasicActorPool.submit is on_top  # not wrapped again

    def put(value):  # as Ray: a reference is refused
        if isinstance(value, str) and value.startswith("ref"):
            raise TypeError("Calling 'put' on an ray.ObjectRef is not allowed.")
        return "ref1"

    monkeypatch.setattr(ray, "put", put)
    pool, _ = _bare_pool(1)
    handed = []
    pool.submit(lambda actor, *job: handed.append(job) or object(), (print, "m", "0", "ctx"))
    assert handed == [("ref1", "m", "0", "ctx")]


def test_ray_weights_once_stores_a_rounds_weights_once_and_actors_get_them_whole(
    monkeypatch,
) -> None:
    """With a real local Ray: a large array sent in a second message is stored once and
    travels as its reference (the pickled message shrinks to its small parts); the
    actor receives arrays equal to those sent, fetches a stored one once, and a new
    round's arrays replace the last round's in the store."""
    import numpy as np
    import ray
    from flwr.app import Array, ArrayRecord, Message, Metadata, RecordDict

    from pflower.patches import ray_weights

    monkeypatch.setattr(ray_weights, "SENDER", ray_weights._Sender())
    monkeypatch.setattr(ray_weights, "_fetched", type(ray_weights._fetched)())
    put, puts = ray.put, []
    monkeypatch.setattr(ray, "put", lambda value: puts.append(value) or put(value))
    rng = np.random.default_rng(0)

    def weights() -> ArrayRecord:  # one large array (200 KB), one small
        big = rng.standard_normal(50_000).astype(np.float32)
        return ArrayRecord({"big": Array(big), "small": Array(np.arange(3.0))})

    def message(record: ArrayRecord, node: int) -> Message:
        meta = Metadata(1, "", 0, node, "", "1", 0.0, 60.0, "train")
        return Message(RecordDict({"w": record}), metadata=meta)

    @ray.remote
    class Echo:
        def __init__(self) -> None:
            self.kept: list[bytes] = []  # every large array received (ids stay unique)

        def run(self, msg: Message) -> tuple[int, bytes, bytes]:
            record = msg.content.array_records["w"]
            big = record["big"].data
            same = [n for n, kept in enumerate(self.kept) if kept is big]
            self.kept.append(big)
            return (same or [-1])[0], big, record["small"].data

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        ray_weights.register()
        actor = Echo.remote()
        round_one, round_two = weights(), weights()
        seen, sizes = [], []
        for n, record in enumerate([round_one] * 3 + [round_two] * 2):
            msg = message(record, n)
            ray_weights.SENDER.sending(msg)
            sizes.append(len(ray.cloudpickle.dumps(msg)))
            same_as, big, small = ray.get(actor.run.remote(msg))
            assert big == record["big"].data and small == record["small"].data
            seen.append(same_as)
        big_one, big_two = round_one["big"].data, round_two["big"].data
        assert puts == [big_one, big_two]  # each round's large array stored once
        assert sizes[0] > 200_000 and sizes[3] > 200_000  # first sent: inside the message
        assert max(sizes[1:3] + sizes[4:]) < ray_weights.MIN_BYTES  # then its reference
        assert seen == [-1, -1, 1, -1, -1]  # a stored array fetched once an actor
        stored = [d for d, _ in ray_weights.SENDER.stored.values()]
        assert stored == [big_two]  # round one's reference dropped
    finally:
        ray.util.deregister_serializer(Array)
        ray.shutdown()


def test_ray_two_in_flight_lists_each_actor_twice_and_runs_a_worker_per_listing() -> None:
    """Every actor is listed ``IN_FLIGHT`` times, the first listings handed out first
    (a round's first messages go to different actors); the engine runs a worker per
    listing; each actor is terminated once."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    assert pflower.patches.ray_two_in_flight()
    assert pflower.patches.IN_FLIGHT == 2
    pool, made = _bare_pool(3)
    assert pool.num_actors == 3 and len(pool.pool) == 6
    handed = [pool.pool.pop() for _ in range(6)]
    assert len({id(a) for a in handed[:3]}) == 3 and handed[3:] == handed[:3]
    pool.pool = handed
    backend = RayBackend.__new__(RayBackend)  # its __init__ starts Ray
    backend.pool = pool
    assert backend.num_workers == 6
    pool.terminate_all_actors()
    assert made == [["terminate"]] * 3


def test_site_checks_wrap_flowers_clientapp_steps_and_stay_on_with_the_switch(
    monkeypatch,
) -> None:
    """``clientapp-site-checks``: the site's hooks run around Flower's own input,
    install and push steps; a hook that raises stops the install before Flower's runs.
    A site's security, so the speed switch leaves it on; on a Flower it was not
    checked against it refuses in one line."""
    from flwr.supernode.runtime import run_clientapp as runner

    calls: list[Any] = []
    for name in ("pull_task_input", "install_from_fab", "push_message"):
        monkeypatch.setattr(runner, name, getattr(runner, name))  # restored after the test
    monkeypatch.setattr(runner, "pull_task_input", lambda client: ("msg", "ctx", "run", "fab"))
    monkeypatch.setattr(
        runner, "install_from_fab", lambda content, **kw: calls.append(("flower", content))
    )
    monkeypatch.setattr(runner, "push_message", lambda c, m, ctx: calls.append(("push", m)))

    def installing(content: bytes) -> None:
        if content == b"bad":
            raise PermissionError("refused")
        calls.append(("check", content))

    monkeypatch.setenv("PFLOWER_FLOWER_PATCHES", "0")
    pflower.patches.clientapp_site_checks(
        lambda m, c: calls.append(("pulled", m, c)), installing, lambda r: f"{r}, recorded"
    )
    assert runner.pull_task_input(None) == ("msg", "ctx", "run", "fab")
    runner.install_from_fab(b"app", skip_prompt=True)
    with pytest.raises(PermissionError):
        runner.install_from_fab(b"bad", skip_prompt=True)
    runner.push_message(None, "reply", None)
    assert calls == [
        ("pulled", "msg", "ctx"),
        ("check", b"app"),
        ("flower", b"app"),
        ("push", "reply, recorded"),
    ]
    monkeypatch.setattr(pflower.patches.core, "installed", lambda lib: "9.9.9")
    with pytest.raises(pflower.patches.UntestedVersion, match="clientapp-site-checks") as err:
        pflower.patches.clientapp_site_checks(print, print, print)
    assert "\n" not in str(err.value) and "flwr 9.9.9" in str(err.value)


def test_reply_downloads_apart_reads_the_deployed_grids_client_and_has_an_off_switch(
    monkeypatch,
) -> None:
    """``reply-downloads-apart``: the deployed grid's Runtime API client with the patch
    on; none with it off, when Flower's own pull brings the replies whole (and
    unpacked). Whether a grid is the deployed one holds either way."""
    from flwr.app import ConfigRecord, Message, Metadata, RecordDict
    from flwr.supercore.run import Run
    from flwr.superlink.grid.http_grid import HttpGrid

    from pflower.packing import pack
    from server_app.grid import PollingGrid

    http = HttpGrid(token="t")
    http.set_run(Run.create_empty(7))
    http._client = runtime = object()  # connected (the property connects otherwise)
    assert pflower.patches.deployed_grid(http) and not pflower.patches.deployed_grid(object())
    assert pflower.patches.runtime_client(http) is runtime
    monkeypatch.setenv("PFLOWER_FLOWER_PATCHES", "0")
    assert pflower.patches.runtime_client(http) is None and pflower.patches.deployed_grid(http)

    meta = Metadata(7, "", 1, 1, "m-1", "g", 0.0, 60.0, "train")
    reply = Message(pack(RecordDict({"r": ConfigRecord({"n": 1})})), metadata=meta)
    pulled: list[list[str]] = []
    http.push_messages = lambda messages: list(messages)  # the ids, as pushed
    http.pull_messages = lambda ids: pulled.append(list(ids)) or [reply]
    grid = PollingGrid(http)
    assert grid.deployed()  # what site_info asks
    (got,) = grid.send_and_receive(["m-1"], timeout=10)
    assert pulled == [["m-1"]] and got.content["r"]["n"] == 1  # Flower's pull, unpacked


def test_hooks_left_sees_each_kind_of_hook_and_counts_every_model_hooked_when_off(
    monkeypatch,
) -> None:
    """``resident-model-hooks``: a forward, forward-pre, module backward or parameter
    hook left on a model is seen, and a removed one is not; with the patches off
    nothing is read and every model counts as hooked (a fresh copy each client)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert not pflower.patches.hooks_left(model)
    for register in (
        lambda: model[0].register_forward_hook(lambda *a: None),
        lambda: model[1].register_forward_pre_hook(lambda *a: None),
        lambda: model[0].register_full_backward_hook(lambda *a: None),
        lambda: model[0].weight.register_hook(lambda g: g),
    ):
        handle = register()
        assert pflower.patches.hooks_left(model)
        handle.remove()
        assert not pflower.patches.hooks_left(model)
    monkeypatch.setenv("PFLOWER_FLOWER_PATCHES", "0")
    assert pflower.patches.hooks_left(model)
