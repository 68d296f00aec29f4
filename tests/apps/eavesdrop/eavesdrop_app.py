"""A hostile server (a test app, tests/test_site_refusal.py): the project's own
ClientApp at every site, and a ServerApp that asks each site for what an attacker
running the server wants, and writes down everything that comes back.

It sends each site a plain fit of the run's global model, a legacy get_parameters
(the shared tensors in the clear) and a SecAgg+ set-up in the sites' own protocol
(whose public keys would let it play the site's neighbours when the site has no
roster to check them against), then writes every reply's arrays and values to
``<output-dir>/captured-secure-<secure-aggregation>.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flwr.common import (
    ConfigRecord,
    Context,
    FitIns,
    GetParametersIns,
    Message,
    MessageType,
    RecordDict,
)
from flwr.common.constant import MessageTypeLegacy
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common.recorddict_compat import (
    fitins_to_recorddict,
    getparametersins_to_recorddict,
)
from flwr.server import Grid, ServerApp

from pflower.patches import SECAGG_PROTOCOL
from pflower.privacy.secagg import PROTOCOL_KEY
from server_app.app import build_server

server = ServerApp()


def setup_content(protocol: str | None = SECAGG_PROTOCOL) -> RecordDict:
    """A SecAgg+ set-up of three participants (``protocol``: the version it speaks;
    None: Flower's own, unversioned). tests/test_secagg_protocol.py sends it too."""
    configs: dict[str, Any] = {
        Key.STAGE: Stage.SETUP,
        Key.SAMPLE_NUMBER: 3,
        Key.SHARE_NUMBER: 3,
        Key.THRESHOLD: 2,
        Key.CLIPPING_RANGE: 8.0,
        Key.TARGET_RANGE: 4194304,
        Key.MOD_RANGE: 2**32,
        Key.MAX_WEIGHT: 1000.0,
    }
    if protocol is not None:
        configs[PROTOCOL_KEY] = protocol
    return RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(configs)})


def _seen(reply: Message) -> dict[str, Any]:
    """Everything a reply carried, as the server holds it."""
    seen: dict[str, Any] = {"node": reply.metadata.src_node_id, "error": ""}
    if reply.has_error():
        seen["error"] = reply.error.reason
        return seen
    content = reply.content
    seen["arrays"] = {
        f"{name}.{key}": list(array.shape) or len(array.data)
        for name, record in content.array_records.items()
        for key, array in record.items()
    }
    seen["values"] = {
        f"{name}.{key}": repr(value)[:80]
        for name, record in {**content.config_records, **content.metric_records}.items()
        for key, value in record.items()
    }
    return seen


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = dict(context.run_config)  # the project's keys only: the ClientApp reads them too
    deadline = time.monotonic() + 120
    while len(nodes := sorted(grid.get_node_ids())) < int(config["min-available-clients"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} sites connected")
        time.sleep(0.5)
    strategy = build_server(Context(0, 0, {}, RecordDict(), {}), config).strategy
    payload = strategy.payload_for(None, 1)  # the run's global model, as a round sends it
    fit = {"server-round": 1, **strategy.client_config(None, 1)}
    asks = {
        "plain fit": (MessageType.TRAIN, lambda: fitins_to_recorddict(FitIns(payload, fit), True)),
        "get_parameters": (
            MessageTypeLegacy.GET_PARAMETERS,
            lambda: getparametersins_to_recorddict(GetParametersIns({})),
        ),
        "secagg+ set-up": (MessageType.TRAIN, setup_content),
    }
    captured: dict[str, list[dict[str, Any]]] = {}
    for what, (message_type, content) in asks.items():
        messages = [
            Message(content(), dst_node_id=node, message_type=message_type, group_id="1")
            for node in nodes
        ]
        captured[what] = [_seen(r) for r in grid.send_and_receive(messages, timeout=300)]
    name = f"captured-secure-{str(config['secure-aggregation']).lower()}.json"
    Path(config["output-dir"], name).write_text(json.dumps(captured, indent=1))
