"""``activation-retry``: a SuperNode the SuperLink will not activate yet asks again.

A SuperNode killed hard (SIGKILL, power loss) stays "online" at the SuperLink until
its heartbeat lapses (Flower's 2 x 30 s), and the SuperLink refuses to activate the
same key before then: Flower's SuperNode exits with code 305 at once ("Failed to
activate SuperNode", gRPC FAILED_PRECONDITION on 1.39, HTTP 412 on 1.42), so a site
restarted right after a crash did not come back without a person or a restart
policy. Here that one refusal is retried with a bounded backoff (1 s, doubling, at
most 10 s apart) for up to ``ACTIVATION_WAIT`` s, each try logged; after that (a key
that was never registered gets the same answer) it exits 305 as before. Every other
error of the activation is Flower's to handle, as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pflower.flower_lines import fleet_over_http
from pflower.patches.core import check

log = logging.getLogger("flwr")

# the SuperLink keeps a node that stopped heartbeating online for HEARTBEAT_PATIENCE (2)
# x HEARTBEAT_DEFAULT_INTERVAL (30 s) = 60 s; twice that, with the backoff's last step
ACTIVATION_WAIT = 150.0
FIRST_WAIT, WAIT_CAP = 1.0, 10.0


def retrying(
    activate: Callable[..., Any],
    refused: Callable[[BaseException], bool],
    wait: float = ACTIVATION_WAIT,
    pause: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[..., Any]:
    """``activate`` tried again while it raises an error ``refused`` says is the
    SuperLink's refusal, 1 s, 2 s, 4 s ... (at most ``WAIT_CAP``) apart, until
    ``wait`` s have passed; then its error is raised as Flower raised it."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start, delay, tries = clock(), FIRST_WAIT, 1
        while True:
            try:
                return activate(*args, **kwargs)
            except Exception as err:
                if not refused(err) or clock() - start + delay > wait:
                    raise
                log.warning(
                    "the SuperLink refused to activate this SuperNode (try %d, %.0f s so far): "
                    "it holds this key's last session until its heartbeat lapses (about 60 s "
                    "after a crash), or the key is not registered; trying again in %.0f s "
                    "(for up to %.0f s)",
                    tries,
                    clock() - start,
                    delay,
                    wait,
                )
                pause(delay)
                delay, tries = min(WAIT_CAP, delay * 2), tries + 1

    return call


def _grpc_refused(err: BaseException) -> bool:
    import grpc

    return isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.FAILED_PRECONDITION


def _http_refused(err: BaseException) -> bool:
    import httpx

    return isinstance(err, httpx.HTTPStatusError) and err.response.status_code == 412


def activation_retry() -> None:
    """``activation-retry`` in this process (a SuperNode's): the Fleet client's
    ``ActivateNode`` through ``retrying``. A fix, not a speed-up: it is applied with
    the speed patches switched off too."""
    check(("flwr",))
    if fleet_over_http():  # 1.42: the SuperNode's HTTP Fleet client
        from flwr.supernode import fleet_http_client as http

        if not getattr(http.FleetHttpClient.ActivateNode, "pflower_retrying", False):
            http.FleetHttpClient.ActivateNode = retrying(
                http.FleetHttpClient.ActivateNode, _http_refused
            )
            http.FleetHttpClient.ActivateNode.pflower_retrying = True  # type: ignore[attr-defined]
        return
    from flwr.client.grpc_rere_client import connection  # 1.39: the gRPC stub, wrapped

    if getattr(connection.wrap_stub, "pflower_retrying", False):
        return
    wrap = connection.wrap_stub

    def wrap_stub(stub: Any, retry_invoker: Any) -> None:
        wrap(stub, retry_invoker)  # Flower's retries (an unreachable SuperLink) first
        stub.ActivateNode = retrying(stub.ActivateNode, _grpc_refused)

    wrap_stub.pflower_retrying = True  # type: ignore[attr-defined]
    connection.wrap_stub = wrap_stub
