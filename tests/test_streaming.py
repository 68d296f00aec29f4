"""Streamed aggregation (strategies/streaming.py): a round folds each reply as it
arrives and drops it; the result does not depend on the arrival order, equals the
held round's where no bound differs, and the bounds still hold an attacker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.common import FitRes

from strategies import kernels, streaming
from strategies.outcome import NodeFailed
from strategies.robust import (
    PREVIOUS,
    direction_of,
    remove_along,
    update_vector,
    weighted_mean,
    with_update,
)
from strategies.streaming import RESERVOIR, FoldingProxy, RunningMean, reservoir_nodes
from tests.helpers import FakeProxy, config, fit_res, make_strategy, update_norm


class Replying(FakeProxy):
    """A client whose fit returns a prepared reply."""

    def __init__(self, node_id: int, res: FitRes) -> None:
        super().__init__(node_id)
        self.res = res

    def fit(self, *a: Any, **k: Any) -> FitRes:
        return self.res


def _near(start: list[np.ndarray], rng: np.random.Generator, common: list | None = None) -> list:
    """An upload as training makes one: the round's common direction plus its own."""
    common = common or [0.0] * len(start)
    return [
        (a + c + 0.01 * rng.normal(size=a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a
        for a, c in zip(start, common)
    ]


def _round(strategy, rnd: int, uploads: list, counts: list[int], order=None) -> bool:  # noqa: ANN001
    """One round through configure's hook: each reply folded as Flower's loop would
    call it (in ``order``); returns whether the round was streamed."""
    nodes = list(range(len(uploads)))
    strategy.streamed = strategy.open_streamed_round(rnd, nodes)
    streamed = strategy.streamed is not None
    pairs = [Replying(k, fit_res(u, f"c{k}", n)) for k, (u, n) in enumerate(zip(uploads, counts))]
    results = []
    for k in order if order is not None else range(len(pairs)):
        proxy = pairs[k]
        if streamed:
            proxy = FoldingProxy(proxy, strategy.streamed)
        res = proxy.fit(None, None, None)
        if streamed:
            assert res.parameters.tensors == []  # dropped once folded
        results.append((proxy, res))
    strategy.aggregate_fit(rnd, results, [])
    return streamed


def _clean_rounds(raw: dict, order=None, rounds: int = 3, n: int = 9) -> tuple:  # noqa: ANN001
    strategy = make_strategy(config(method="fedavg", **raw))
    rng = np.random.default_rng(0)
    streamed = []
    common = [0.01 * rng.normal(size=a.shape) for a in strategy.global_arrays]  # a drift
    for rnd in range(1, rounds + 1):
        start = strategy.global_arrays
        uploads = [_near(start, rng, common) for _ in range(n)]
        counts = [40 + 3 * k for k in range(n)]
        streamed.append(_round(strategy, rnd, uploads, counts, order))
    return strategy, streamed


@pytest.mark.parametrize("bounds", ["off", "defaults"])
def test_a_streamed_round_equals_the_held_round_and_ignores_the_arrival_order(bounds: str) -> None:
    raw = {"weight-cap": 0.0, "update-norm-bound": 0.0, "direction-check-from": 0}
    raw = raw if bounds == "off" else {}
    held, was = _clean_rounds({**raw, "streamed-aggregation": False})
    assert was == [False, False, False]
    streamed, was = _clean_rounds(raw)
    assert was == [True] * 3
    shuffled, _ = _clean_rounds(raw, order=[4, 8, 0, 2, 7, 1, 6, 3, 5])
    for a, b, c in zip(held.global_arrays, streamed.global_arrays, shuffled.global_arrays):
        assert a.dtype == b.dtype and np.array_equal(b, c)
        if bounds == "off":
            assert np.array_equal(a, b)
    if bounds == "defaults":  # clean replies: no bound acts in either, so the sums agree
        for a, b in zip(held.global_arrays, streamed.global_arrays):
            assert np.array_equal(a, b)
        record = streamed.rounds[3].extra
        assert record["aggregation_streamed"] and record["updates_clipped"] == 0
        assert record["against_the_round"] == 0
    assert streamed.rounds[3].replies == 9 and len(streamed.rounds[3].train_samples_by_client) == 9


def test_a_streamed_round_holds_one_sum_and_a_few_replies() -> None:
    """40 replies in the order Flower sends them (the reservoir's nodes first): at
    most the reservoir's replies wait at once, then each is folded and dropped."""
    strategy = make_strategy(config(method="fedavg"))
    rng = np.random.default_rng(1)
    nodes = list(range(40))
    state = strategy.streamed = strategy.open_streamed_round(1, nodes)
    model = sum(a.nbytes for a in strategy.global_arrays)
    sent = streaming.folding(
        state,
        [
            (Replying(k, fit_res(_near(strategy.global_arrays, rng), f"c{k}")), None, None)
            for k in nodes
        ],
    )
    assert {p.node_id for p, _, _ in sent[:RESERVOIR]} == state.members
    for proxy, _, _ in sent:
        assert proxy.fit(None, None, None).parameters.tensors == []
    strategy.aggregate_fit(1, [], [])
    assert all(r.arrays == [] for r in state.kept) and len(state.kept) == 40
    assert state.most_waiting <= RESERVOIR
    assert strategy.rounds[1].extra["replies_held_at_once"] <= RESERVOIR
    assert sum(a.nbytes for a in state.sum.hi + state.sum.lo) <= 4 * model  # two float64 sums


def test_a_streamed_round_reads_replies_in_place_and_writes_none() -> None:
    """The fold reads each reply's arrays as read-only views on its received bytes (no
    copy): the replies waiting for the reservoir hold such views, and the round, whose
    bounds act on a reply (a scaled one is clipped: new arrays, never a write into the
    received ones), ends as the held round ends."""
    raw = {"update-norm-bound": 2.0}
    strategy = make_strategy(config(method="fedavg", **raw))
    held = make_strategy(config(method="fedavg", **raw, **{"streamed-aggregation": False}))
    rng = np.random.default_rng(3)
    start = strategy.global_arrays
    uploads = [_near(start, rng) for _ in range(RESERVOIR)]  # the reservoir: the whole round
    uploads[1] = [(s + 50 * (u - s)).astype(u.dtype) for s, u in zip(start, uploads[1])]
    nodes = list(range(len(uploads)))
    state = strategy.streamed = strategy.open_streamed_round(1, nodes)
    sent = streaming.folding(
        state, [(Replying(k, fit_res(uploads[k], f"c{k}")), None, None) for k in nodes]
    )
    for proxy, _, _ in sent[:2]:  # two of the reservoir's replies: they wait
        proxy.fit(None, None, None)
    assert len(state.pending) == 2
    for reply in state.pending:
        assert all(not a.flags.writeable and not a.flags.owndata for a in reply.arrays)
    for proxy, _, _ in sent[2:]:
        proxy.fit(None, None, None)
    strategy.aggregate_fit(1, [], [])
    assert strategy.rounds[1].extra["updates_clipped"] == 1
    _round(held, 1, uploads, [10] * len(uploads))
    for a, b in zip(held.global_arrays, strategy.global_arrays, strict=True):
        assert np.array_equal(a, b)


def test_the_reservoir_waits_for_a_failed_node_no_more_and_falls_back_to_the_round() -> None:
    """A reservoir node that fails is waited for no longer; a round whose reservoir
    gave no acceptable reply judges its replies at its end as a held round does."""
    rng = np.random.default_rng(4)
    for broken in ("one", "all"):
        strategy = make_strategy(config(method="fedavg"))
        nodes = list(range(12))
        state = strategy.streamed = strategy.open_streamed_round(1, nodes)
        bad = sorted(state.members)[:1] if broken == "one" else sorted(state.members)
        for k in nodes:
            proxy = FoldingProxy(
                Replying(k, fit_res(_near(strategy.global_arrays, rng), f"c{k}")), state
            )
            if k in bad:
                proxy.inner.fit = lambda *a, **kw: (_ for _ in ()).throw(TimeoutError("gone"))
                with pytest.raises(NodeFailed, match=f"node {k}: gone"):  # names its node
                    proxy.fit(None, None, None)
            else:
                proxy.fit(None, None, None)
        if broken == "one":
            assert state.limits is not None and not state.pending  # fixed once it failed
        else:
            assert state.limits is None and len(state.pending) == 12 - len(bad)
        strategy.aggregate_fit(1, [], [])
        assert len(state.kept) == 12 - len(bad)


def test_the_running_mean_is_the_weighted_mean_in_any_order() -> None:
    rng = np.random.default_rng(2)
    arrays = [
        [(rng.normal(size=(50,)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)]
        for _ in range(30)
    ]
    weights = [float(w) for w in rng.integers(1, 5000, size=30)]
    want = sum(w * a[0].astype(np.float64) for w, a in zip(weights, arrays)) / sum(weights)
    got = weighted_mean(arrays, weights)[0]
    assert got.dtype == np.float32 and np.allclose(got, want, rtol=1e-6)
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(30)
        total = RunningMean()
        for i in order:
            total.add(arrays[i], weights[i])
        assert np.array_equal(total.mean()[0], got)


def test_a_sum_reuses_a_finished_sums_buffers_with_the_same_bits() -> None:
    """A sum started from a finished one's buffers (``release``) zeroes and reuses them
    and gives a fresh sum's bits; buffers of other shapes are not taken; the mean is
    numpy's expression to the bit, in every dtype."""
    rng = np.random.default_rng(3)
    shapes = [(7, 3), (5,)]
    rounds = [
        [[(rng.normal(size=s) * 10.0 ** rng.integers(-3, 4)).astype(np.float32) for s in shapes]
         for _ in range(6)]
        for _ in range(2)
    ]  # fmt: skip
    weights = [float(w) for w in rng.integers(1, 5000, size=6)]
    first = RunningMean()
    for arrays, w in zip(rounds[0], weights):
        first.add(arrays, w)
    buffers = first.release()
    assert buffers is not None and first.count == 0 and first.release() is None
    reused, fresh = RunningMean(buffers), RunningMean()
    for arrays, w in zip(rounds[1], weights):
        reused.add(arrays, w)
        fresh.add(arrays, w)
    assert all(a is b for a, b in zip(reused.hi + reused.lo, buffers[0] + buffers[1]))
    for a, b in zip(reused.mean(), fresh.mean()):
        assert a.dtype == np.float32 and np.array_equal(a, b)
    for got, hi, lo in zip(fresh.mean(), fresh.hi, fresh.lo):
        assert np.array_equal(got, ((hi + lo) / fresh.total).astype(np.float32))
    other = RunningMean(fresh.release())
    other.add([np.ones(4, np.float32)], 1.0)  # another shape: fresh buffers
    assert other.hi[0].shape == (4,) and other.mean()[0].tolist() == [1.0] * 4
    for dtype in (np.float64, np.float16):  # compiled, and numpy's expression
        total = RunningMean()
        total.add([np.full(3, 0.1, dtype)], 3.0)
        total.add([np.full(3, 0.7, dtype)], 1.0)
        hi, lo = total.hi[0], total.lo[0]
        assert np.array_equal(total.mean()[0], ((hi + lo) / 4.0).astype(dtype))


def test_streamed_rounds_pass_their_sums_buffers_on() -> None:
    """Each streamed round's sum takes the buffers the round before it left, once."""
    strategy, was = _clean_rounds({}, rounds=2)
    assert was == [True, True] and strategy.spare_sum is not None
    left = strategy.spare_sum
    state = strategy.open_streamed_round(3, list(range(9)))
    assert strategy.spare_sum is None and state.sum.spare is left


def test_the_direction_reference_is_the_unit_change_in_numpys_bits() -> None:
    """The round's direction (divided in place) is ``change / |change|`` to the bit,
    over the float tensors only; no change has no direction."""
    rng = np.random.default_rng(4)
    before = [rng.normal(size=(6, 5)).astype(np.float32), np.arange(3), rng.normal(size=4)]
    after = [before[0] + np.float32(0.01), before[1] + 1, before[2] * 1.5]
    change = np.concatenate(
        [(after[0].astype(np.float64) - before[0]).ravel(), (after[2] - before[2]).ravel()]
    )
    got = direction_of(before, after)
    assert got is not None and np.array_equal(got, change / np.linalg.norm(change))
    assert direction_of(before, before) is None


def test_the_reservoir_is_the_same_nodes_in_any_order() -> None:
    nodes = list(range(50))
    chosen = [
        reservoir_nodes(7, list(np.random.default_rng(s).permutation(nodes))) for s in range(3)
    ]
    assert chosen[0] == chosen[1] == chosen[2] and len(chosen[0]) == RESERVOIR
    assert reservoir_nodes(8, nodes) != chosen[0]  # another round, another reservoir
    assert reservoir_nodes(7, nodes[:5]) == set(nodes[:5])  # a small round: all of it


@pytest.mark.parametrize("attack", ["scaled-update", "sign-flip"])
def test_the_bounds_hold_an_attacker_in_a_streamed_round(attack: str) -> None:
    """Twelve replies, the references from a reservoir of 8. A 1000x update claiming
    1e15 examples moves the model at most 3x a typical honest update (weight capped,
    norm clipped); a negated update just under the norm bound is projected off the
    previous aggregate's direction, so the aggregate keeps pointing with the honest
    mean (the reference: round 1's aggregate update). Without the bounds the same
    reply takes the aggregate over."""
    outcome = {}
    for defended in (True, False):
        raw = {} if defended else {"weight-cap": 0.0, "update-norm-bound": 0.0}
        if not defended:
            raw["direction-check-from"] = 0
        strategy = make_strategy(config(method="fedavg", **raw))
        rng = np.random.default_rng(3)
        common = [0.01 * rng.normal(size=a.shape) for a in strategy.global_arrays]

        _round(
            strategy, 1, [_near(strategy.global_arrays, rng, common) for _ in range(6)], [48] * 6
        )
        # the last aggregate's direction is round 2's direction reference
        assert strategy.norm_history.direction is not None
        start = [a.copy() for a in strategy.global_arrays]
        good = [_near(start, rng, common) for _ in range(11)]
        typical = sorted(update_norm(g, start) for g in good)[5]
        if attack == "scaled-update":
            bad = [(s + 1000.0 * (g - s)).astype(g.dtype) for s, g in zip(start, good[0])]
        else:
            scale = -0.99 * 3.0 * typical / update_norm(good[0], start)
            bad = [(s + scale * (g - s)).astype(g.dtype) for s, g in zip(start, good[0])]
        assert _round(strategy, 2, [*good, bad], [48] * 11 + [10**15])  # streamed
        moved = update_norm(strategy.global_arrays, start)
        honest_mean = [np.mean([g[i] for g in good], axis=0) for i in range(len(start))]
        da = np.concatenate(
            [(x.astype(np.float64) - s).ravel() for x, s in zip(strategy.global_arrays, start)]
        )
        db = np.concatenate(
            [(x.astype(np.float64) - s).ravel() for x, s in zip(honest_mean, start)]
        )
        outcome[defended] = (
            moved / typical,
            float(da @ db / np.linalg.norm(da) / np.linalg.norm(db)),
        )
        if defended:
            extra = strategy.rounds[2].extra
            assert extra["aggregation_streamed"] and extra["weights_capped"] == 1
            if attack == "sign-flip":
                assert extra["against_the_round"] == 1
    assert outcome[True][0] <= 3.0 * 1.1, outcome
    assert outcome[True][1] >= 0.5, outcome
    if attack == "scaled-update":  # the attack is real without the bounds
        assert outcome[False][0] > 100, outcome
    else:
        assert outcome[False][1] < 0, outcome


@pytest.mark.parametrize(
    "raw",
    [
        {"method": "fedavg", "aggregation": "median"},
        {"method": "fedavg", "dp-mode": "server", "dp-noise-multiplier": 0.5},
        {"method": "factorized-fl-beta"},
        {"method": "fedavg", "streamed-aggregation": False},
    ],
)
def test_rules_that_need_every_reply_hold_the_round(raw: dict) -> None:
    strategy = make_strategy(config(**raw))
    assert strategy.held_reason and strategy.open_streamed_round(2, [1, 2]) is None


def test_through_flowers_round_loop_a_streamed_run_ends_where_a_held_run_ends(tmp_path) -> None:  # noqa: ANN001
    """The in-process engine (Flower's own round loop calls each FoldingProxy): with
    the bounds off every round is streamed, and the run's per-client accuracies and
    losses equal the held run's; with the defaults rounds 2-3 are streamed."""
    from pflower.engine.inprocess import run_inprocess

    off = {"weight-cap": 0.0, "update-norm-bound": 0.0, "direction-check-from": 0}
    base = {"method": "fedavg", "num-server-rounds": 3, "sim-samples": 60, "hidden-dim": 16}
    base["output-dir"] = str(tmp_path)
    runs = {}
    for name, raw in {
        "held": {**off, "streamed-aggregation": False},
        "streamed": off,
        "defaults": {},
    }.items():
        runs[name] = run_inprocess({**base, **raw, "run-name": name}, 4)["rounds"]
    streamed = [bool(r.get("aggregation_streamed")) for r in runs["streamed"]]
    assert streamed == [True, True, True]
    assert not any(r.get("aggregation_streamed") for r in runs["held"])
    assert [bool(r.get("aggregation_streamed")) for r in runs["defaults"]] == [True, True, True]
    for a, b in zip(runs["held"], runs["streamed"]):
        assert a["per_client_accuracy"] == b["per_client_accuracy"]
        assert a["per_client_train_loss"] == b["per_client_train_loss"]


def test_a_checkpoint_keeps_the_bounds_history() -> None:
    """A resumed run's next round is judged as the uninterrupted run's would be."""
    strategy, _ = _clean_rounds({}, rounds=2)
    assert strategy.norm_history.direction is not None and strategy.norm_history.values()
    saved = strategy.server_state()
    # the model before the last round, in its own dtype, stands for the float64 direction
    previous = [saved[f"{PREVIOUS}{i}"] for i in range(len(strategy.global_arrays))]
    assert "bounds/direction" not in saved
    assert [a.dtype for a in previous] == [a.dtype for a in strategy.global_arrays]
    resumed = make_strategy(config(method="fedavg"))
    resumed.restore_server_state(saved)
    assert np.array_equal(resumed.norm_history.direction, strategy.norm_history.direction)
    assert list(resumed.norm_history.rounds) == list(strategy.norm_history.rounds)
    # a checkpoint that kept the direction itself (written before) still gives it
    kept = {k: v for k, v in saved.items() if not k.startswith(PREVIOUS)}
    kept["bounds/direction"] = strategy.norm_history.direction
    earlier = make_strategy(config(method="fedavg"))
    earlier.restore_server_state(kept)
    assert np.array_equal(earlier.norm_history.direction, strategy.norm_history.direction)
    older = {k: v for k, v in saved.items() if not k.startswith("bounds/")}
    fresh = make_strategy(config(method="fedavg"))
    fresh.restore_server_state(older)  # a checkpoint from before: no history, no error
    assert fresh.norm_history.direction is None and not fresh.norm_history.values()


def test_the_compiled_running_sum_is_numpys_twosum_bit_for_bit() -> None:
    """The sum's compiled kernel gives, bit for bit, numpy's TwoSum over whole tensors:
    float32 of magnitudes far apart (every addition rounds), a float64, an int64 (a
    BatchNorm counter), a transposed (non-contiguous) tensor and a 0-d one."""
    rng = np.random.default_rng(5)
    shapes = [(50_017,), (5, 7), (), (4, 6), (3,), (6, 4)]

    def upload() -> list[np.ndarray]:
        wide = rng.normal(size=shapes[0]) * 10.0 ** rng.integers(-8, 3, size=shapes[0])
        return [
            wide.astype(np.float32),
            rng.normal(size=shapes[1]).astype(np.float32),
            np.float32(rng.normal()).reshape(()),
            rng.normal(size=shapes[3]),
            rng.integers(0, 10**6, size=shapes[4]),
            rng.normal(size=(4, 6)).astype(np.float32).T,
        ]

    uploads = [upload() for _ in range(6)]
    weights = [float(w) for w in rng.integers(1, 500, size=6)]
    total = RunningMean()
    hi = [np.zeros(s) for s in shapes]
    lo = [np.zeros(s) for s in shapes]
    for arrays, w in zip(uploads, weights):
        total.add(arrays, w)
        for i, a in enumerate(arrays):
            x = a.astype(np.float64) * w
            s = hi[i] + x
            back = s - hi[i]
            lo[i] = lo[i] + ((x - back) + (hi[i] - (s - back)))
            hi[i] = s
    assert any(np.any(x != 0) for x in lo)  # the error terms are exercised
    for mine, want in zip(total.hi + total.lo, hi + lo):
        assert mine.shape == want.shape and np.array_equal(mine, want)
    assert [m.dtype for m in total.mean()] == [a.dtype for a in uploads[0]]


def test_the_compiled_projection_and_rebase_are_numpys_bit_for_bit() -> None:
    """``remove_along`` and ``with_update`` give numpy's ``d - (d @ u) * u`` and
    ``(reference + d).astype(dtype)`` to the bit: float32 and float64 tensors beside
    an int64 one (taken by numpy), a non-contiguous reference, values far apart."""
    rng = np.random.default_rng(11)
    shapes = [(40_003,), (3, 5), (7,), (4, 6)]
    reference = [
        (rng.normal(size=shapes[0]) * 10.0 ** rng.integers(-6, 4, size=shapes[0])).astype(
            np.float32
        ),
        rng.normal(size=shapes[1]),
        rng.integers(0, 100, size=shapes[2]),
        rng.normal(size=(6, 4)).astype(np.float32).T,
    ]
    upload = [(r + rng.normal(size=r.shape) * 1e-3).astype(r.dtype) for r in reference]
    tensors = [0, 1, 3]
    update = update_vector(upload, reference, tensors)
    unit = rng.normal(size=update.size)
    unit /= np.linalg.norm(unit)
    dot = float(update @ unit)
    want = update - dot * unit
    remove_along(update, unit, dot)
    assert np.array_equal(update, want)
    rebuilt = with_update(upload, reference, tensors, update)
    at = 0
    for t, (u, r) in enumerate(zip(upload, reference)):
        if t not in tensors:
            assert rebuilt[t] is u
            continue
        part = update[at : at + u.size].reshape(u.shape)
        at += u.size
        assert rebuilt[t].dtype == u.dtype and np.array_equal(
            rebuilt[t], (r + part).astype(u.dtype)
        )


def test_warming_builds_the_kernels_a_round_calls() -> None:
    """``kernels.warm`` builds every signature a streamed round then calls (a float32
    model's sum, projection and rebase): the round's own calls build none more."""
    compiled = (kernels.two_sum, kernels.mean_of, kernels.rebase, kernels.remove_along)
    for fn in (*compiled, kernels.warm):
        fn.cache_clear()  # fresh dispatchers, nothing built in them yet
    kernels.warm((np.dtype(np.float32),), True).join()
    built = {f: len(f().signatures) for f in compiled}
    assert all(built.values())
    reference = [np.ones((4, 3), np.float32), np.zeros(5, np.float32)]
    upload = [r + np.float32(0.5) for r in reference]
    update = update_vector(upload, reference, [0, 1])
    unit = update / np.linalg.norm(update)
    remove_along(update, unit, 0.5)
    total = RunningMean()
    total.add(with_update(upload, reference, [0, 1], update), 2.0)
    total.mean()
    assert {f: len(f().signatures) for f in built} == built


def test_kernels_compile_without_a_writable_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where numba finds nowhere to cache (a read-only install), a kernel is compiled
    in the process instead of failing."""
    import numba

    real = numba.njit

    def no_cache(**options: Any) -> Any:
        if options.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return real(**options)

    monkeypatch.setattr(numba, "njit", no_cache)

    def double(x: np.ndarray) -> None:
        for i in range(x.size):
            x[i] *= 2.0

    x = np.arange(3.0)
    kernels._njit()(double)(x)
    assert x.tolist() == [0.0, 2.0, 4.0]


def test_each_reply_has_its_update_and_norm_taken_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 clean replies under the default bounds: each reply's update is measured once
    (its norm, in one pass, whether it waited for the reservoir, measured on the worker
    that received it and read by the worker that fixes the references, or was judged
    on arrival) and never written out as a vector (a direction is there after round 1)."""
    made: list[np.ndarray] = []
    measured: list[int] = []
    for name in ("update_of", "update_vector"):
        real = getattr(streaming, name, None)
        if real is not None:
            monkeypatch.setattr(
                streaming, name, lambda *a, _real=real: made.append(_real(*a)) or made[-1]
            )
    centred: list[int] = []
    real_median = streaming.median_update
    monkeypatch.setattr(
        streaming, "median_update", lambda r, *a: centred.append(len(r)) or real_median(r, *a)
    )
    real_moments = streaming.Moments.__init__

    def moments(self, upload, *rest) -> None:  # noqa: ANN001
        measured.append(id(upload))
        real_moments(self, upload, *rest)

    monkeypatch.setattr(streaming.Moments, "__init__", moments)
    strategy = make_strategy(config(method="fedavg"))
    rng = np.random.default_rng(1)
    common = [0.01 * rng.normal(size=a.shape) for a in strategy.global_arrays]  # a drift
    nodes = list(range(40))
    state = strategy.streamed = strategy.open_streamed_round(1, nodes)
    sent = streaming.folding(
        state,
        [
            (Replying(k, fit_res(_near(strategy.global_arrays, rng, common), f"c{k}")), None, None)
            for k in nodes
        ],
    )
    for proxy, _, _ in sent:
        proxy.fit(None, None, None)
    strategy.aggregate_fit(1, [], [])
    assert len(state.kept) == 40 and strategy.rounds[1].extra["against_the_round"] == 0
    assert centred == [RESERVOIR]  # the round's median centre: the reservoir's updates only
    assert not made  # ... taken a slice at a time: no update written out whole
    # each reply measured once on arrival or while it waited, then judged (the
    # reservoir's replies: their norm kept, their dot with the centre taken once)
    assert len(measured) == 40 + RESERVOIR


def test_a_streamed_round_rejects_what_the_held_round_rejects_with_the_same_reasons() -> None:
    """The fold reads a reply's values in its moments' pass (not a check pass of their
    own): a NaN, an infinity or a value above max-abs-value rejects the reply with the
    held check's first reason, also where a later tensor has the wrong shape too; a
    rejected reply is not summed and binds no key."""
    strategy = make_strategy(config(method="fedavg"))
    start = strategy.global_arrays
    rng = np.random.default_rng(6)
    uploads = [_near(start, rng) for _ in range(6)]
    floats = [t for t, a in enumerate(start) if a.dtype.kind == "f"]
    first, last = floats[0], floats[-1]
    uploads[1][first].flat[3] = np.nan
    uploads[2][last].flat[0] = np.inf
    uploads[3][first].flat[-1] = 2e6  # above the default max-abs-value, 1e6
    uploads[4][first].flat[0] = np.nan  # and a tensor of another shape after it
    uploads[4][last] = np.zeros(uploads[4][last].size + 1, uploads[4][last].dtype)
    reasons = {}
    for streamed in (True, False):
        raw = {} if streamed else {"streamed-aggregation": False}
        strategy = make_strategy(config(method="fedavg", **raw))
        assert _round(strategy, 1, [[a.copy() for a in u] for u in uploads], [10] * 6) == streamed
        reasons[streamed] = sorted(strategy.rounds[1].rejected)
        assert strategy.rounds[1].replies == 2
        assert set(strategy.clients.key_owner) == {"c0", "c5"}
    assert reasons[True] == reasons[False] and len(reasons[True]) == 4
    assert "non-finite values" in reasons[True][0] and "non-finite" in reasons[True][3]
    assert "max-abs-value" in reasons[True][2]


def test_the_moments_pass_counts_bad_values_and_sums_within_rounding_of_an_exact_sum() -> None:
    """``reply_moments`` (its sums reassociated, vectorized): the norm and the dot within
    1e-12 of ``math.fsum`` over the same float64 terms; NaN, both infinities and values
    above the limit counted, the limit itself not."""
    import math

    rng = np.random.default_rng(7)
    reference = [rng.normal(size=n).astype(np.float32) for n in (300_007, 1, 4_099)]
    upload = [(r + rng.normal(size=r.size) * 1e-3).astype(np.float32) for r in reference]
    d = np.concatenate([u.astype(np.float64) - r for u, r in zip(upload, reference)])
    centre = rng.normal(size=d.size)
    centre /= np.linalg.norm(centre)
    taken = streaming.Moments(upload, reference, [0, 1, 2], centre, limit=10.0)
    assert taken.outside == 0
    assert taken.norm == pytest.approx(math.sqrt(math.fsum(d * d)), rel=1e-12)
    assert taken.dot == pytest.approx(math.fsum(d * centre), rel=1e-12)
    bad = [u.copy() for u in upload]
    bad[0][[5, 70_001, 300_000]] = [np.nan, np.inf, -np.inf]
    bad[2][[0, 1]] = [10.0, -10.5]  # at the limit: kept; beyond it: counted
    assert streaming.Moments(bad, reference, [0, 1, 2], None, limit=10.0).outside == 4
