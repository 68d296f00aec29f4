"""The waits the polling patches use (supernode-backoff, fleet-long-poll, object-retries)."""

from __future__ import annotations

FIRST_WAIT, GROWTH = 0.1, 1.5
FLOWER_IDLE_WAIT = 3.0  # start_client_internal's sleep when no message came
LOCAL_WAIT = 0.02  # in place of its 0.5 s polls of the node's own state
FIRST_OBJECT_RETRY = 0.05  # Flower's first retry of a missing object: 1 s
OBJECT_RETRY_CAP = 0.1  # Flower's longest wait between retries: 10 s
OBJECT_PATIENCE = 250.0  # about how long a missing part is asked for before the pull fails
LONG_POLL = 2.0  # how long a patched SuperLink holds a SuperNode's empty pull open
LONG_POLLS_HELD = 100  # at most this many at once (of Flower's 1,000 gRPC Fleet threads)
# over HTTP Fleet (flwr 1.42) a pull holds one of the threads FastAPI runs its sync
# routes on (anyio's default limiter: 40), which the Runtime API's pushes need too
HTTP_API_THREADS = 40
HELD_PULL = 0.5 * LONG_POLL  # an empty pull this long was held open
ENGINE_POLL = 0.1  # s between the simulation engine's looks for instructions (Flower's)
