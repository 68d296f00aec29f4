"""``reply-downloads-apart``: on Flower's deployed grid, each found reply's parts are
downloaded on their own, so one site's missing part holds back no other reply.

Flower's ``HttpGrid.pull_messages`` asks the SuperLink's Runtime API for the replies,
then downloads the parts of each found reply one reply after another, retrying a part
that is not there yet for minutes. The ServerApp's grid (server_app/grid.py
``PollingGrid``) asks for the replies itself, through the grid's Runtime API client
(its private ``_runtime_client``, which connects on first use as Flower's own calls
do), and hands each found reply to Flower's own ``pull_messages`` on a copy of the
grid whose client (its private ``_client``) answers the pull with that one reply:
Flower's retries, its receipt to the SuperLink and its error reply for a part that
never arrives, per reply. ``HttpGrid``'s ``_runtime_client`` property, its
``_client`` attribute and ``pull_messages`` are the same in flwr 1.39.0 and 1.42.0
(1.42 adds a tracing interceptor to the client it connects).

``PFLOWER_FLOWER_PATCHES=0`` turns it off: Flower's ``pull_messages`` downloads the
replies as it finds them. Whether a grid is Flower's deployed one (``deployed``) asks
no private attribute and holds with the patch off too.
"""

from __future__ import annotations

import copy
import sys
from functools import cache
from typing import Any

from pflower.patches.core import applies, check, enabled

HTTP_GRID = "flwr.superlink.grid.http_grid"  # HttpGrid's module, 1.39 and 1.42


def deployed(grid: Any) -> bool:
    """Whether ``grid`` is Flower's deployed grid (``HttpGrid``: a ServerApp that
    talks to a SuperLink). Not imported to ask: only a deployed ServerApp loads it."""
    module = sys.modules.get(HTTP_GRID)
    return module is not None and isinstance(grid, module.HttpGrid)


def runtime_client(grid: Any) -> Any | None:
    """The Runtime API client of Flower's deployed ``grid``, connected; None for any
    other grid, with the patch off, or on a Flower it was not checked against."""
    if not deployed(grid) or not enabled() or not _checked():
        return None
    return grid._runtime_client


@cache
def _checked() -> bool:
    """Whether the installed Flower is one this patch was checked against (another
    that no patch was is refused, as by every patch)."""
    check(("flwr",))
    return applies("reply-downloads-apart")


def pull_found(grid: Any, client: Any, found: Any, reply_to: str) -> list[Any]:
    """The reply to ``reply_to``, whole, by Flower's own ``pull_messages`` on a copy
    of ``grid`` whose Runtime API client answers the pull with ``found`` (the
    SuperLink's answer for that one reply) and is ``client`` for everything else
    (its parts, its receipt)."""
    view = copy.copy(grid)  # the same grid, answering its pull with ``found``
    view._client = _Found(client, found)
    return list(view.pull_messages([reply_to]))


class _Found:
    """A Runtime API client whose PullMessages answers with replies already found;
    everything else (PullObject, ConfirmMessageReceived) is the real client's."""

    def __init__(self, client: Any, response: Any) -> None:
        self._client, self._response = client, response

    def PullMessages(self, request: Any) -> Any:  # noqa: N802 - Flower's RPC name
        return self._response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
