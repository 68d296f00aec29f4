"""What one hostile client can do to the global model (strategies/robust.py).

Under the default settings (weight-cap 2, update-norm-bound 3) a client that claims
1e15 examples weighs at most twice the median client, and an update scaled 1000x is
clipped to 3x the round's median update norm; so the global model moves at most 3x
the median honest update norm, however the attacker scales its upload.
"""

from __future__ import annotations

import numpy as np
import pytest

from methods import parse_run_config
from pflower.config.schema import ConfigError
from strategies.replies import Reply
from strategies.robust import Bounds, NormHistory, robust_mean
from strategies.streaming import bound_held
from tests.helpers import FakeProxy, config, fit_res, make_strategy, update_norm


def _honest(start: list[np.ndarray], k: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [
        (a + 0.01 * rng.normal(size=a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a
        for a in start
    ]


def _move(strategy, start) -> float:  # noqa: ANN001
    return update_norm(strategy.global_arrays, [a.astype(np.float64) for a in start])


@pytest.mark.parametrize("attack", ["inflated-count", "scaled-update", "both"])
def test_one_client_cannot_move_the_global_model_beyond_the_stated_bound(attack: str) -> None:
    cfg = config(method="fedavg")  # the defaults: weight-cap 2, update-norm-bound 3
    strategy = make_strategy(cfg)
    start = [a.copy() for a in strategy.global_arrays]
    rng = np.random.default_rng(0)
    honest = [_honest(start, k, rng) for k in range(9)]
    bad = _honest(start, 9, rng)
    count = 48
    if attack in ("scaled-update", "both"):
        bad = [(s + 1000.0 * (b - s)).astype(b.dtype) for s, b in zip(start, bad)]
    if attack in ("inflated-count", "both"):
        count = 10**15

    def replies() -> list:  # fresh each time: the strategy drops a reply's bytes once read
        out = [(FakeProxy(k), fit_res(h, f"c{k}", 48)) for k, h in enumerate(honest)]
        return [*out, (FakeProxy(9), fit_res(bad, "c9", count))]

    strategy.aggregate_fit(1, replies(), [])
    norms = [update_norm(h, start) for h in honest]
    bound = cfg.update_norm_bound * float(np.median(norms + [update_norm(bad, start)]))
    assert _move(strategy, start) <= bound * (1 + 1e-6)
    # the attacker's share of the weight is at most weight-cap x median / total
    share = (2 * 48) / (2 * 48 + 9 * 48) if count > 48 else 1 / 10
    honest_mean = [np.mean([h[i] for h in honest], axis=0) for i in range(len(start))]
    away = update_norm(strategy.global_arrays, honest_mean)
    assert away <= share * (bound + max(norms)) * (1 + 1e-6)
    # without the defences the same reply takes the model over (the attack is real)
    open_cfg = config(method="fedavg", **{"weight-cap": 0.0, "update-norm-bound": 0.0})
    undefended = make_strategy(open_cfg)
    undefended.aggregate_fit(1, replies(), [])
    if count > 48:  # the global model becomes the attacker's upload
        assert update_norm(undefended.global_arrays, bad) < 1e-6 * update_norm(bad, start)
    else:  # or moves as far as it scaled its update
        assert _move(undefended, start) > 5 * bound


def _updates_with_a_common_direction(
    start: list[np.ndarray], sites: int, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """Honest uploads as training makes them: a shared direction plus each site's own."""
    common = [0.01 * rng.normal(size=a.shape) for a in start]
    return [
        [
            (a + c + 0.01 * rng.normal(size=a.shape)).astype(a.dtype) if a.dtype.kind == "f" else a
            for a, c in zip(start, common)
        ]
        for _ in range(sites)
    ]


def _cosine(a: list[np.ndarray], b: list[np.ndarray], start: list[np.ndarray]) -> float:
    da = np.concatenate([(x.astype(np.float64) - s).ravel() for x, s in zip(a, start)])
    db = np.concatenate([(x.astype(np.float64) - s).ravel() for x, s in zip(b, start)])
    return float(da @ db / np.linalg.norm(da) / np.linalg.norm(db))


@pytest.mark.parametrize("rounds", [1, 3])
def test_at_two_sites_one_hostile_site_moves_the_model_at_most_three_honest_updates(
    rounds: int,
) -> None:
    """The default bounds at n = 2: a 1000x update claiming 1e15 examples, round after
    round (the norm history must not ratchet up), moves the global model at most 3x
    the honest site's update; without the bounds it moves it about 1000x."""
    rng = np.random.default_rng(1)
    for defended in (True, False):
        raw = {} if defended else {"weight-cap": 0.0, "update-norm-bound": 0.0}
        strategy = make_strategy(config(method="fedavg", **raw))
        for rnd in range(1, rounds + 1):
            start = [a.copy() for a in strategy.global_arrays]
            honest = _honest(start, 0, rng)
            bad = [
                (s + 1000.0 * (b - s)).astype(b.dtype)
                for s, b in zip(start, _honest(start, 1, rng))
            ]
            replies = [
                (FakeProxy(0), fit_res(honest, "h", 48)),
                (FakeProxy(1), fit_res(bad, "a", 10**15)),
            ]
            strategy.aggregate_fit(rnd, replies, [])
            ratio = _move(strategy, start) / update_norm(honest, start)
            if defended:
                assert ratio <= 3.0, (rnd, ratio)
            else:
                assert ratio > 900


@pytest.mark.parametrize("action", ["project", "reject"])
def test_at_four_sites_a_sign_flipper_under_the_norm_bound_cannot_turn_the_aggregate(
    action: str,
) -> None:
    """Three honest sites and one that sends its update negated, scaled to just under
    the norm bound, claiming 1e15 examples: the direction check removes what it
    pushes against the round (the default) or rejects it, and the aggregate keeps a
    cosine of at least 0.5 with the honest mean (without the check it points
    against it)."""
    rng = np.random.default_rng(2)
    cosines = {}
    for check in (4, 0):
        raw = {"direction-check-from": check, "direction-action": action}
        strategy = make_strategy(config(method="fedavg", **raw))
        start = [a.copy() for a in strategy.global_arrays]
        honest = _updates_with_a_common_direction(start, 3, rng)
        limit = 3.0 * sorted(update_norm(h, start) for h in honest)[1]
        flip = honest[0]
        scale = -0.99 * limit / update_norm(flip, start)
        bad = [
            (s + scale * (f.astype(np.float64) - s)).astype(f.dtype) for s, f in zip(start, flip)
        ]
        replies = [(FakeProxy(k), fit_res(h, f"h{k}", 48)) for k, h in enumerate(honest)]
        replies.append((FakeProxy(3), fit_res(bad, "attacker", 10**15)))
        strategy.aggregate_fit(1, replies, [])
        honest_mean = [np.mean([h[i] for h in honest], axis=0) for i in range(len(start))]
        cosines[check] = _cosine(strategy.global_arrays, honest_mean, start)
        record = strategy.rounds[1]
        if check and action == "reject":
            assert any("attacker: update points against the round" in r for r in record.rejected)
        else:
            assert not record.rejected
    assert cosines[4] >= 0.5, cosines
    assert cosines[0] < 0, cosines  # the attack is real without the check


def test_the_direction_check_keeps_every_honest_site_of_a_clean_round() -> None:
    rng = np.random.default_rng(3)
    strategy = make_strategy(config(method="fedavg"))
    start = [a.copy() for a in strategy.global_arrays]
    honest = _updates_with_a_common_direction(start, 10, rng)
    replies = [(FakeProxy(k), fit_res(h, f"h{k}", 48)) for k, h in enumerate(honest)]
    strategy.aggregate_fit(1, replies, [])
    honest_mean = [np.mean([h[i] for h in honest], axis=0) for i in range(len(start))]
    assert update_norm(strategy.global_arrays, honest_mean) < 1e-5


def _held(ups: list, counts: list[int], bounds: Bounds, ref: list) -> tuple[list, list, dict]:
    replies = [Reply(f"c{i}", list(u), n, {}) for i, (u, n) in enumerate(zip(ups, counts))]
    extra: dict = {}
    kept, reasons = bound_held(1, replies, bounds, NormHistory(3), lambda key: ref, extra)
    return kept, reasons, extra


def test_a_held_round_caps_weights_and_bounds_norms_in_the_units_the_keys_say() -> None:
    ref = [np.zeros(4, np.float32), np.array(3, np.int64)]
    ups = [[np.full(4, v, np.float32), np.array(5, np.int64)] for v in (1.0, 1.0, 1.0, 100.0)]
    kept, reasons, extra = _held(ups, [10, 10, 30, 10**15], Bounds(2.0, 3.0), ref)
    assert [r.num_examples for r in kept] == [10, 10, 20, 20]  # 2x the lower median count
    assert extra["weights_capped"] == 2 and not reasons
    assert extra["update_norm_limit"] == pytest.approx(3 * 2.0) and extra["updates_clipped"] == 1
    assert update_norm(kept[3].arrays, ref) == pytest.approx(6.0, rel=1e-6)
    assert kept[3].arrays[1] == 5  # integer tensors untouched
    kept, reasons, extra = _held(ups, [10, 10, 30, 10**15], Bounds(0.0, 3.0, "reject"), ref)
    assert [r.num_examples for r in kept] == [10, 10, 30] and "weights_capped" not in extra
    assert len(reasons) == 1 and reasons[0].startswith("c3: update norm above")


def test_median_and_trimmed_mean_resist_a_minority_and_keep_dtypes() -> None:
    ups = [
        [np.full(3, v, np.float32), np.array(n, np.int64)] for v, n in ((1, 4), (2, 4), (1e6, 9))
    ]
    med = robust_mean(ups, "median", 0.1)
    assert med[0].tolist() == [2.0, 2.0, 2.0] and med[0].dtype == np.float32
    assert med[1].dtype == np.int64 and int(med[1]) == 4
    trimmed = robust_mean(ups + [[np.full(3, 1.5, np.float32), np.array(4)]], "trimmed-mean", 0.25)
    assert trimmed[0].tolist() == pytest.approx([1.75] * 3)


@pytest.mark.parametrize("rule", ["median", "trimmed-mean"])
def test_a_robust_rule_replaces_the_mean(rule: str) -> None:
    strategy = make_strategy(config(method="fedper", aggregation=rule))
    start = [a.copy() for a in strategy.global_arrays]
    far = [(a + 50.0).astype(a.dtype) for a in start]
    replies = [(FakeProxy(k), fit_res(start, f"c{k}", 48)) for k in range(4)]
    replies.append((FakeProxy(4), fit_res(far, "c4", 48)))
    strategy.aggregate_fit(1, replies, [])
    assert _move(strategy, start) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    "raw",
    [
        {"method": "fedfac-static", "aggregation": "median"},
        {"method": "factorized-fl-beta", "aggregation": "trimmed-mean"},
        {"method": "fedavg", "aggregation": "median", "secure-aggregation": True},
        {"method": "fedavg", "aggregation": "median", "dp-mode": "client"},
        {"trim-fraction": 0.5},
        {"weight-cap": -1},
    ],
)
def test_robust_settings_that_cannot_work_name_the_key(raw: dict) -> None:
    with pytest.raises(ConfigError, match="'aggregation'|'trim-fraction'|'weight-cap'"):
        parse_run_config(raw)


def _first_round_fits(raw: dict, name: str, nodes: list | None = None) -> dict[str, tuple]:
    """client key -> (its instruction, its upload, its sample count) in round 1; under
    "results", the run's results.json."""
    from flwr.common import parameters_to_ndarrays

    from pflower.engine.inprocess import run_inprocess

    fits: dict[str, tuple] = {}

    def record(kind, cid, ins, res) -> None:  # noqa: ANN001
        if kind == "fit" and ins.config["server-round"] == 1:
            upload = parameters_to_ndarrays(res.parameters)
            fits[res.metrics["client-key"]] = (ins, upload, res.num_examples)

    fits["results"] = run_inprocess({**raw, "run-name": name}, 3, record, nodes)
    return fits


@pytest.mark.parametrize("attack", ["inflate-count", "scale", "sign-flip", "label-flip"])
def test_simulated_attackers_falsify_their_replies_and_sites_never_do(attack, tmp_path) -> None:
    """Round 1, where every client starts from the same global model: the honest
    clients' uploads are bitwise those of a run without attackers; the attacker's is
    the honest one transformed as its attack says; deployed sites never attack."""
    from flwr.common import Context, RecordDict, parameters_to_ndarrays

    from client_app.app import build_client

    raw = {
        "method": "fedavg",
        "sim-samples": 60,
        "hidden-dim": 16,
        "num-server-rounds": 1,
        "output-dir": str(tmp_path),
    }
    honest = _first_round_fits(raw, "honest")
    attacked = _first_round_fits({**raw, "attack": attack, "attack-clients": 1}, "attacked")
    for key in ("client-1", "client-2"):
        assert attacked[key][2] == honest[key][2]
        assert all(np.array_equal(a, b) for a, b in zip(attacked[key][1], honest[key][1]))
    ins, mine, count = attacked["client-0"]
    start = parameters_to_ndarrays(ins.parameters)
    fair = honest["client-0"][1]
    if attack == "inflate-count":  # attack-scale 10 x 1e5 times its 48 samples
        assert count == 48 * 10 * 100_000 and honest["client-0"][2] == 48
        assert all(np.array_equal(a, b) for a, b in zip(mine, fair))
        assert attacked["results"]["rounds"][0]["weights_capped"] == 1  # the default cap
        assert "weights_capped" not in honest["results"]["rounds"][0]
    elif attack in ("scale", "sign-flip"):
        f = 10.0 if attack == "scale" else -1.0
        want = [(p + f * (u.astype(np.float64) - p)).astype(u.dtype) for u, p in zip(fair, start)]
        assert count == 48 and all(np.allclose(a, b, atol=1e-6) for a, b in zip(mine, want))
        assert not all(np.allclose(a, b) for a, b in zip(mine, fair))
    else:  # label-flip: the honest client trained on labels C - 1 - y (C = 2 here)
        context = Context(0, 1, {"partition-id": 0, "num-partitions": 3}, RecordDict(), {})
        client = build_client(context, {**raw, "run-name": "flipped"}).numpy_client
        client.y_train = 1 - client.y_train
        want, n, _ = client.fit(start, dict(ins.config))
        assert count == n == 48
        assert all(np.array_equal(a, b) for a, b in zip(mine, want))
        assert not all(np.array_equal(a, b) for a, b in zip(mine, fair))
    nodes = [{"site": f"client-{i}"} for i in range(3)]  # deployed sites: no attack
    sites = _first_round_fits({**raw, "attack": attack, "attack-clients": 1}, "sites", nodes)
    del sites["results"]
    assert sorted(sites) == ["client-0", "client-1", "client-2"]
    for key, (_, upload, n) in sites.items():
        assert n == honest[key][2]
        assert all(np.array_equal(a, b) for a, b in zip(upload, honest[key][1])), key


def test_the_median_update_in_slices_is_the_whole_stacks_median(monkeypatch) -> None:
    """The direction check's median is taken a slice of coordinates at a time (the
    round's updates are never stacked whole): the whole stack's median to the bit, and
    a held round projects the reply that points against it, an int tensor and an
    extra tensor left alone."""
    from strategies import streaming

    rng = np.random.default_rng(3)
    shapes = [(5, 7), (11,), (3, 2, 2)]
    reference = [rng.normal(size=s).astype(np.float32) for s in shapes]
    uploads = [
        [(r + 1 + 0.3 * rng.normal(size=r.shape)).astype(np.float32) for r in reference]
        + [np.arange(3), np.ones(2, np.float32)]
        for _ in range(6)
    ]
    for t in range(3):  # the first reply points against the others
        uploads[0][t] = (2 * reference[t] - uploads[0][t]).astype(np.float32)
    references = [*reference, np.arange(3)]
    factors = [1.0, 0.5, 1.0, 1.0, 2.0, 1.0]
    whole = np.median(
        np.stack(
            [
                f
                * np.concatenate(
                    [
                        np.subtract(u[t].ravel(), reference[t].ravel(), dtype=np.float64)
                        for t in range(3)
                    ]
                )
                for u, f in zip(uploads, factors)
            ]
        ),
        axis=0,
    )
    replies = [Reply(f"c{i}", u, 10, {}) for i, u in enumerate(uploads)]
    monkeypatch.setattr(streaming, "MEDIAN_SLICE", 13)  # slices of 2 coordinates x 6 replies
    sliced = streaming.median_update(replies, lambda key: references, factors)
    assert np.array_equal(sliced, whole)
    bounds = Bounds(0.0, 0.0, direction_from=4, min_cosine=0.0)
    kept, reasons, extra = _held(uploads, [10] * 6, bounds, references)
    assert extra["against_the_round"] == 1 and not reasons
    unit = np.median(np.stack([update_norm_vector(u, reference) for u in uploads]), axis=0)
    unit /= np.linalg.norm(unit)
    moved = update_norm_vector(kept[0].arrays, reference)
    assert abs(moved @ unit) < 1e-3  # the component along the median is gone
    assert kept[0].arrays[3] is uploads[0][3] and kept[0].arrays[4] is uploads[0][4]


def update_norm_vector(upload: list, reference: list) -> np.ndarray:
    return np.concatenate(
        [(upload[t].astype(np.float64) - reference[t]).ravel() for t in range(len(reference))]
    )


def test_the_norm_history_takes_each_norm_as_the_update_was_kept() -> None:
    """The norms the history keeps are those of the updates as aggregated: a clipped
    one's is the limit it was clipped to (its float32 arrays within rounding of it)."""
    import strategies.robust as robust

    rng = np.random.default_rng(3)
    strategy = make_strategy(config(method="fedavg"))
    start = [a.copy() for a in strategy.global_arrays]
    honest = [_honest(start, k, rng) for k in range(4)]
    scaled = [(s + 50.0 * (b - s)).astype(b.dtype) for s, b in zip(start, honest[0])]
    kept: list[list[np.ndarray]] = []
    weighted_mean = robust.weighted_mean  # the arrays the round averages: what was kept
    mean_of = lambda arrays, w: kept.extend(arrays) or weighted_mean(arrays, w)  # noqa: E731
    robust_weighted_mean, robust.weighted_mean = robust.weighted_mean, mean_of
    try:
        replies = [(FakeProxy(i), fit_res(u, f"c{i}", 48)) for i, u in enumerate([*honest, scaled])]
        strategy.aggregate_fit(1, replies, [])  # no streamed round opened: held
    finally:
        robust.weighted_mean = robust_weighted_mean
    assert len(kept) == 5
    want = [update_norm(u, [a.astype(np.float64) for a in start]) for u in kept]
    history = strategy.norm_history.values()
    assert history[:4] == pytest.approx(want[:4], rel=1e-12)
    assert history[4] == strategy.rounds[1].extra["update_norm_limit"]  # clipped to it
    assert history[4] == pytest.approx(want[4], rel=1e-6)  # its float32 arrays' norm
    assert want[-1] < 4 * min(want[:-1])  # the 50x update was clipped before it was kept
