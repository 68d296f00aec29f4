"""``secagg-masks``: SecAgg+ masks from a cryptographic PRF (flwr issue #7522)."""

from __future__ import annotations

from typing import Any

from pflower.flower_lines import installed
from pflower.patches.core import PATCHES, UntestedVersion, applies

# The SecAgg+ protocol this build speaks: carried in the set-up stage's config, so a
# peer with Flower's own masks (or another version) refuses the round instead of
# unmasking garbage. Bump it with any change to the masks or the key signatures.
SECAGG_PROTOCOL = "pflower-secagg+/aes256ctr-masks/signed-keys/1"


def mask_arrays(seed: bytes, num_range: int, shapes: list[tuple[int, ...]]) -> list[Any]:
    """SecAgg+ masks: int64 arrays of ``shapes``, uniform over [0, num_range).

    AES-256 in counter mode (``cryptography``, as Flower's own SecAgg+ uses) keyed by
    SHA-256 of the whole seed: the keystream is a PRF of all of the seed's bits
    (Flower's ``pseudo_rand_gen`` kept 32 of them). Each value is 8 keystream bytes
    reduced mod ``num_range``: exact for a power of two (Flower's default 2**32),
    otherwise biased by less than num_range / 2**64. Flower draws from
    [0, num_range - 1); this draws from [0, num_range): uniform over the modulus."""
    import hashlib

    import numpy as np
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if num_range < 2:
        raise ValueError(f"SecAgg+ modulus {num_range} is below 2")
    sizes = [int(np.prod(shape)) for shape in shapes]
    key = hashlib.sha256(b"pflower-secagg-mask\x00" + seed).digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    words = np.frombuffer(stream.update(bytes(8 * sum(sizes))), dtype="<u8")
    if num_range & (num_range - 1) == 0:
        values = (words & np.uint64(num_range - 1)).astype(np.int64)
    else:
        values = (words % np.uint64(num_range)).astype(np.int64)
    out, start = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        out.append(values[start : start + size].reshape(shape))
        start += size
    return out


def secagg_masks() -> bool:
    """``secagg-masks``: Flower's SecAgg+ client mod and server workflow draw their
    masks from ``mask_arrays`` (both import ``pseudo_rand_gen`` by name, so both
    names are replaced). Applied in every process that masks or unmasks, whatever
    the patch switch says. Returns whether it is in place."""
    from importlib import import_module

    # by full name: each package re-exports a function of the same name as its module
    client = import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    utils = import_module("flwr.common.secure_aggregation.secaggplus_utils")
    server = import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow")

    if getattr(utils, "_pflower_masks", False):
        return True
    if not applies("secagg-masks"):
        raise UntestedVersion(
            f"flwr {installed('flwr')}: the SecAgg+ mask patch (pflower.patches.secagg_masks) "
            f"was checked against flwr {', '.join(PATCHES['secagg-masks'][1])}x only; secure "
            "aggregation refuses to run"
        )
    utils._flower_pseudo_rand_gen = utils.pseudo_rand_gen  # kept for the benchmark
    for module in (utils, client, server):
        module.pseudo_rand_gen = mask_arrays
    utils._pflower_masks = True
    return True
