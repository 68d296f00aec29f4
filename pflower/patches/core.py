"""The patches' switch, the library versions they were checked against, and the
one-line refusal of any other (the table: pflower/patches/__init__.py)."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

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
