"""A message's arrays in one part on the deployed wire, and back.

Flower 1.39 sends a message as a tree of parts (the message, its records, each
array, each array's chunks) and moves every part in its own request, at every hop:
the ServerApp's push, the SuperNode's download, the ClientApp's read over the
site-local Runtime API, and the same four back. A cifar-cnn4 reply is 33 parts,
and each request cost 10-100 ms on a loaded 2-core machine (docs/PERFORMANCE.md).
Packed, each array record travels as one array (its arrays' bytes one after
another) and a manifest in a config record: 8 parts.

Nothing else changes: the same bytes in the same order (a digest over the packed
array equals one over the arrays), and ``unpack`` gives back the arrays exactly.
The ServerApp packs what it pushes to a deployed federation (server_app/grid.py);
a ClientApp unpacks what arrives packed and packs its reply only then
(``packing_mod`` in client_app/app.py, first of a ClientApp's mods); the site's
ledger lists the packed arrays one by one (deploy/site_guard.py). A manifest that does not describe its bytes exactly is a
``ValueError``: nothing is unpacked from it.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.common import Array, ArrayRecord, ConfigRecord, RecordDict

MANIFEST = "pflower.packed"  # the config record: array record name -> its manifest (JSON)
PACKED_KEY = "packed"  # the one array of a packed array record
PACKED_STYPE = "pflower.packed"


def is_packed(content: RecordDict) -> bool:
    return MANIFEST in content.config_records


def pack(content: RecordDict) -> RecordDict:
    """``content`` with each array record of two or more arrays as one array; the
    same content if none has two (nothing to gain)."""
    if is_packed(content) or not any(len(r) > 1 for r in content.array_records.values()):
        return content
    out, manifest = RecordDict(), ConfigRecord()
    for name, record in content.items():
        if not isinstance(record, ArrayRecord) or len(record) < 2:
            out[name] = record
            continue
        arrays = list(record.items())
        entries = [[k, a.dtype, list(a.shape), a.stype, len(a.data)] for k, a in arrays]
        blob = b"".join(a.data for _, a in arrays)
        out[name] = ArrayRecord({PACKED_KEY: Array("uint8", (len(blob),), PACKED_STYPE, blob)})
        manifest[name] = json.dumps(entries)
    out[MANIFEST] = manifest
    return out


def unpack(content: RecordDict) -> RecordDict:
    """``content`` with every packed array record as its arrays again; the same
    content if nothing is packed. A manifest that does not match is a ValueError."""
    if not is_packed(content):
        return content
    manifest = content.config_records[MANIFEST]
    out = RecordDict()
    for name, record in content.items():
        if name == MANIFEST:
            continue
        if name not in manifest:
            out[name] = record
            continue
        if not isinstance(record, ArrayRecord) or list(record.keys()) != [PACKED_KEY]:
            raise ValueError(f"packed record '{name}' is not one '{PACKED_KEY}' array")
        out[name] = ArrayRecord(_split(name, record[PACKED_KEY].data, manifest[name]))
    missing = set(manifest) - set(out)
    if missing:
        raise ValueError(f"the packing manifest names records that are not there: {missing}")
    return out


def _split(name: str, blob: bytes, text: Any) -> dict[str, Array]:
    try:
        entries = json.loads(str(text))
        arrays, at = {}, 0
        for key, dtype, shape, stype, size in entries:
            if not isinstance(key, str) or key in arrays or not isinstance(size, int) or size < 0:
                raise ValueError(f"entry '{key}'")
            shape = tuple(int(n) for n in shape)
            arrays[key] = Array(str(dtype), shape, str(stype), blob[at : at + size])
            at += size
    except (TypeError, ValueError) as err:
        raise ValueError(f"packed record '{name}': malformed manifest ({err})") from None
    if at != len(blob):
        raise ValueError(f"packed record '{name}': manifest sizes {at} != {len(blob)} bytes")
    return arrays
