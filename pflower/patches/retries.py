"""``object-retries``: a message part not there yet is asked for again soon."""

from __future__ import annotations

from pflower.patches.core import UntestedVersion, check, enabled
from pflower.patches.timing import FIRST_OBJECT_RETRY, OBJECT_PATIENCE, OBJECT_RETRY_CAP


def object_retries() -> bool:
    """``object-retries``: a message part that is not there yet is asked for again
    after 0.05 s, doubling up to 0.1 s, not after 1 s up to 10 s, and as many more
    times that a part is still waited for about 250 s, as with a 0.5 s cap (a
    reply's download waited up to 0.4 s past its last part's upload). A receiver learns
    of a message before its parts have all arrived (a warm ClientApp, a SuperNode
    while the ServerApp still uploads, the ServerApp while a site still uploads its
    reply), and each wait past the arrival is time the round waits."""
    if not enabled():
        return False
    check(("flwr",))
    from flwr.supercore.inflatable import inflatable_utils as objects

    for fn in (objects.pull_objects, objects.pull_and_inflate_object_from_tree):
        if "initial_backoff" not in (fn.__kwdefaults__ or {}):  # not flwr 1.39's signature
            raise UntestedVersion(f"flwr's {fn.__name__} takes no initial_backoff")
        fn.__kwdefaults__["initial_backoff"] = FIRST_OBJECT_RETRY
        fn.__kwdefaults__["backoff_cap"] = OBJECT_RETRY_CAP
        fn.__kwdefaults__["max_tries_per_object"] = int(OBJECT_PATIENCE / OBJECT_RETRY_CAP)
    return True
