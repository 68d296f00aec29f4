"""The project's apps, with site-b's ClientApp hanging on every fit (a test app)."""

from __future__ import annotations

import time

from flwr.client import Client, ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Context, Message, MessageType

from client_app.app import build_client, packing_mod
from server_app.app import make_server_app

server = make_server_app()


def hang_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    if (
        context.node_config.get("site") == "site-b"
        and msg.metadata.message_type == MessageType.TRAIN
    ):
        time.sleep(3600)  # never replies: the SuperExec's task timeout must end it
    return call_next(msg, context)


def client_fn(context: Context) -> Client:
    return build_client(context)


client = ClientApp(client_fn=client_fn, mods=[packing_mod, hang_mod])  # as the project's
