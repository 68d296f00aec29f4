"""A ClientApp message's fixed cost: the optimizers that skip torch._dynamo, and the
per-message phase log (client_app/timing.py) and the server's phases."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from client_app import timing
from client_app.train import SGD, Adam
from methods import parse_run_config
from pflower.engine.inprocess import run_inprocess


def _train(opt_cls: type, **kw) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    opt = opt_cls(model.parameters(), **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "ours, theirs, kw",
    [
        (SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
        (SGD, torch.optim.SGD, {"lr": 0.05}),
        (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 1e-4}),
    ],
)
def test_the_optimizers_update_exactly_as_torch_optim(ours, theirs, kw):
    for a, b in zip(_train(ours, **kw), _train(theirs, **kw)):
        assert torch.equal(a, b)


def test_a_fresh_process_trains_without_importing_torch_dynamo():
    code = (
        "import sys, torch\n"
        "from client_app.train import make_optimizer\n"
        "from methods import parse_run_config\n"
        "for opt in ('sgd', 'adam'):\n"
        "    m = torch.nn.Linear(4, 2)\n"
        "    o = make_optimizer(list(m.parameters()), parse_run_config({'optimizer': opt}))\n"
        "    m(torch.randn(3, 4)).sum().backward(); o.step(); o.zero_grad()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_message_logs_its_phases_and_the_server_records_its_own(tmp_path, caplog):
    cfg = {
        "method": "fedper",
        "dataset": "synthetic",
        "sim-samples": 40,
        "num-server-rounds": 2,
        "log-phases": True,
        "output-dir": str(tmp_path),
        "run-name": "phases",
    }
    parse_run_config(cfg)
    with caplog.at_level("INFO", logger="flwr.pflower"):
        res = run_inprocess(cfg, 2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(timing.PREFIX)]
    assert len(lines) == 2 * 2 + 2  # a fit per client and round, then the closing evaluate
    fit = json.loads(lines[-3][len(timing.PREFIX) :])
    # in-process, the process predates the message: the phases start at "queued"
    expected = ["queued", "config", "model", "data", "personal state", "evaluate", "train"]
    assert list(fit)[: len(expected)] == expected and "store + upload" in fit
    assert all(v >= 0 for v in fit.values())
    for record in res["rounds"]:
        server = record["server_seconds"]
        assert list(server) == ["configure", "waiting for clients", "aggregate"]
        # each phase is rounded to 0.1 ms (recording.py): three roundings' worth of slack
        assert sum(server.values()) <= record["seconds"] + 3 * 0.5e-4


def test_the_last_round_ends_where_the_closing_evaluation_begins(tmp_path, monkeypatch):
    """With eval-in-fit a round ends where the next begins; the last one ends where the
    closing evaluation begins, and that evaluation is timed on its own (it used to
    land in the last round's seconds, which the benchmarks' medians count)."""
    from types import SimpleNamespace

    from strategies import base, recording

    # the strategy's round clock stands still but for the closing evaluation's 2 s
    clock = [100.0]
    frozen = SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(base, "time", frozen)
    monkeypatch.setattr(recording, "time", frozen)
    init = recording.RoundLog.__init__

    def started_now(self, *args, **kwargs) -> None:  # its default start is the real clock
        init(self, *args, **kwargs)
        self.started = clock[0]

    monkeypatch.setattr(recording.RoundLog, "__init__", started_now)
    accept, slow = base.accept_evaluations, 2.0

    def slow_closing(*args, **kwargs):  # only the closing evaluation goes through here
        clock[0] += slow
        return accept(*args, **kwargs)

    monkeypatch.setattr(base, "accept_evaluations", slow_closing)
    cfg = {
        "method": "fedper",
        "dataset": "synthetic",
        "sim-samples": 40,
        "num-server-rounds": 3,
        "output-dir": str(tmp_path),
        "run-name": "closing",
    }
    assert parse_run_config(cfg).eval_in_fit
    rounds = run_inprocess(cfg, 2)["rounds"]
    assert [("closing_evaluation_seconds" in r) for r in rounds] == [False, False, True]
    assert rounds[-1]["closing_evaluation_seconds"] == slow
    assert [r["seconds"] for r in rounds] == [0.0, 0.0, 0.0]  # none holds the closing 2 s


class _FakeGrid:
    """Replies to each message ``delay`` pulls after it was pushed."""

    def __init__(self, delay: int) -> None:
        self.delay, self.pulls, self.asked, self.pushed_at = delay, 0, [], {}
        self.fail = False

    def push_messages(self, messages):
        ids = [f"m{len(self.pushed_at) + i}" for i, _ in enumerate(messages)]
        self.pushed_at.update({i: self.pulls for i in ids})
        return ids

    def pull_messages(self, ids):
        from types import SimpleNamespace

        if self.fail:
            raise ConnectionError("superlink gone")
        self.pulls += 1
        self.asked.append(set(ids))
        ready = [i for i in ids if self.pulls - self.pushed_at[i] > self.delay]
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ready]

    def get_node_ids(self):
        return [1, 2]


class _Unstored(_FakeGrid):
    """Stores nothing: every pushed message's id is None."""

    def __init__(self) -> None:
        super().__init__(delay=0)

    def push_messages(self, messages):
        return [None for _ in messages]


def test_the_server_grid_collects_every_clients_reply_in_one_poll():
    from concurrent.futures import ThreadPoolExecutor

    from server_app import grid as polling

    slept = []  # this grid's pauses alone (other threads sleep as ever)
    fake = _FakeGrid(delay=12)
    grid = polling.PollingGrid(fake)
    grid.pause = lambda s: slept.append(s) or time.sleep(0.001)
    # the legacy round loop: one send_and_receive per client, each from its own thread
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(grid.send_and_receive, [c], timeout=30) for c in "abcd"]
        replies = [r.metadata.reply_to_message_id for c in calls for r in c.result()]
    assert sorted(replies) == ["m0", "m1", "m2", "m3"]  # each caller got its own reply
    assert max(len(ids) for ids in fake.asked) == 4  # one pull asked for every client's
    assert fake.pulls < 4 * 13  # a poll per client would make 13 pulls each
    assert slept[0] == polling.FIRST_WAIT and max(slept) == polling.LONGEST_WAIT
    assert max(slept) < 3  # Flower's HttpGrid sleeps 3 s after every empty pull
    assert list(grid.get_node_ids()) == [1, 2]  # everything else is the wrapped grid's
    # nothing came in time: the caller gets what came (nothing) when its timeout ends
    assert (
        list(polling.PollingGrid(_FakeGrid(delay=10**9)).send_and_receive(["x"], timeout=0.2)) == []
    )
    # a message the SuperLink did not store (Flower's HttpGrid returns None for it) is
    # not awaited: the caller gets the replies to the others, and the collector never
    # asks for None
    partial = _FakeGrid(delay=1)
    partial.push_messages = lambda messages: [None, *_FakeGrid.push_messages(partial, messages[1:])]
    replies = polling.PollingGrid(partial).send_and_receive(["lost", "kept"], timeout=30)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert partial.asked and all(None not in ids for ids in partial.asked)
    assert list(polling.PollingGrid(_Unstored()).send_and_receive(["x"], timeout=None)) == []
    # a failed pull reaches the caller, as Flower's own send_and_receive would raise it
    fake.fail = True
    with pytest.raises(ConnectionError, match="superlink gone"):
        grid.send_and_receive(["e"], timeout=30)


class _NodesRuntime:
    """A Runtime API that answers GetNodes with the node ids it holds, counting asks."""

    def __init__(self) -> None:
        self.node_ids, self.asked = [1, 2], 0

    def GetNodes(self, request):  # noqa: N802 - Flower's RPC name
        from flwr.proto.node_pb2 import NodeInfo
        from flwr.proto.runtime_pb2 import GetNodesResponse

        self.asked += 1
        return GetNodesResponse(nodes=[NodeInfo(node_id=i) for i in self.node_ids])


def test_a_deployed_node_list_is_asked_for_once_a_second_at_most():
    """Flower's legacy loop asks the grid for the node ids before every client-manager
    call (about 7 a round, each a request to the SuperLink). The deployed grid reuses
    the list for NODE_LIST_SECONDS; a node that joins is seen after that."""
    from flwr.supercore.run import Run
    from flwr.superlink.grid.http_grid import HttpGrid

    from server_app import grid as polling

    now = [100.0]
    http = HttpGrid(token="t")
    http.set_run(Run.create_empty(7))
    http._client = runtime = _NodesRuntime()
    grid = polling.PollingGrid(http)
    grid.clock = lambda: now[0]
    assert [list(grid.get_node_ids()) for _ in range(7)] == [[1, 2]] * 7
    assert runtime.asked == 1
    runtime.node_ids = [1, 2, 3]  # a site joins
    now[0] += polling.NODE_LIST_SECONDS / 2
    assert list(grid.get_node_ids()) == [1, 2] and runtime.asked == 1
    now[0] += polling.NODE_LIST_SECONDS / 2
    assert list(grid.get_node_ids()) == [1, 2, 3] and runtime.asked == 2
    grid.get_node_ids().append(9)  # a caller's list is its own
    assert list(grid.get_node_ids()) == [1, 2, 3]
    # a grid in memory (the simulation's) is asked every time: it costs nothing there
    memory = _FakeGrid(delay=0)
    asked = []
    memory.get_node_ids = lambda: asked.append(1) or [1, 2]
    in_memory = polling.PollingGrid(memory)
    for _ in range(3):
        assert list(in_memory.get_node_ids()) == [1, 2]
    assert len(asked) == 3


class _FakeRuntime:
    """The ServerApp's Runtime API on the SuperLink, as Flower's HttpGrid calls it:
    replies that are stored whole, except ``stuck``'s parts until ``gate`` is set
    (a site that is still uploading, or died while it did)."""

    def __init__(self, stuck: str) -> None:
        from flwr.app import ConfigRecord, Metadata, RecordDict
        from flwr.app.message import make_message, remove_content_from_message
        from flwr.common.serde import message_to_proto
        from flwr.supercore.inflatable.inflatable_object import (
            get_all_nested_objects,
            get_object_tree,
        )

        self.stuck, self.gate, self.confirmed = stuck, threading.Event(), []
        self.stored, self.parts, self.owner = {}, {}, {}
        for n, to in enumerate(["m-stuck", "m-fine"]):  # the stuck one comes first
            meta = Metadata(7, "", n + 1, 1, to, "g", 0.0, 60.0, "train")
            reply = make_message(meta, content=RecordDict({"r": ConfigRecord({"n": n})}))
            reply.metadata.__dict__["_message_id"] = reply.object_id  # as a SuperNode sets it
            objects = get_all_nested_objects(reply)
            self.stored[to] = (message_to_proto(remove_content_from_message(reply)),
                               get_object_tree(reply))  # fmt: skip
            for oid, obj in objects.items():
                self.parts[oid], self.owner[oid] = obj.deflate(), to

    def PullMessages(self, request):  # noqa: N802
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse

        found = [self.stored.pop(i) for i in ["m-stuck", "m-fine"] if i in self.stored]
        return PullAppMessagesResponse(
            messages_list=[m for m, _ in found], message_object_trees=[t for _, t in found]
        )

    def PullObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse

        if self.owner[request.object_id] == self.stuck and not self.gate.is_set():
            return PullObjectResponse(object_found=True, object_available=False)
        content = self.parts[request.object_id]
        return PullObjectResponse(object_found=True, object_available=True, object_content=content)

    def ConfirmMessageReceived(self, request):  # noqa: N802
        self.confirmed.append(request.message_object_id)


def test_a_reply_whose_parts_have_not_arrived_holds_back_no_other_reply():
    """Flower's pull downloads the replies it finds one after another; the collector
    must not let a reply whose parts are missing (its site died uploading it) keep
    another caller waiting: that caller's round would time out without its reply."""
    from concurrent.futures import ThreadPoolExecutor

    from flwr.supercore.run import Run
    from flwr.superlink.grid.http_grid import HttpGrid

    from server_app import grid as polling

    http = HttpGrid(token="t")  # Flower's deployed grid, over a fake Runtime API
    http.set_run(Run.create_empty(7))
    http._client = runtime = _FakeRuntime(stuck="m-stuck")
    http.push_messages = lambda messages: list(messages)  # the ids, as pushed
    grid = polling.PollingGrid(http)
    with ThreadPoolExecutor(2) as pool:
        stuck = pool.submit(grid.send_and_receive, ["m-stuck"], timeout=30)
        fine = pool.submit(grid.send_and_receive, ["m-fine"], timeout=30)
        (reply,) = fine.result(timeout=10)  # the stuck reply's retries go on meanwhile
        assert reply.metadata.reply_to_message_id == "m-fine"
        assert reply.content["r"]["n"] == 1 and not stuck.done()
        # the stuck download would hold the ServerApp's exit if its thread were not a daemon
        downloads = [t for t in threading.enumerate() if t.name == "pflower-reply-download"]
        assert downloads and all(t.daemon for t in downloads)
        runtime.gate.set()  # the rest of the stuck reply arrives
        (late,) = stuck.result(timeout=20)
    assert late.metadata.reply_to_message_id == "m-stuck" and late.content["r"]["n"] == 0
    assert len(runtime.confirmed) == 2  # each receipt went to the SuperLink, once


def test_the_site_idle_poll_backs_off_and_resets_on_a_message(monkeypatch):
    import flwr.supernode.start_client_internal as loop

    import pflower.patches

    slept: list[float] = []  # recorded by this backoff alone: other threads sleep as ever
    done = threading.Event()

    def poll() -> None:  # a thread of an earlier test still polling: not recorded
        for _ in range(5000):  # at most 5 s of its own sleeps
            if done.is_set():
                return
            time.sleep(0.001)

    other = threading.Thread(target=poll)
    other.start()
    monkeypatch.setattr(loop, "time", loop.time)  # undone after the test
    monkeypatch.setattr(loop, "_pull_and_store_message", lambda **kw: kw["run_id"])
    backoff = pflower.patches.supernode_backoff()
    backoff.pause = slept.append
    assert loop.time is backoff and loop.time.time() > 0  # the rest of `time` passes through
    for _ in range(12):
        loop.time.sleep(3)  # Flower's idle wait, as start_client_internal calls it
    assert slept[:3] == pytest.approx([0.1, 0.15, 0.225])
    assert slept[-1] == 3.0 and max(slept) == 3.0  # never slower than Flower's own pace
    assert loop._pull_and_store_message(run_id=None) is None  # no message: no reset
    loop.time.sleep(3)
    assert slept[-1] == 3.0
    assert loop._pull_and_store_message(run_id=7) == 7  # a message: fast again
    loop.time.sleep(3)
    loop.time.sleep(0.5)  # waiting for the local ClientApp's reply, or a part of it
    done.set()
    other.join()
    assert slept[-2:] == pytest.approx([0.1, 0.02]) and len(slept) == 15


def test_the_site_asks_again_at_once_after_a_pull_the_superlink_held_open():
    import pflower.patches

    slept: list[float] = []
    backoff = pflower.patches.IdleBackoff(pause=slept.append)
    backoff.pulled(False, pflower.patches.LONG_POLL)  # held open, then empty
    backoff.sleep(3)
    assert slept == []
    backoff.pulled(False, 0.01)  # answered at once (an unpatched SuperLink): back off
    backoff.sleep(3)
    backoff.sleep(3)
    assert slept == pytest.approx([0.1, 0.15])


def _message(node: int):
    from types import SimpleNamespace

    return SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node))


def _pull_for(node: int):
    from types import SimpleNamespace

    return SimpleNamespace(node=SimpleNamespace(node_id=node))


def _long_poll(
    monkeypatch, stored: list, held: int = 100, asked: list | None = None, http: bool = False
):
    """fleet-long-poll over a stand-in state: ``stored`` is its messages; ``asked``
    gets the node of every look the SuperLink takes at the state; ``http``: as on a
    Flower line whose SuperNodes pull over HTTP."""
    from types import SimpleNamespace

    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    import pflower.patches
    from pflower.flower_lines import fleet_pull_handler

    message_handler = fleet_pull_handler()  # this Flower line's Fleet pull

    def pull(request, state, store):  # Flower's handler: at once, message or not
        if asked is not None:
            asked.append(request.node.node_id)
        mine = [m for m in stored if m.metadata.dst_node_id == request.node.node_id]
        return SimpleNamespace(messages_list=mine[:1])

    monkeypatch.setattr(message_handler, "pull_messages", pull)
    monkeypatch.setattr(InMemoryLinkState, "store_message_ins", lambda self, m: stored.append(m))
    monkeypatch.setattr(SqlLinkState, "store_message_ins", SqlLinkState.store_message_ins)
    monkeypatch.setattr(pflower.patches.long_poll, "LONG_POLLS_HELD", held)
    monkeypatch.setattr(pflower.flower_lines, "fleet_over_http", lambda: http)
    assert pflower.patches.fleet_long_poll()
    return message_handler.pull_messages, InMemoryLinkState.store_message_ins


def test_the_superlink_answers_a_held_pull_when_its_nodes_message_is_stored(monkeypatch):
    import pflower.patches

    monkeypatch.setattr(
        pflower.patches.long_poll, "LONG_POLL", 1e6
    )  # only a store can end the hold
    stored: list = []
    pull, store = _long_poll(monkeypatch, stored)
    mine, other = _message(7), _message(8)
    answer: list = []
    held = threading.Thread(target=lambda: answer.append(pull(_pull_for(7), None, None)))
    held.start()
    store(None, other)  # another site's message: the pull goes on waiting
    held.join(0.2)
    assert held.is_alive() and not answer
    store(None, mine)
    held.join(30)  # a guard against a hang, not a duration: the hold has no limit here
    assert not held.is_alive() and answer[0].messages_list == [mine]


def test_the_superlink_holds_an_empty_pull_for_long_poll_seconds_and_no_more_pulls_than_its_cap(
    monkeypatch,
):
    import pflower.patches

    monkeypatch.setattr(pflower.patches.long_poll, "LONG_POLL", 0.5)
    asked: list = []
    pull, store = _long_poll(monkeypatch, [], held=1, asked=asked)
    start = time.monotonic()
    assert pull(_pull_for(7), None, None).messages_list == []
    assert 0.45 < time.monotonic() - start < 5
    # one pull held: a second one at the same time is answered at once, as Flower does
    # (with no limit on a hold, a second pull that were held would never return)
    monkeypatch.setattr(pflower.patches.long_poll, "LONG_POLL", 1e6)
    asked.clear()
    first = threading.Thread(target=pull, args=(_pull_for(7), None, None))
    first.start()
    deadline = time.monotonic() + 30  # a guard against a hang, not a duration
    while 7 not in asked and time.monotonic() < deadline:  # it looks after taking the hold
        time.sleep(0.01)
    second: list = []
    answered = threading.Thread(target=lambda: second.append(pull(_pull_for(8), None, None)))
    answered.start()
    answered.join(30)
    assert second and second[0].messages_list == [] and first.is_alive()
    store(None, _message(7))  # wakes the held one
    first.join(30)
    assert not first.is_alive()


def test_over_http_fleet_held_pulls_leave_most_of_the_http_apis_threads_free(monkeypatch):
    """On flwr 1.42 a held pull occupies one of the HTTP API's threads, which the
    ServerApp's pushes need: at most a quarter of them are held, the next pull is
    answered at once."""
    import pflower.patches
    from pflower.patches.timing import HTTP_API_THREADS

    monkeypatch.setattr(pflower.patches.long_poll, "LONG_POLL", 1e6)
    asked: list = []
    pull, store = _long_poll(monkeypatch, [], held=100, asked=asked, http=True)
    cap = HTTP_API_THREADS // 4
    holders = [threading.Thread(target=pull, args=(_pull_for(n), None, None)) for n in range(cap)]
    for t in holders:
        t.start()
    deadline = time.monotonic() + 30  # a guard against a hang, not a duration
    while len(set(asked)) < cap and time.monotonic() < deadline:
        time.sleep(0.01)
    extra: list = []
    answered = threading.Thread(target=lambda: extra.append(pull(_pull_for(99), None, None)))
    answered.start()
    answered.join(30)
    assert extra and extra[0].messages_list == [] and all(t.is_alive() for t in holders)
    for n in range(cap):
        store(None, _message(n))  # each held pull gets its node's message
    for t in holders:
        t.join(30)
    assert not any(t.is_alive() for t in holders)


def test_the_warm_superexec_forgets_exactly_the_projects_packages():
    import tomllib
    from pathlib import Path

    from deploy import warm_superexec

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert set(warm_superexec.PROJECT_PACKAGES) == set(wheel) - {"deploy"}
    # in a fresh interpreter: the libraries stay imported, the app's modules do not
    code = (
        "import sys; from deploy.warm_superexec import preload, PROJECT_PACKAGES; "
        "loaded = preload(); "
        "assert {'torch', 'flwr', 'sklearn.metrics'} <= set(sys.modules), loaded; "
        "left = [m for m in sys.modules if m.split('.')[0] in PROJECT_PACKAGES]; "
        "assert not left, left; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr


class _SlowPushGrid:
    """Its first push waits until ``waiting`` more calls are queued behind it."""

    def __init__(self, grid_of, waiting: int) -> None:
        self.grid_of, self.waiting, self.pushes, self.fail = grid_of, waiting, [], False
        self.entered = threading.Event()

    def push_messages(self, messages):
        messages = list(messages)
        self.entered.set()
        if not self.pushes:
            deadline = time.monotonic() + 30
            while len(self.grid_of()._queued) < self.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
        self.pushes.append(messages)
        if self.fail:
            raise ConnectionError("superlink gone")
        return [f"id-{m}" for m in messages]


def test_pushes_that_come_while_one_is_in_flight_go_together_in_the_next() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from server_app import grid as polling

    fake = _SlowPushGrid(lambda: grid, waiting=3)
    grid = polling.PollingGrid(fake)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(grid.push_messages, ["a"])
        assert fake.entered.wait(30)  # "a" is in flight: the next three queue behind it
        rest = {c: pool.submit(grid.push_messages, [c, c.upper()]) for c in "bcd"}
        assert list(first.result(timeout=30)) == ["id-a"]
        for c, call in rest.items():  # each caller gets its own messages' ids, in order
            assert list(call.result(timeout=30)) == [f"id-{c}", f"id-{c.upper()}"]
    # two requests, not four: the three that queued behind the first went in one
    assert [sorted(p) for p in fake.pushes] == [["a"], ["B", "C", "D", "b", "c", "d"]]
    # a failed request fails every call it carried; the next push is a new request
    fake.fail, fake.pushes, fake.waiting = True, [], 0
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(grid.push_messages, [c]) for c in "xyz"]
        for call in calls:
            with pytest.raises(ConnectionError, match="superlink gone"):
                call.result(timeout=30)
    fake.fail = False
    assert list(grid.push_messages(["w"])) == ["id-w"] and fake.pushes[-1] == ["w"]


def test_a_missing_message_part_is_asked_for_again_soon(monkeypatch):
    from flwr.supercore.inflatable import inflatable_utils as objects

    from pflower.patches import object_retries
    from pflower.patches.timing import FIRST_OBJECT_RETRY, OBJECT_PATIENCE, OBJECT_RETRY_CAP

    for fn in (objects.pull_objects, objects.pull_and_inflate_object_from_tree):
        monkeypatch.setitem(fn.__kwdefaults__, "initial_backoff", 1)  # Flower's, restored after
        monkeypatch.setitem(fn.__kwdefaults__, "backoff_cap", 10)
        monkeypatch.setitem(fn.__kwdefaults__, "max_tries_per_object", 500)
    assert object_retries()
    kw = objects.pull_objects.__kwdefaults__
    assert kw["backoff_cap"] == OBJECT_RETRY_CAP < 1
    # as patient as before the cap came down (500 tries at 0.5 s): a slow upload still lands
    assert kw["max_tries_per_object"] * OBJECT_RETRY_CAP >= 500 * 0.5 == OBJECT_PATIENCE
    tries = iter([objects.ObjectUnavailableError("x")] * 5)

    def pull(object_id: str) -> bytes:
        if (err := next(tries, None)) is not None:
            raise err
        return b"part"

    waits: list[float] = []  # what the pull waits between tries (its Event's timeouts)

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            return super().wait(0)

    from types import SimpleNamespace

    monkeypatch.setattr(objects, "threading", SimpleNamespace(Event=Stop, Lock=threading.Lock))
    monkeypatch.setattr(objects, "random", SimpleNamespace(uniform=lambda a, b: 0.0))  # no jitter
    assert objects.pull_objects(["x"], pull) == {"x": b"part"}
    # five retries: 0.05, then 0.1 s each, where Flower waits 1, 2, 4, 8 and 10 s
    assert FIRST_OBJECT_RETRY == 0.05 and waits == [0.05, 0.1, 0.1, 0.1, 0.1]


def test_median_phases_reads_only_phase_lines_and_takes_each_phase_median() -> None:
    lines = [
        "INFO: something else",
        timing.PREFIX + json.dumps({"queued": 1.0, "train": 3.0}),
        "noise " + timing.PREFIX + json.dumps({"queued": 2.0, "train": 5.0, "evaluate": 1.0}),
        timing.PREFIX + json.dumps({"queued": 9.0, "train": 4.0}),
    ]
    assert timing.median_phases(lines) == {
        "queued": 2.0,
        "train": 4.0,
        "evaluate": 1.0,  # a phase only some messages have: their median
        "messages": 3,
    }
    assert timing.median_phases(["no phases here"]) == {"messages": 0}
