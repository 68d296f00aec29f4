"""Every Flower or torch internal the product patches, in one module.

Each patch replaces a private function or default of one library version, for a
speed measured in docs/PERFORMANCE.md; none changes what is computed or sent.

| patch | what it replaces | why | checked against |
|---|---|---|---|
| ``linkstate-index`` | flwr ``InMemoryLinkState.store_message_ins`` / ``get_message_ins``, ``vce_api.add_messages_to_queue`` | the simulation engine scanned every stored message for every node ten times a second (N^2 per round) | flwr 1.39.0 |
| ``supernode-backoff`` | flwr ``start_client_internal``'s ``time`` and ``_pull_and_store_message`` | a SuperNode slept 3 s between empty pulls | flwr 1.39.0 |
| ``fleet-long-poll`` | flwr ``message_handler.pull_messages`` (the SuperLink's Fleet ``PullMessages``), ``InMemoryLinkState`` / ``SqlLinkState.store_message_ins`` | a site learnt of its next message at its next poll, 0.4-0.7 s a message in a deployed round | flwr 1.39.0 |
| ``object-retries`` | the ``initial_backoff``, ``backoff_cap`` and ``max_tries_per_object`` defaults of flwr's ``pull_objects`` / ``pull_and_inflate_object_from_tree`` | a message part not there yet was asked for again after 1 s, then up to 10 s apart | flwr 1.39.0 |
| ``fab-reuse`` | flwr ``run_clientapp.install_from_fab`` | a ClientApp unpacked and hashed the whole FAB on every message, then used the copy installed before | flwr 1.39.0 |
| ``superexec-fork`` | flwr ``run_superexec.get_executor`` | a ClientApp started a fresh Python per message | flwr 1.39.0 |
| ``clientapp-task-end`` | flwr ``run_clientapp.flwr_exit``, in a warm SuperExec's worker | a ClientApp process exited after each message: the app imported, its config read and its model built again for the next | flwr 1.39.0 |
| ``optimizers-without-dynamo`` | the ``torch._dynamo`` wrappers of ``torch.optim.SGD`` / ``Adam`` | torch imported ``torch._dynamo`` on an optimizer's first use: 2-5 s per process | torch 2.13, 2.14 |
| ``secagg-masks`` | flwr ``pseudo_rand_gen`` where SecAgg+ masks (client mod, server workflow) | it folds every seed to 32 bits and expands it with a Mersenne Twister (flwr issue #7522) | flwr 1.39.0 |

``PFLOWER_FLOWER_PATCHES=0`` turns every speed patch off: Flower and torch run as
they are (slower, nothing else changes). ``secagg-masks`` is a security fix, not a
speed-up, and stays on: its protocol version travels in the SecAgg+ set-up, and
a peer that speaks another refuses the round in one line. With patches on, ``check()`` refuses a Flower
or torch version the table does not list, in one line that names the switch.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
import time
import tomllib
import zipfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

log = logging.getLogger("flwr.pflower")

SWITCH = "PFLOWER_FLOWER_PATCHES"
# library -> the version prefixes every patch of it was checked against
TESTED: dict[str, tuple[str, ...]] = {"flwr": ("1.39.",), "torch": ("2.13.", "2.14.")}
PATCHES: dict[str, str] = {  # patch -> the library it patches
    "linkstate-index": "flwr",
    "supernode-backoff": "flwr",
    "fleet-long-poll": "flwr",
    "object-retries": "flwr",
    "fab-reuse": "flwr",
    "superexec-fork": "flwr",
    "clientapp-task-end": "flwr",
    "optimizers-without-dynamo": "torch",
    "secagg-masks": "flwr",
}


class UntestedVersion(RuntimeError):
    """A library version the patches were not checked against (the message is one line)."""


def enabled() -> bool:
    """Whether the patches are on (``PFLOWER_FLOWER_PATCHES`` is not 0)."""
    return os.environ.get(SWITCH, "1") != "0"


def check(libraries: tuple[str, ...] = ("flwr", "torch")) -> None:
    """Refuse, in one line, an installed version of ``libraries`` that the patches
    were not checked against (nothing to check with the patches off)."""
    if not enabled():
        return
    for library in libraries:
        try:
            installed = version(library)
        except PackageNotFoundError:
            continue
        if not installed.startswith(TESTED[library]):
            names = ", ".join(p for p, lib in PATCHES.items() if lib == library)
            raise UntestedVersion(
                f"{library} {installed} is not a version the project's patches of it ({names}) "
                f"were checked against ({', '.join(TESTED[library])}x; pflower.patches): install "
                f"one of those, or set {SWITCH}=0 to run without the patches"
            )


# ---- flwr: the simulation engine's message lookups ------------------------------------------


def _index(state: Any) -> dict[int, list[str]]:
    """The LinkState's undelivered message ids by destination node (built on first use)."""
    index = state.__dict__.get("_pflower_by_node")
    if index is None:
        index = {}
        for message_id, message in state.message_ins_store.items():
            index.setdefault(message.metadata.dst_node_id, []).append(message_id)
        state.__dict__["_pflower_by_node"] = index
    return index


def linkstate_index() -> bool:
    """``linkstate-index``: Flower's in-memory LinkState keeps, per destination node,
    the ids of the messages stored for it (added where Flower stores one, pruned when
    read), so a node's lookup checks only its own messages, in the same order, with
    the same checks and side effects as Flower's; and the engine's loop asks only
    the nodes that have messages (Flower's asks all N, ten times a second). Applied
    where the ServerApp is imported (the simulation runs the engine in that
    process). Returns whether it is in place."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.date import now

    if getattr(InMemoryLinkState, "_pflower_indexed", False):
        return True
    if not enabled():
        return False
    check(("flwr",))
    store = InMemoryLinkState.store_message_ins

    def store_message_ins(self: Any, message: Any) -> str | None:
        message_id = store(self, message)
        if message_id is not None:
            with self.lock:
                ids = _index(self).setdefault(message.metadata.dst_node_id, [])
                if message_id not in ids:
                    ids.append(message_id)
        return message_id

    def get_message_ins(
        self: Any, node_id: int, limit: int | None, *, run_id: int | None = None
    ) -> list[Any]:
        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")
        found: list[Any] = []
        with self.lock:
            ids = _index(self).get(node_id, [])
            for message_id in list(ids):
                self._check_stored_messages({message_id})  # Flower's expiry checks
                message = self.message_ins_store.get(message_id)
                if message is None:  # deleted (replied to, expired): forget it
                    ids.remove(message_id)
                    continue
                if (
                    message.metadata.dst_node_id == node_id
                    and (run_id is None or message.metadata.run_id == run_id)
                    and message.metadata.delivered_at == ""
                ):
                    found.append(message)
                if limit and len(found) == limit:
                    break
        delivered_at = now().isoformat()
        for message in found:
            message.metadata.delivered_at = delivered_at
        return found

    def add_messages_to_queue(
        state: Any, queue: Any, nodes_mapping: Any, f_stop: threading.Event
    ) -> None:
        """Flower's loop, asking only the nodes that have messages stored for them."""
        while not f_stop.is_set():
            if isinstance(state, InMemoryLinkState):
                with state.lock:
                    nodes = [n for n, ids in _index(state).items() if ids and n in nodes_mapping]
            else:
                nodes = list(nodes_mapping.keys())
            for node_id in nodes:
                for message in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(message)
            f_stop.wait(0.1)

    # Flower's own two, for a side-by-side check (tests/test_scale.py)
    InMemoryLinkState._pflower_flower = {"store": store, "get": InMemoryLinkState.get_message_ins}
    InMemoryLinkState.store_message_ins = store_message_ins
    InMemoryLinkState.get_message_ins = get_message_ins
    InMemoryLinkState._pflower_indexed = True
    vce_api.add_messages_to_queue = add_messages_to_queue  # read when the engine starts
    return True


# ---- flwr: a SuperNode's idle poll, the SuperLink's long poll, a message part's first retry ----------------------------

FIRST_WAIT, GROWTH = 0.1, 1.5
FLOWER_IDLE_WAIT = 3.0  # start_client_internal's sleep when no message came
LOCAL_WAIT = 0.02  # in place of its 0.5 s polls of the node's own state
FIRST_OBJECT_RETRY = 0.05  # Flower's first retry of a missing object: 1 s
OBJECT_RETRY_CAP = 0.1  # Flower's longest wait between retries: 10 s
OBJECT_PATIENCE = 250.0  # about how long a missing part is asked for before the pull fails
LONG_POLL = 2.0  # how long a patched SuperLink holds a SuperNode's empty pull open
LONG_POLLS_HELD = 100  # at most this many at once (of Flower's 1,000 Fleet threads)
HELD_PULL = 0.5 * LONG_POLL  # an empty pull this long was held open


class IdleBackoff:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: the idle
    sleep starts at 0.1 s after each message and grows 1.5 times per empty pull up
    to Flower's 3 s, and is skipped after a pull the SuperLink held open (its
    ``fleet-long-poll``); its 0.5 s waits for a local ClientApp's reply, and for each
    of its parts, become 0.02 s (a lookup in the node's own state)."""

    def __init__(self) -> None:
        self.wait = FIRST_WAIT
        self.held = False  # the last empty pull was held open: ask again at once

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def message_arrived(self) -> None:
        self.wait = FIRST_WAIT

    def pulled(self, message: bool, seconds: float) -> None:
        """After each pull: whether it brought a message, how long it took."""
        if message:
            self.message_arrived()
        self.held = not message and seconds >= HELD_PULL

    def sleep(self, seconds: float) -> None:
        if seconds >= FLOWER_IDLE_WAIT:  # idle: back off towards Flower's pace
            if self.held:  # the SuperLink already waited for us
                self.held = False
                return
            time.sleep(self.wait)
            self.wait = min(FLOWER_IDLE_WAIT, self.wait * GROWTH)
        else:
            time.sleep(min(seconds, LOCAL_WAIT))


def supernode_backoff() -> IdleBackoff | None:
    """``supernode-backoff``: Flower's SuperNode loop (``start_client_internal``) with
    the idle poll of ``IdleBackoff``; None with the patches off."""
    if not enabled():
        return None
    check(("flwr",))
    import flwr.supernode.start_client_internal as loop

    backoff = IdleBackoff()
    pull = loop._pull_and_store_message

    def pull_and_reset(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        run_id = pull(*args, **kwargs)
        backoff.pulled(run_id is not None, time.monotonic() - start)
        return run_id

    loop.time = backoff  # type: ignore[assignment]
    loop._pull_and_store_message = pull_and_reset
    return backoff


def fleet_long_poll() -> bool:
    """``fleet-long-poll``, in the SuperLink: a SuperNode's pull that finds no
    message is held open up to ``LONG_POLL`` s and made again as soon as a message
    is stored for that node, so a site learns of its next message at once, not at
    its next poll. At most ``LONG_POLLS_HELD`` pulls are held;
    beyond that a pull is answered at once, as Flower does. A SuperNode with
    ``supernode-backoff`` asks again at once after a held pull; an unpatched one
    sleeps as it always does."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.server.superlink.fleet.message_handler import message_handler
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    stored = threading.Condition()
    count: dict[int, int] = {}  # node id -> messages stored for it so far
    held = threading.BoundedSemaphore(LONG_POLLS_HELD)

    def storing(store: Callable[..., Any]) -> Callable[..., Any]:
        def store_message_ins(self: Any, message: Any) -> Any:
            out = store(self, message)
            node = message.metadata.dst_node_id
            with stored:
                count[node] = count.get(node, 0) + 1
                stored.notify_all()
            return out

        return store_message_ins

    for state in (InMemoryLinkState, SqlLinkState):
        state.store_message_ins = storing(state.store_message_ins)  # type: ignore[method-assign]
    pull = message_handler.pull_messages

    def pull_messages(request: Any, state: Any, store: Any) -> Any:
        if not held.acquire(blocking=False):
            return pull(request, state, store)
        try:
            node, deadline = request.node.node_id, time.monotonic() + LONG_POLL
            while True:
                with stored:
                    seen = count.get(node, 0)
                response = pull(request, state, store)
                left = deadline - time.monotonic()
                if response.messages_list or left <= 0:
                    return response
                with stored:  # woken by any node's message; pulls again only on its own
                    stored.wait_for(lambda s=seen: count.get(node, 0) != s, timeout=left)
        finally:
            held.release()

    message_handler.pull_messages = pull_messages
    return True


def object_retries() -> bool:
    """``object-retries``: a message part that is not there yet is asked for again
    after 0.05 s, doubling up to 0.1 s, not after 1 s up to 10 s, and as many more
    times that a part is still waited for about 250 s, as with a 0.5 s cap (a
    reply's download waited up to 0.4 s past its last part's upload). A receiver learns
    of a message before its parts have all arrived (a warm ClientApp, a SuperNode
    while the ServerApp still uploads, the ServerApp while a site still uploads its
    reply), and each wait past the arrival is time the round waits."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.supercore.inflatable import inflatable_utils as objects

    for fn in (objects.pull_objects, objects.pull_and_inflate_object_from_tree):
        if "initial_backoff" not in (fn.__kwdefaults__ or {}):  # not flwr 1.39's signature
            raise UntestedVersion(f"flwr's {fn.__name__} takes no initial_backoff")
        fn.__kwdefaults__["initial_backoff"] = FIRST_OBJECT_RETRY
        fn.__kwdefaults__["backoff_cap"] = OBJECT_RETRY_CAP
        fn.__kwdefaults__["max_tries_per_object"] = int(OBJECT_PATIENCE / OBJECT_RETRY_CAP)
    return True


def installed_fab(content: bytes, install_dir: Path | None = None) -> Path | None:
    """The directory where Flower installed this exact FAB before, named as Flower
    names it (publisher, name, version from its pyproject.toml; its hash), or None."""
    from flwr.common.config import get_metadata_from_config
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    try:
        with zipfile.ZipFile(io.BytesIO(content)) as fab:
            fab_id, fab_version = get_metadata_from_config(
                tomllib.loads(fab.read("pyproject.toml").decode())
            )
    except (KeyError, ValueError, zipfile.BadZipFile, tomllib.TOMLDecodeError):
        return None  # not a FAB Flower would install: its own install_from_fab says why
    publisher, name = fab_id.split("/", 1)
    digest = hashlib.sha256(content).hexdigest()[:FAB_HASH_TRUNCATION]
    base = install_dir.expanduser() if install_dir else get_flwr_home()
    path = base / APP_DIR / f"{publisher}.{name}.{fab_version}.{digest}"
    return path if path.is_dir() else None


def fab_reuse() -> bool:
    """``fab-reuse``: a ClientApp whose FAB is installed already does not unpack it
    again. Flower's ``install_from_fab`` unpacks every file of the FAB into a temporary
    directory and checks their hashes on every message, then, finding the directory of
    that FAB's hash installed, returns it untouched (0.6 s of a warm cifar-cnn4
    message). Here that directory is looked up first; the first message of a FAB
    installs it as Flower does."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.supernode.runtime import run_clientapp as runner

    unpack = runner.install_from_fab

    def install_from_fab(
        fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False
    ) -> Path:
        if skip_prompt and isinstance(fab_file, bytes):  # Flower returns it without a prompt
            if (path := installed_fab(fab_file, install_dir)) is not None:
                return path
        return unpack(fab_file, install_dir, skip_prompt)

    runner.install_from_fab = install_from_fab
    return True


class TaskEnded(Exception):
    """A ClientApp task ended with Flower's exit ``code``, and the process goes on."""

    def __init__(self, code: int) -> None:
        super().__init__(f"ClientApp task ended with exit code {code}")
        self.code = code


def clientapp_task_end() -> bool:
    """``clientapp-task-end``, in a warm SuperExec's worker (deploy/warm_superexec.py):
    Flower's ClientApp runner ends each task with ``flwr_exit``, which runs the task's
    exit handlers (its status and context to the SuperNode, its heartbeat stopped, its
    connection closed), then exits the process, from a thread after 5 s if need be.
    Here it runs the same handlers and raises ``TaskEnded``: the worker that imported
    the app and built its model serves the app's next task."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.supercore.exit.exit_handler import trigger_exit_handlers
    from flwr.supernode.runtime import run_clientapp as runner

    def task_end(code: int, *args: Any, **kwargs: Any) -> None:
        trigger_exit_handlers(run_before_force_exit=True)
        trigger_exit_handlers(run_before_force_exit=False)
        raise TaskEnded(code)

    runner.flwr_exit = task_end
    return True


def superexec_fork(executor: Callable[..., Any]) -> None:
    """``superexec-fork``: Flower's SuperExec looks its executor up by this name; the
    warm SuperExec's forking one in its place (deploy/warm_superexec.py). Not a
    speed-up that can be left out: the warm SuperExec is this patch."""
    check(("flwr",))
    import flwr.supercore.superexec.run_superexec as superexec

    superexec.get_executor = executor


# ---- torch: optimizers without torch._dynamo ------------------------------------------------


def optimizers() -> tuple[type, type]:
    """``optimizers-without-dynamo``: (SGD, Adam). torch.optim imports torch._dynamo on
    an optimizer's first use: its methods are wrapped by
    ``torch._compile._disable_dynamo`` (imports on first call) and ``step()`` by a
    graph-break wrapper (imports on every call). That is 2-5 s in every new process,
    and a deployed ClientApp is a new process per message. Nothing here is compiled,
    so these two skip the wrappers and do exactly what they do outside compilation
    (tests/test_client_start.py: bit-identical updates, no torch._dynamo import).
    With the patches off, torch's own classes."""
    import torch

    if not enabled():
        return torch.optim.SGD, torch.optim.Adam
    check(("torch",))

    def undecorated(fn: Callable[..., Any]) -> Callable[..., Any]:
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        return fn

    def without_graph_break(base: type) -> type:
        raw_step = undecorated(base.step)

        def step(self: Any, closure: Callable[[], float] | None = None) -> Any:
            with torch.set_grad_enabled(self.defaults["differentiable"]):
                return raw_step(self, closure)

        return type(base.__name__, (base,), {"step": step, "__module__": __name__})

    # pre-fill the cache _disable_dynamo's wrapper fills on its first call
    inner_code = torch._compile._disable_dynamo(lambda: None).__code__
    for cls in (torch.optim.Optimizer, torch.optim.SGD, torch.optim.Adam):
        for attr in vars(cls).values():
            fn = getattr(attr, "__wrapped__", None)
            if getattr(attr, "__code__", None) is inner_code and fn is not None:
                setattr(fn, "__dynamo_disable", fn)
    return without_graph_break(torch.optim.SGD), without_graph_break(torch.optim.Adam)


# ---- flwr: SecAgg+ masks from a cryptographic PRF -------------------------------------------

# The SecAgg+ protocol this build speaks: carried in the set-up stage's config, so a
# peer with Flower's own masks (or another version) refuses the round instead of
# unmasking garbage. Bump it with any change to the masks or the key signatures.
SECAGG_PROTOCOL = "pflower-secagg+/aes256ctr-masks/signed-keys/1"


def mask_arrays(seed: bytes, num_range: int, shapes: list[tuple[int, ...]]) -> list[Any]:
    """SecAgg+ masks: int64 arrays of ``shapes``, uniform over [0, num_range).

    AES-256 in counter mode (``cryptography``, as Flower's own SecAgg+ uses) keyed by
    SHA-256 of the whole seed: the keystream is a PRF of all of the seed's bits
    (Flower's ``pseudo_rand_gen`` kept 32 of them). Each value is 8 keystream bytes
    reduced mod ``num_range``: exact for a power of two (Flower's default 2**32),
    otherwise biased by less than num_range / 2**64. Flower draws from
    [0, num_range - 1); this draws from [0, num_range): uniform over the modulus."""
    import hashlib

    import numpy as np
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if num_range < 2:
        raise ValueError(f"SecAgg+ modulus {num_range} is below 2")
    sizes = [int(np.prod(shape)) for shape in shapes]
    key = hashlib.sha256(b"pflower-secagg-mask\x00" + seed).digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    words = np.frombuffer(stream.update(bytes(8 * sum(sizes))), dtype="<u8")
    if num_range & (num_range - 1) == 0:
        values = (words & np.uint64(num_range - 1)).astype(np.int64)
    else:
        values = (words % np.uint64(num_range)).astype(np.int64)
    out, start = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        out.append(values[start : start + size].reshape(shape))
        start += size
    return out


def secagg_masks() -> bool:
    """``secagg-masks``: Flower's SecAgg+ client mod and server workflow draw their
    masks from ``mask_arrays`` (both import ``pseudo_rand_gen`` by name, so both
    names are replaced). Applied in every process that masks or unmasks, whatever
    the patch switch says. Returns whether it is in place."""
    from importlib import import_module

    # by full name: each package re-exports a function of the same name as its module
    client = import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    utils = import_module("flwr.common.secure_aggregation.secaggplus_utils")
    server = import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow")

    if getattr(utils, "_pflower_masks", False):
        return True
    installed = version("flwr")
    if not installed.startswith(TESTED["flwr"]):
        raise UntestedVersion(
            f"flwr {installed}: the SecAgg+ mask patch (pflower.patches.secagg_masks) was checked "
            f"against flwr {', '.join(TESTED['flwr'])}x only; secure aggregation refuses to run"
        )
    utils._flower_pseudo_rand_gen = utils.pseudo_rand_gen  # kept for the benchmark
    for module in (utils, client, server):
        module.pseudo_rand_gen = mask_arrays
    utils._pflower_masks = True
    return True
