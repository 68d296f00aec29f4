"""A message's content in one part on the deployed wire (pflower/packing.py): the same
content back, 3 parts, a header that must describe its bytes exactly, and each side
(the ServerApp's grid, the ClientApp, the site's ledger) doing its part."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, Metadata
from flwr.common import (
    Array,
    ArrayRecord,
    Code,
    ConfigRecord,
    Context,
    FitIns,
    FitRes,
    MessageType,
    MetricRecord,
    RecordDict,
    Status,
    ndarrays_to_parameters,
)
from flwr.compat.common.recorddict_compat import fitins_to_recorddict, fitres_to_recorddict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from deploy.site_guard import ledger_line
from pflower.packing import BODY, HEADER, PACKED, is_packed, pack, unpack

# a cnn4-like state: ten tensors of several shapes and dtypes
TENSORS = [np.random.default_rng(i).random(s).astype(np.float32) for i, s in enumerate(
    [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 64, 3, 3), (128,), (200, 512), (200,)]
)] + [np.arange(5, dtype=np.int64), np.zeros((), np.float64)]  # fmt: skip


def _fit_ins() -> RecordDict:
    return fitins_to_recorddict(FitIns(ndarrays_to_parameters(TENSORS), {"server-round": 3}), True)


def _message(content: RecordDict) -> Message:
    return Message(content, metadata=Metadata(7, "", 1, 0, "m", "3", 0.0, 60.0, "train"))


def _parts(content: RecordDict) -> int:
    return len(get_all_nested_objects(_message(content)))


def test_packed_content_is_the_same_content_in_three_parts() -> None:
    content = _fit_ins()
    packed = pack(content)
    assert is_packed(packed) and list(packed.keys()) == [PACKED]
    assert _parts(content) >= 2 * len(TENSORS) + 4 and _parts(packed) == 3
    # the arrays' bytes, in their order, one after another
    arrays = b"".join(a.data for r in content.array_records.values() for a in r.values())
    body = packed.config_records[PACKED][BODY]
    assert hashlib.sha256(body[: len(arrays)]).digest() == hashlib.sha256(arrays).digest()
    back = unpack(packed)
    assert back.object_id == content.object_id  # exactly what was packed, records and all
    assert list(back.keys()) == list(content.keys())
    assert pack(packed) is packed  # packed once


def test_every_kind_of_record_comes_back_as_it_was() -> None:
    content = RecordDict(
        {
            "m": MetricRecord({"loss": 0.25, "counts": [1, 2]}),
            "a": ArrayRecord({"w": Array(np.ones((2, 3), np.float32))}),
            "empty": ArrayRecord(),
            "c": ConfigRecord({"b": b"\x00raw", "s": "text", "t": True, "f": [0.5]}),
        }
    )
    packed = pack(content)
    assert is_packed(packed) and _parts(packed) == 3 < _parts(content)
    back = unpack(packed)
    assert back.object_id == content.object_id and list(back.keys()) == list(content.keys())
    assert isinstance(back["m"], MetricRecord) and isinstance(back["c"], ConfigRecord)


def test_one_array_alone_is_packed_too() -> None:
    content = RecordDict({"a": ArrayRecord({"w": Array(np.ones(3))})})  # 5 parts: 3 packed
    assert _parts(pack(content)) == 3 < _parts(content) == 5


def test_content_with_nothing_to_gain_is_left_as_it_is() -> None:
    for content in (RecordDict(), RecordDict({"c": ConfigRecord({"x": 1})})):
        assert pack(content) is content and unpack(content) is content
        assert not is_packed(content)


def _tampered(change: str) -> RecordDict:
    packed = pack(_fit_ins())
    record = packed.config_records[PACKED]
    header = json.loads(record[HEADER])
    params, config = header  # fitins.parameters, fitins.config
    if change == "short":
        params[2][-1][4] -= 1
    elif change == "long":
        config[2] += 1
    elif change == "duplicate key":
        params[2][1][0] = params[2][0][0]
    elif change == "duplicate record":
        config[0] = params[0]
    elif change == "negative size":
        params[2][0][4], params[2][1][4] = -1, params[2][1][4] + params[2][0][4] + 1
    elif change == "not a size":
        params[2][0][4] = "many"
    elif change == "a size that is a bool":
        config[2] = True
    elif change == "unknown kind":
        config[1] = "secret"
    elif change == "config as metric":
        config[1] = "metric"
    elif change == "a value beside":
        record["extra"] = 1
    elif change == "a record beside":
        packed["elsewhere"] = ConfigRecord({"x": 1})
    elif change == "body not bytes":
        record[BODY] = "text"
    record[HEADER] = json.dumps(header)
    if change == "not json":
        record[HEADER] = "[["
    return packed


CHANGES = [
    "short", "long", "duplicate key", "duplicate record", "negative size", "not a size",
    "a size that is a bool", "unknown kind", "config as metric", "a value beside",
    "a record beside", "body not bytes", "not json",
]  # fmt: skip


@pytest.mark.parametrize("change", CHANGES)
def test_a_header_that_does_not_describe_its_bytes_unpacks_nothing(change: str) -> None:
    unpack(_tampered("none"))  # the helper itself leaves a valid packing
    with pytest.raises(ValueError, match="packed content"):
        unpack(_tampered(change))


# ---- the ClientApp: unpacks what arrives packed, and only then packs its reply ----------------


def test_the_client_app_answers_a_packed_message_packed_and_alike(monkeypatch) -> None:
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import make_client_app
    from server_app.app import build_server
    from tests.helpers import SMALL

    cfg = {**SMALL, "method": "fedper", "num-server-rounds": 2}
    for attr in ("_run_id", "_task_id", "_node_id"):  # what a SuperNode would have set
        monkeypatch.setattr(TaskIdentity, attr, 0, raising=False)
    strategy = build_server(Context(0, 0, {}, RecordDict(), {}), cfg).strategy
    ins = FitIns(
        strategy.payload_for(None, 1), {"server-round": 1, **strategy.client_config(None, 1)}
    )

    def answer(content: RecordDict) -> Message:
        app = make_client_app(cfg)
        node = {"partition-id": 1, "num-partitions": 3}
        meta = Metadata(1, "m", 1, 7, "", "1", time.time(), 3600.0, MessageType.TRAIN)
        return app(Message(content=content, metadata=meta), Context(1, 7, node, RecordDict(), {}))

    plain = answer(fitins_to_recorddict(ins, True))
    packed = answer(pack(fitins_to_recorddict(ins, True)))
    assert not plain.has_error() and not packed.has_error()
    assert not is_packed(plain.content) and is_packed(packed.content)
    got, want = unpack(packed.content), plain.content
    assert [a.data for a in got["fitres.parameters"].values()] == [
        a.data for a in want["fitres.parameters"].values()
    ]  # the same update, bit for bit
    assert len(want["fitres.parameters"]) > 1


# ---- the ServerApp's grid: packs what it pushes to a deployed federation ----------------------


class _Runtime:
    """The SuperLink's Runtime API as Flower's HttpGrid calls it, holding one reply."""

    def __init__(self, reply: Message) -> None:
        from flwr.app.message import remove_content_from_message
        from flwr.common.serde import message_to_proto
        from flwr.supercore.inflatable.inflatable_object import get_object_tree

        reply.metadata.__dict__["_message_id"] = reply.object_id  # as a SuperNode sets it
        self.parts = {i: o.deflate() for i, o in get_all_nested_objects(reply).items()}
        self.stored = [
            (message_to_proto(remove_content_from_message(reply)), get_object_tree(reply))
        ]

    def PullMessages(self, request: Any) -> Any:  # noqa: N802
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse

        found, self.stored = self.stored, []
        return PullAppMessagesResponse(
            messages_list=[m for m, _ in found], message_object_trees=[t for _, t in found]
        )

    def PullObject(self, request: Any) -> Any:  # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse

        content = self.parts[request.object_id]
        return PullObjectResponse(object_found=True, object_available=True, object_content=content)

    def ConfirmMessageReceived(self, request: Any) -> None:  # noqa: N802
        pass


def _fit_reply_content() -> RecordDict:
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(TENSORS), 12, {"train-loss": 0.5})
    return fitres_to_recorddict(res, keep_input=True)


def test_the_deployed_grid_pushes_packed_and_hands_replies_over_unpacked() -> None:
    from flwr.supercore.run import Run
    from flwr.superlink.grid.http_grid import HttpGrid

    from server_app.grid import PollingGrid

    reply = Message(
        pack(_fit_reply_content()),
        metadata=Metadata(7, "", 1, 0, "m-1", "3", 0.0, 60.0, "train"),
    )
    http = HttpGrid(token="t")  # Flower's deployed grid, over a fake Runtime API
    http.set_run(Run.create_empty(7))
    http._client = _Runtime(reply)
    pushed: list[Message] = []
    http.push_messages = lambda messages: [pushed.append(m) or "m-1" for m in messages]
    out = _message(_fit_ins())
    (got,) = PollingGrid(http).send_and_receive([out], timeout=20)
    assert is_packed(pushed[0].content)  # what left for the SuperLink
    assert unpack(pushed[0].content).object_id == _fit_ins().object_id
    assert not is_packed(got.content)  # what the strategy sees
    assert got.content.object_id == _fit_reply_content().object_id


def test_an_in_memory_grid_passes_messages_as_they_are() -> None:
    from server_app.grid import PollingGrid

    class Memory:  # simulation's grid: no Runtime API, replies come whole
        def push_messages(self, messages: Any) -> list[str]:
            self.pushed = list(messages)
            return []

    memory = Memory()
    PollingGrid(memory).send_and_receive([_message(_fit_ins())], timeout=1)
    assert not is_packed(memory.pushed[0].content)


# ---- the site's ledger lists the arrays of a packed reply one by one ---------------------------


def test_the_ledger_lists_a_packed_reply_array_by_array(caplog) -> None:
    plain = ledger_line(_message(_fit_reply_content()), None, {"method": "fedper"}, app="a")
    packed = ledger_line(_message(pack(_fit_reply_content())), None, {"method": "fedper"}, app="a")
    assert packed["arrays"] == plain["arrays"] and len(plain["arrays"]) == len(TENSORS)
    assert packed["metrics"] == plain["metrics"] and packed["bytes"] == plain["bytes"]
    # what the server sent, as it arrived (packed) or as the ClientApp unpacked it
    ins = _fit_ins()
    reply = _message(_fit_reply_content())
    sent = [ledger_line(reply, _message(c), {}, app="a")["received"] for c in (ins, pack(ins))]
    arrays = [a.data for r in ins.array_records.values() for a in r.values()]
    assert sent[0] == sent[1] and sent[1]["bytes"] == sum(map(len, arrays)) > 0
    # a header that lies about its bytes: the packed bytes are listed as they left, and said
    tampered = pack(_fit_reply_content())
    header = json.loads(tampered.config_records[PACKED][HEADER])
    header[0][2] -= 4  # fitres.metrics: shorter than its bytes
    tampered.config_records[PACKED][HEADER] = json.dumps(header)
    with caplog.at_level(logging.ERROR, logger="flwr"):
        line = ledger_line(_message(tampered), None, {"method": "fedper"}, app="a")
    body = tampered.config_records[PACKED][BODY]
    assert [a["name"] for a in line["arrays"]] == [f"{PACKED}.body"]
    assert line["bytes"] == len(body) > plain["bytes"] and "does not match" in caplog.text
