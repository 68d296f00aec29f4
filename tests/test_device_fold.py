"""A streamed round's sum and bounds on the clients' device (strategies/device_fold.py),
run here on the CPU through torch: the sum the host kernel's bits, the bounds within
float64's rounding, and a whole streamed run, bounds acting, within float32's of the
host's (the tolerance in docs/results/client-cpu.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from strategies import streaming
from strategies.device_fold import DeviceMoments, DeviceRunningMean, fold_device
from strategies.robust import RunningMean
from tests.helpers import config, make_strategy
from tests.test_streaming import _near, _round


def test_the_device_sum_is_the_host_kernels_bits_in_any_order() -> None:
    rng = np.random.default_rng(3)
    shapes = [(1000,), (7, 9), ()]
    uploads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(6)]
    weights = [3.0, 40.0, 1.0, 17.0, 5.0, 2.0]
    host, device = RunningMean(), DeviceRunningMean(torch.device("cpu"))
    for u, w in zip(uploads, weights):
        host.add(u, w)
    for u, w in reversed(list(zip(uploads, weights))):
        device.add(u, w)
    for a, b in zip(host.mean(), device.mean(), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_every_copy_of_the_mean_is_the_exact_mean_of_float64_replies_that_cancel() -> None:
    """The round's mean is written once per array library (the compiled host kernel,
    torch on a device): with float64 replies whose terms cancel, a sum without TwoSum's
    compensation loses the small terms; each copy must give the exactly rounded mean
    (math.fsum's) and so each other's bits."""
    import math

    rng = np.random.default_rng(11)
    big = rng.normal(size=1000) * 1e16
    small = rng.normal(size=1000)
    uploads = [[big], [small], [-big], [0.5 * small]]  # the big terms cancel in the sum
    weights = [1.0, 3.0, 1.0, 2.0]
    total = sum(weights)
    exact = np.array(
        [
            math.fsum(w * float(u[0][i]) for u, w in zip(uploads, weights)) / total
            for i in range(1000)
        ]
    )
    for mean in (RunningMean(), DeviceRunningMean(torch.device("cpu"))):
        for u, w in zip(uploads, weights):
            mean.add(u, w)
        (got,) = mean.mean()
        assert got.dtype == np.float64
        assert np.array_equal(got, exact), f"{type(mean).__name__}: {np.sum(got != exact)} differ"


def test_the_device_moments_are_the_hosts_within_rounding() -> None:
    rng = np.random.default_rng(4)
    reference = [rng.normal(size=s).astype(np.float32) for s in [(5000,), (8, 3, 3)]]
    upload = [(r + 0.01 * rng.normal(size=r.shape)).astype(np.float32) for r in reference]
    size = sum(a.size for a in upload)
    centre = rng.normal(size=size)
    centre /= np.linalg.norm(centre)
    host = streaming.Moments(upload, reference, [0, 1], centre)
    dev = DeviceMoments(upload, reference, [0, 1], centre, torch.device("cpu"))
    assert dev.norm == pytest.approx(host.norm, rel=1e-12)
    assert dev.dot == pytest.approx(host.dot, rel=1e-9, abs=1e-12)
    assert dev.moved_norm(0.5, 0.1) == pytest.approx(host.moved_norm(0.5, 0.1), rel=1e-12)
    for a, b in zip(host.rebased(0.5, 0.1, 0.7), dev.rebased(0.5, 0.1, 0.7), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_streamed_run_on_the_device_ends_where_the_hosts_ends() -> None:
    """Three rounds of nine replies, one of them scaled (clipped) and one flipped
    (projected): the device fold's global model within float32 rounding of the
    host's, the same replies clipped and turned."""
    runs = []
    for device in (None, torch.device("cpu")):
        strategy = make_strategy(config(method="fedavg"))
        strategy.fold_device = device
        rng = np.random.default_rng(0)
        common = [0.01 * rng.normal(size=a.shape) for a in strategy.global_arrays]
        for rnd in range(1, 4):
            start = strategy.global_arrays
            uploads = [_near(start, rng, common) for _ in range(9)]
            uploads[3] = [s + 20 * (u - s) for s, u in zip(start, uploads[3])]  # scaled
            uploads[5] = [s - (u - s) for s, u in zip(start, uploads[5])]  # flipped
            assert _round(strategy, rnd, uploads, [40] * 9)
        runs.append(strategy)
    host, dev = runs
    for a, b in zip(host.global_arrays, dev.global_arrays, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for r in (1, 2, 3):
        h, d = host.rounds[r].extra, dev.rounds[r].extra
        assert h["updates_clipped"] == d["updates_clipped"] >= 1
        assert h["against_the_round"] == d["against_the_round"]


def test_the_fold_runs_on_the_clients_gpu_only() -> None:
    assert fold_device(["cpu", "cpu"]) is None
    assert fold_device(["cuda", "cpu"]) is None
    if not torch.cuda.is_available():
        assert fold_device(["cuda:0"] * 2) is None and fold_device(["", ""]) is None
