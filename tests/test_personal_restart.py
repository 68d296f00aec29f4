"""Every method's personal state survives a client restart: a client that trained a
round and saved to its site's disk store, and a new client built from scratch on the
same store (a restarted site), hold the same personal state, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays

from client_app.state import DiskStore
from methods import method_names
from tests.helpers import config, make_client, make_strategy

# methods whose round moves personal state the paper's way, checked to have moved
MOVES = {"scaffold": "own_control.", "apfl": "local_model.", "lg-fedavg": "features."}


@pytest.mark.parametrize("method", method_names())
def test_personal_state_survives_a_client_restart(method: str, tmp_path) -> None:
    cfg = config(method=method)
    store = DiskStore(tmp_path, "exp", "client-0")
    client, _ = make_client(cfg)
    client.store = store  # a deployed site's store, on disk
    before = {k: v.copy() for k, v in client.personal_state().items()}
    payload = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    client.fit(payload, {"server-round": 1})
    kept = {k: v.copy() for k, v in client.personal_state().items()}
    restarted, _ = make_client(cfg)  # a new process: built from the template, then restored
    restarted.store = store
    restarted.restore_personal()
    again = restarted.personal_state()
    assert sorted(again) == sorted(kept)  # empty both, for a method that keeps nothing
    for name, value in kept.items():
        assert again[name].dtype == value.dtype and np.array_equal(again[name], value), name
    if method in MOVES:
        moved = [k for k in kept if MOVES[method] in k and not np.array_equal(kept[k], before[k])]
        assert moved, f"{method}: a round left its personal state where it started"
