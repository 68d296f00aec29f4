"""The patches' switch, the library versions they were checked against, and the
one-line refusal of any other (the table: pflower/patches/__init__.py)."""

from __future__ import annotations

import os

from pflower.flower_lines import installed

SWITCH = "PFLOWER_FLOWER_PATCHES"
FLWR_39, FLWR_42 = "1.39.", "1.42."
# patch -> (the library it patches, the version prefixes it was checked against)
PATCHES: dict[str, tuple[str, tuple[str, ...]]] = {
    "linkstate-index": ("flwr", (FLWR_39, FLWR_42)),
    "supernode-backoff": ("flwr", (FLWR_39, FLWR_42)),
    "fleet-long-poll": ("flwr", (FLWR_39, FLWR_42)),
    "object-retries": ("flwr", (FLWR_39, FLWR_42)),
    "fab-reuse": ("flwr", (FLWR_39, FLWR_42)),
    "superexec-fork": ("flwr", (FLWR_39, FLWR_42)),
    "clientapp-task-end": ("flwr", (FLWR_39, FLWR_42)),
    "optimizers-without-dynamo": ("torch", ("2.13.", "2.14.")),
    "secagg-masks": ("flwr", (FLWR_39, FLWR_42)),
    "npy-headers": ("flwr", (FLWR_39, FLWR_42)),
    "engine-wakeups": ("flwr", (FLWR_39, FLWR_42)),
    "ray-app-once": ("flwr", (FLWR_39, FLWR_42)),
    "ray-two-in-flight": ("flwr", (FLWR_39, FLWR_42)),
    "ray-weights-once": ("flwr", (FLWR_39, FLWR_42)),
    "serverapp-after-ray": ("flwr", (FLWR_39, FLWR_42)),
    "sparse-node-stores": ("flwr", (FLWR_39, FLWR_42)),
    "activation-retry": ("flwr", (FLWR_39, FLWR_42)),
    "clientapp-site-checks": ("flwr", (FLWR_39, FLWR_42)),
    "reply-downloads-apart": ("flwr", (FLWR_39, FLWR_42)),
    "resident-model-hooks": ("torch", ("2.13.", "2.14.")),
}
# library -> every version prefix some patch of it was checked against
TESTED: dict[str, tuple[str, ...]] = {}
for _library, _versions in PATCHES.values():
    TESTED[_library] = tuple(dict.fromkeys((*TESTED.get(_library, ()), *_versions)))


def applies(patch: str) -> bool:
    """Whether ``patch`` was checked against the installed version of its library (a
    patch not redone for a newer line is left out there, and its caller says so)."""
    library, versions = PATCHES[patch]
    return installed(library).startswith(versions)


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
        found = installed(library)
        if found and not found.startswith(TESTED[library]):
            names = ", ".join(p for p, (lib, _) in PATCHES.items() if lib == library)
            raise UntestedVersion(
                f"{library} {found} is not a version the project's patches of it ({names}) "
                f"were checked against ({', '.join(TESTED[library])}x; pflower.patches): install "
                f"one of those, or set {SWITCH}=0 to run without the patches"
            )
