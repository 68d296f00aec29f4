"""A message's content in one part on the deployed wire, and back.

Flower 1.39 sends a message as a tree of parts (the message, its content, each
record, each array, each array's chunks) and moves every part in its own request,
at every hop: the ServerApp's push, the SuperNode's download, the ClientApp's read
over the site-local Runtime API, and the same four back: a CNN's reply is dozens of
parts, each a request (docs/PERFORMANCE.md measured them). Packed, the whole content travels as one config record of
two values: a header (JSON: each record's name, kind and size, and each array's
key, dtype, shape, stype and size) and the records' bytes one after another (each
array's data, each config or metric record as Flower deflates it): a message is 3
parts (the message, its content, that record). Flower chunks an array at 5 MiB;
one record is one request of any size up to gRPC's 2 GB limit.

Nothing else changes: the arrays' bytes in the same order, and ``unpack`` gives back
the content exactly (the same object id). The ServerApp packs what it pushes to a
deployed federation (server_app/grid.py); a ClientApp unpacks what arrives packed
and packs its reply only then (``packing_mod`` in client_app/app.py, first of a
ClientApp's mods); the site's ledger lists the packed arrays one by one
(deploy/site_guard.py). A header that does not describe its bytes exactly is a
``ValueError``: nothing is unpacked from it.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.common import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from google.protobuf.message import DecodeError

PACKED = "pflower.packed"  # the one record of packed content
HEADER, BODY = "header", "body"  # its two values: JSON text, the records' bytes
KINDS: dict[str, type] = {"config": ConfigRecord, "metric": MetricRecord}


def is_packed(content: RecordDict) -> bool:
    return PACKED in content.config_records


def pack(content: RecordDict) -> RecordDict:
    """``content`` as one config record; the same content where that saves no part
    (one config or metric record, or nothing)."""
    if is_packed(content) or not (content.array_records or len(content) > 1):
        return content
    header, body = [], []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            arrays = list(record.items())
            entries = [[k, a.dtype, list(a.shape), a.stype, len(a.data)] for k, a in arrays]
            header.append([name, "array", entries])
            body += [a.data for _, a in arrays]
        else:
            kind = next(k for k, kind_of in KINDS.items() if isinstance(record, kind_of))
            data = record.deflate()
            header.append([name, kind, len(data)])
            body.append(data)
    packed = ConfigRecord({HEADER: json.dumps(header), BODY: b"".join(body)})
    return RecordDict({PACKED: packed})


def packed_body(content: RecordDict) -> bytes:
    """The bytes packed content carries (b"" if it is not packed, or holds none)."""
    body = content.config_records[PACKED].get(BODY) if is_packed(content) else b""
    return body if isinstance(body, bytes) else b""


def unpack(content: RecordDict) -> RecordDict:
    """The content that was packed; ``content`` itself if it is not packed. A header
    that does not describe the bytes exactly is a ValueError."""
    if not is_packed(content):
        return content
    record = content.config_records[PACKED]
    header, body = record.get(HEADER), record.get(BODY)
    if len(content) != 1 or set(record) != {HEADER, BODY} or not isinstance(body, bytes):
        raise ValueError(f"packed content is not one '{PACKED}' record of {HEADER} and {BODY}")
    out, at = RecordDict(), 0
    try:
        for name, kind, layout in json.loads(str(header)):
            if not isinstance(name, str) or name in out:
                raise ValueError(f"record '{name}'")
            if kind == "array":
                arrays: dict[str, Array] = {}
                for key, dtype, shape, stype, size in layout:
                    if not isinstance(key, str) or key in arrays or not _size(size):
                        raise ValueError(f"record '{name}', array '{key}'")
                    shape = tuple(int(n) for n in shape)
                    arrays[key] = Array(str(dtype), shape, str(stype), body[at : at + size])
                    at += size
                out[name] = ArrayRecord(arrays)
            elif kind in KINDS and _size(layout):
                out[name] = KINDS[kind].inflate(body[at : at + layout])
                at += layout
            else:
                raise ValueError(f"record '{name}' of kind '{kind}'")
    except (TypeError, ValueError, DecodeError) as err:  # JSON, shapes, Flower's inflate
        raise ValueError(f"packed content: malformed header ({err})") from None
    if at != len(body):
        raise ValueError(f"packed content: the header's sizes {at} != {len(body)} bytes")
    return out


def _size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
