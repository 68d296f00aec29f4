"""``superexec-fork``: the warm SuperExec's forking executor in Flower's SuperExec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pflower.flower_lines import installed
from pflower.patches.core import UntestedVersion, applies, check


def superexec_fork(executor: Callable[..., Any]) -> None:
    """``superexec-fork``: Flower's SuperExec looks its executor up by this name; the
    warm SuperExec's forking one in its place (deploy/warm_superexec.py). Not a
    speed-up that can be left out: the warm SuperExec is this patch."""
    check(("flwr",))
    if not applies("superexec-fork"):
        raise UntestedVersion(
            f"flwr {installed('flwr')}: the warm SuperExec (patch superexec-fork) was not "
            "checked against this Flower's SuperExec: start the site with --no-warm (a "
            "ClientApp process a message) on it"
        )
    import flwr.supercore.superexec.run_superexec as superexec

    superexec.get_executor = executor
