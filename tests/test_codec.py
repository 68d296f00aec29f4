"""The client path's fewer copies (client_app/codec.py, models/roles.py, the streamed
bounds' compiled moments): the same bytes on the wire, the same model, the same
bounds within float64's rounding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from flwr.common import Context, FitIns, RecordDict, ndarrays_to_parameters

from client_app.app import build_numpy_client
from client_app.codec import FastClient, npy_bytes, receives_views, to_parameters
from models.roles import set_arrays, view_arrays, wire_spec
from pflower.patches import read_only_arrays
from strategies import streaming
from strategies.robust import remove_along, update_vector, with_update
from tests.helpers import SMALL

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::2],  # neither C nor F contiguous
    np.array(3.5, dtype=np.float32),  # 0-d (BatchNorm's num_batches_tracked is int64 0-d)
    np.array(7, dtype=np.int64),
    np.zeros((0, 5), np.float32),
    np.array([True, False]),
    np.arange(6, dtype=">f4"),  # big-endian
]


@pytest.mark.parametrize("array", ARRAYS, ids=range(len(ARRAYS)))
def test_a_tensors_bytes_are_np_saves(array: np.ndarray) -> None:
    saved = io.BytesIO()
    np.save(saved, array, allow_pickle=False)
    assert npy_bytes(array) == saved.getvalue()
    assert to_parameters([array]) == ndarrays_to_parameters([array])
    (back,) = read_only_arrays(to_parameters([array]).tensors)
    assert back.dtype == array.dtype and np.array_equal(back, array)


def test_received_views_are_read_and_copied_into_the_model() -> None:
    model = torch.nn.Linear(3, 2)
    names = list(model.state_dict())
    arrays = [np.full((2, 3), 2.0, np.float32), np.array([1.0, -1.0], np.float32)]
    views = read_only_arrays(to_parameters(arrays).tensors)
    assert not views[0].flags.writeable
    set_arrays(model, names, views)  # no write into the message's bytes, no warning
    assert model.weight.detach().numpy().tolist() == arrays[0].tolist()
    shown = view_arrays(model, names)
    with torch.no_grad():
        model.bias.add_(1.0)
    assert shown[1].tolist() == [2.0, 0.0]  # a view on the model's memory
    assert [s.dtype for s in wire_spec(model, names)] == ["float32", "float32"]


def _client(method: str) -> object:
    raw = {**SMALL, "method": method, "num-server-rounds": 1}
    node = {"partition-id": 0, "num-partitions": 4}
    return build_numpy_client(Context(0, 1, node, RecordDict(), {}), raw)


@pytest.mark.parametrize("method", ["fedavg", "fedper", "fedcp"])
def test_the_fast_client_replies_what_flowers_wrapper_replies(method: str) -> None:
    """A fit through ``FastClient`` and through Flower's own NumPyClient wrapper from
    the same start: the same reply bytes; views only where ``receive`` just copies."""
    replies = []
    for fast in (True, False):
        client = _client(method)
        if fast:
            wrapped = FastClient(client)
        else:
            from flwr.compat.client.numpy_client import _wrap_numpy_client

            wrapped = _wrap_numpy_client(client)
        sent = ndarrays_to_parameters(client.get_parameters({}))
        replies.append(wrapped.fit(FitIns(sent, {"server-round": 1})))
    assert replies[0].parameters == replies[1].parameters
    assert replies[0].num_examples == replies[1].num_examples
    assert receives_views(_client(method)) == (method != "fedcp")


def test_a_resident_model_gets_the_templates_values_where_nothing_was_received() -> None:
    """The entries a resident model keeps from the last client for ``receive`` to
    overwrite are put back from the template when a message brings no tensors."""
    first = _client("fedavg")
    trained = first.fit(first.get_parameters({}), {"server-round": 1})[0]
    again = _client("fedavg")
    assert again.model is first.model and again.stale is not None  # resident, not reset
    fresh = again.get_parameters({})  # settles: the template's values
    assert any(not np.array_equal(a, b) for a, b in zip(fresh, trained))
    assert again.stale is None
    third = _client("fedavg")  # receives what it is sent: nothing put back
    third.fit(trained, {"server-round": 2})
    assert third.stale is None


def test_the_compiled_moments_move_an_update_as_the_vector_did() -> None:
    """A clipped, projected and shortened update made in one pass a tensor (streamed
    bounds) against the float64 vector path it replaced: the norm and dot within
    float64's rounding, the moved arrays within float32's (the tolerance written in
    docs/results/client-cpu.md)."""
    rng = np.random.default_rng(5)
    shapes = [(30_011,), (64, 3, 5, 5), (10,)]
    reference = [rng.normal(size=s).astype(np.float32) for s in shapes]
    upload = [(r + rng.normal(size=r.shape) * 1e-2).astype(np.float32) for r in reference]
    tensors = [0, 1, 2]
    vector = update_vector(upload, reference, tensors)
    centre = rng.normal(size=vector.size)
    centre /= np.linalg.norm(centre)
    taken = streaming.Moments(upload, reference, tensors, centre)
    assert taken.norm == pytest.approx(float(np.linalg.norm(vector)), rel=1e-13)
    assert taken.dot == pytest.approx(float(vector @ centre), rel=1e-10, abs=1e-13)
    scale = 0.5
    moved = vector * scale
    dot = float(moved @ centre)
    remove_along(moved, centre, dot)
    after = 0.25
    moved *= after
    want = with_update(upload, reference, tensors, moved)
    got = taken.rebased(scale, scale * taken.dot, after)
    length = taken.moved_norm(scale, scale * taken.dot)
    assert after * length == pytest.approx(float(np.linalg.norm(moved)), rel=1e-12)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    clipped = taken.rebased(scale, 0.0, 1.0)  # clipped only: the vector path's bits
    assert all(
        np.array_equal(a, b)
        for a, b in zip(clipped, with_update(upload, reference, tensors, vector * scale))
    )
