"""A client's tensors in and out of Flower's messages, with the fewest copies.

Flower's ``NumPyClient`` wrapper reads every received tensor with ``np.load`` (a
copy, which the client then copies into its model) and writes every reply tensor
with ``np.save`` into a growing ``BytesIO`` (two copies more, after the copy
``get_arrays`` made). For ResNet-18 (45 MB of float32) each copy is a pass over
the whole model, and each fresh buffer faults its pages in (docs/results/client-cpu.md).

``FastClient`` is that wrapper with the same protocol and the same bytes: a reply
tensor is its .npy header (numpy's own ``write_array_header_1_0``, made once per
dtype and shape) joined with the tensor's memory in one copy, byte for byte what
``np.save`` writes (tests/test_codec.py); a received tensor is a read-only view
on the message's bytes where the client's ``receive`` only copies it into its
model (the base ``receive`` on the base wire), else a copy as before. Deployment
sends the same bytes as before: only the copies on the way are fewer.
"""

from __future__ import annotations

from typing import Any

from flwr.client import Client
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    NDArrays,
    Parameters,
    Status,
    parameters_to_ndarrays,
)

from models.wire import npy_bytes, to_parameters
from pflower.patches import read_only_arrays

__all__ = ["FastClient", "npy_bytes", "receives_views", "to_parameters"]


def receives_views(client: Any) -> bool:
    """Whether ``client`` only copies what it receives into its model (the base
    ``receive`` on the base wire), so read-only views on the message serve."""
    from client_app.base import PFLClient
    from models.wire import Wire

    kind = type(client)
    wire = getattr(client, "wire", None)
    return (
        isinstance(client, PFLClient)
        and kind.receive is PFLClient.receive
        and type(wire).decode_down is Wire.decode_down
    )


class FastClient(Client):
    """``NumPyClient.to_client()``'s wrapper, with ``to_parameters`` and views."""

    def __init__(self, numpy_client: Any) -> None:
        self.numpy_client = numpy_client
        self.views = receives_views(numpy_client)
        numpy_client.wire.views = True  # each reply serialized here, before the model changes

    def _arrays(self, parameters: Parameters) -> NDArrays:
        if self.views:
            return read_only_arrays(parameters.tensors)
        return parameters_to_ndarrays(parameters)

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        properties = self.numpy_client.get_properties(config=ins.config)
        return GetPropertiesRes(Status(Code.OK, "Success"), properties)

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        arrays = self.numpy_client.get_parameters(config=ins.config)
        return GetParametersRes(Status(Code.OK, "Success"), to_parameters(arrays))

    def fit(self, ins: FitIns) -> FitRes:
        results = self.numpy_client.fit(self._arrays(ins.parameters), ins.config)
        arrays, num_examples, metrics = _returned(results, list, "fit")
        return FitRes(Status(Code.OK, "Success"), to_parameters(arrays), num_examples, metrics)

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        results = self.numpy_client.evaluate(self._arrays(ins.parameters), ins.config)
        loss, num_examples, metrics = _returned(results, float, "evaluate")
        return EvaluateRes(Status(Code.OK, "Success"), loss, num_examples, metrics)


def _returned(results: Any, first: type, call: str) -> tuple[Any, int, dict]:
    """A NumPyClient's (first, int, dict) reply, checked as Flower's wrapper checks it."""
    kinds = (first, int, dict)
    if len(results) != 3 or not all(isinstance(r, k) for r, k in zip(results, kinds)):
        raise TypeError(f"NumPyClient.{call} did not return ({first.__name__}, int, dict)")
    return results
