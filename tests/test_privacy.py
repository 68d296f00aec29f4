"""Differential privacy on the shared update: clipping, the Gaussian noise, the
privacy accountant, and the config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays

from methods import parse_run_config
from pflower.config.schema import ConfigError
from pflower.engine.inprocess import run_inprocess
from pflower.privacy import PrivacyAccountant, clip_update
from tests.helpers import FakeProxy, config, fit_res, make_client, make_strategy


def test_clip_update_bounds_the_update_and_keeps_integers() -> None:
    rng = np.random.default_rng(0)
    received = [rng.normal(size=(30, 20)).astype(np.float32), np.array(7, dtype=np.int64)]
    upload = [received[0] + 5 * rng.normal(size=(30, 20)).astype(np.float32), np.array(9)]
    norm = clip_update(upload, received, 1.5)
    assert norm > 1.5
    assert np.linalg.norm(upload[0].astype(np.float64) - received[0]) == pytest.approx(
        1.5, rel=1e-5
    )
    assert upload[1] == 9 and upload[0].dtype == np.float32
    small = [received[0] + 1e-3, received[1]]
    before = small[0].copy()
    clip_update(small, received, 1.5)  # already inside the ball: unchanged
    np.testing.assert_array_equal(small[0], before)


def test_client_side_dp_uploads_a_clipped_update() -> None:
    cfg = config(method="fedper", **{"dp-mode": "client", "dp-clipping-norm": 0.05})
    client, _ = make_client(cfg)
    sent = parameters_to_ndarrays(make_strategy(cfg).global_payload())
    upload, n, _ = client.fit(sent, {"server-round": 1})
    update = np.sqrt(
        sum(float(np.sum((u.astype(np.float64) - s) ** 2)) for u, s in zip(upload, sent))
    )
    assert update <= 0.05 * (1 + 1e-5)
    # the personal head trained unclipped and stayed home
    assert client.roles.personal and len(upload) == len(client.roles.shared)


@pytest.mark.parametrize("mode", ["client", "server"])
def test_the_noise_has_the_stated_std(mode: str) -> None:
    cfg = config(
        method="fedavg",
        **{"dp-mode": mode, "dp-noise-multiplier": 2.0, "dp-clipping-norm": 0.5, "hidden-dim": 256},
    )
    strategy = make_strategy(cfg)
    start = [a.copy() for a in strategy.global_arrays]
    replies = [(FakeProxy(k), fit_res(start, f"c{k}", 10 * (k + 1))) for k in range(4)]
    strategy.aggregate_fit(1, replies, [])
    noise = np.concatenate([(a - s).ravel() for a, s in zip(strategy.global_arrays, start)])
    expected = 2.0 * 0.5 / 4  # noise multiplier x clipping norm / participants
    assert noise.size > 5000
    assert noise.std() == pytest.approx(expected, rel=0.05)
    assert abs(noise.mean()) < 4 * expected / math.sqrt(noise.size)
    assert strategy.rounds[1].extra["dp_noise_std"] == pytest.approx(expected)


def test_server_side_clipping_bounds_each_update() -> None:
    cfg = config(method="fedavg", **{"dp-mode": "server", "dp-noise-multiplier": 0.0})
    strategy = make_strategy(cfg)
    start = [a.copy() for a in strategy.global_arrays]
    far = [a + 10.0 for a in start]
    strategy.aggregate_fit(
        1, [(FakeProxy(1), fit_res(far, "c1")), (FakeProxy(2), fit_res(start, "c2"))], []
    )
    moved = np.sqrt(
        sum(
            float(np.sum((a.astype(np.float64) - s) ** 2))
            for a, s in zip(strategy.global_arrays, start)
        )
    )
    assert moved == pytest.approx(1.0 / 2, rel=1e-4)  # one update clipped to 1, averaged with 0


def test_epsilon_matches_the_rdp_of_the_gaussian_mechanism() -> None:
    """Full participation (q = 1): the Gaussian mechanism's RDP is alpha / (2 z^2) per
    round; epsilon at delta by the conversion of Balle et al. (2020), which Opacus uses."""
    from opacus.accountants import RDPAccountant

    z, rounds, delta = 1.3, 20, 1e-5
    acc = PrivacyAccountant(z, delta)
    for _ in range(rounds):
        acc.step(1.0)
    alphas = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    rdp = rounds * alphas / (2 * z**2)
    eps = rdp - (np.log(delta) + np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas)
    assert acc.epsilon() == pytest.approx(float(np.nanmin(eps)), rel=1e-6)
    assert PrivacyAccountant(0.0, delta).epsilon() is None  # no noise, no guarantee


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"method": "factorized-fl-beta", "dp-mode": "client"}, "'dp-mode'.*per-client mixture"),
        ({"method": "fedfac-static", "dp-mode": "server"}, "'dp-mode'"),
        ({"method": "fedper", "dp-mode": "server", "secure-aggregation": True}, "'dp-mode'"),
        ({"method": "fedper", "dp-mode": "client", "aggregation": "weighted"}, "'aggregation'"),
        ({"dp-noise-multiplier": -1}, "'dp-noise-multiplier'"),
        ({"dp-clipping-norm": 0}, "'dp-clipping-norm'"),
        ({"dp-delta": 1.5}, "'dp-delta'"),
        ({"dp-mode": "sometimes"}, "'dp-mode'"),
        ({"method": "fedper", "dp-mode": "distributed"}, "'dp-mode'.*secure-aggregation=true"),
    ],
)
def test_bad_privacy_values_name_the_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_run_config(raw)


def test_a_dp_run_records_a_finite_epsilon(tmp_path) -> None:
    config_ = {
        "method": "fedper",
        "dp-mode": "client",
        "dp-noise-multiplier": 1.0,
        "num-server-rounds": 3,
        "sim-samples": 60,
        "hidden-dim": 16,
        "output-dir": str(tmp_path),
        "run-name": "dp",
    }
    res = run_inprocess(config_, 3)
    eps = [r["dp_epsilon"] for r in res["rounds"]]
    assert all(math.isfinite(e) for e in eps) and eps == sorted(eps)  # spent grows per round
    assert res["dp_epsilon"] == eps[-1] and res["dp_delta"] == 1e-5


DP_RUN = {
    "method": "fedper",
    "dp-mode": "client",
    "dp-noise-multiplier": 1.0,
    "sim-samples": 60,
    "hidden-dim": 16,
    "checkpoint-every": 1,
}


def test_epsilon_after_a_resumed_run_equals_an_uninterrupted_runs(tmp_path) -> None:
    """5 rounds, then 5 more resumed from the checkpoint: the accountant's history
    travels in it, so the privacy spent is that of 10 rounds (not 5 counted anew)."""
    out = {"output-dir": str(tmp_path)}
    whole = run_inprocess({**DP_RUN, **out, "num-server-rounds": 10, "run-name": "ten"}, 3)
    run_inprocess({**DP_RUN, **out, "num-server-rounds": 5, "run-name": "first"}, 3)
    resumed = run_inprocess(
        {
            **DP_RUN,
            **out,
            "num-server-rounds": 5,
            "run-name": "again",
            "resume-from": str(tmp_path / "first"),
        },
        3,
    )
    assert resumed["rounds"][-1]["round"] == 10
    assert resumed["dp_epsilon"] == pytest.approx(whole["dp_epsilon"], rel=1e-9)
    five = PrivacyAccountant(1.0, 1e-5)
    five.step(1.0)
    five.accountant.history[0] = (1.0, 1.0, 5)
    assert resumed["dp_epsilon"] > five.epsilon() * 1.2  # the first 5 rounds still count


def test_the_sampling_rate_is_the_clients_asked_over_those_available(tmp_path) -> None:
    """fraction-fit 0.5 of 3 clients asks ceil(1.5) = 2: the rate is 2/3, not 0.5."""
    cfg = {**DP_RUN, "fraction-fit": 0.5, "num-server-rounds": 3, "run-name": "q"}
    res = run_inprocess({**cfg, "output-dir": str(tmp_path)}, 3)
    assert all(r["dp_sample_rate"] == pytest.approx(2 / 3) for r in res["rounds"])
    expected = PrivacyAccountant(1.0, 1e-5)
    for _ in range(3):
        expected.step(2 / 3)
    assert res["dp_epsilon"] == pytest.approx(expected.epsilon(), rel=1e-9)


def test_distributed_dp_noise_on_the_aggregate_has_the_stated_std() -> None:
    """Each of n clients adds N(0, (z C)^2 / n) to its clipped update (the client's own
    fit adds it); SecAgg+ unmasks their mean; the server adds nothing, and the
    aggregate's noise has the std of central DP-FedAvg's, z C / n."""
    from models.roles import DP_PARTICIPANTS

    z, c, n = 2.0, 0.5, 8
    keys = {
        "dp-noise-multiplier": z,
        "dp-clipping-norm": c,
        "hidden-dim": 256,
        "secagg-clipping-range": 100.0,
    }
    cfg = config(method="fedavg", **{"dp-mode": "distributed", "secure-aggregation": True}, **keys)
    clipped_only = config(method="fedavg", **{"dp-mode": "client"}, **keys)  # the same, no noise
    strategy = make_strategy(cfg)
    start = [a.copy() for a in strategy.global_arrays]
    sent = parameters_to_ndarrays(strategy.global_payload())
    instruction = {"server-round": 1, DP_PARTICIPANTS: n}
    uploads, shares = [], []
    for k in range(n):  # each client's own fit, and its twin that adds no noise
        upload, _, _ = make_client(cfg, k, n)[0].fit(sent, instruction)
        twin, _, _ = make_client(clipped_only, k, n)[0].fit(sent, instruction)
        uploads.append(upload)
        shares.append(np.concatenate([(u - t).ravel() for u, t in zip(upload, twin)]))
    share = np.concatenate(shares)
    assert share.std() == pytest.approx(z * c / np.sqrt(n), rel=0.05)  # each client's share
    unmasked = [np.mean([u[i] for u in uploads], axis=0) for i in range(len(start))]
    replies = [(FakeProxy(k), fit_res(unmasked, f"c{k}", 1)) for k in range(n)]
    strategy.aggregate_fit(1, replies, [])
    moved = [a - s for a, s in zip(strategy.global_arrays, start)]
    np.testing.assert_allclose(  # the server added nothing of its own
        np.concatenate([m.ravel() for m in moved]),
        np.concatenate([(u - s).ravel() for u, s in zip(unmasked, start)]),
        atol=1e-6,
    )
    noise = np.mean(np.reshape(share, (n, -1)), axis=0)  # the noise in the aggregate
    assert noise.std() == pytest.approx(z * c / n, rel=0.05)
    assert strategy.rounds[1].extra["dp_noise_std"] == pytest.approx(z * c / n)


def test_distributed_dp_counts_the_noise_that_arrived(caplog) -> None:
    """6 of 10 clients' shares reach the aggregate: its noise multiplier is z sqrt(0.6)
    (0.775 z), the round says so and warns, and epsilon is the accountant's at it."""
    from opacus.accountants import RDPAccountant

    from strategies.privacy import DPRelease

    z = 1.0
    cfg = config(
        method="fedavg",
        **{"dp-mode": "distributed", "secure-aggregation": True, "dp-noise-multiplier": z},
    )
    dp = DPRelease(cfg)
    extra: dict = {}
    for _ in range(10):
        dp.sample = (10, 10)
        dp.release([np.zeros(3)], [np.ones(3, np.float32)], 6, lambda a: None, extra)
    assert extra["dp_noise_multiplier_target"] == z
    assert extra["dp_noise_multiplier_achieved"] == pytest.approx(0.7746, abs=1e-4)
    assert "6 of the 10 clients asked replied" in caplog.text
    expected = RDPAccountant()
    for _ in range(10):
        expected.step(noise_multiplier=z * math.sqrt(0.6), sample_rate=1.0)
    assert extra["dp_epsilon"] == pytest.approx(expected.get_epsilon(delta=1e-5), rel=1e-9)
    asked_for = RDPAccountant()  # what was reported before: the noise that was asked for
    for _ in range(10):
        asked_for.step(noise_multiplier=z, sample_rate=1.0)
    assert extra["dp_epsilon"] > asked_for.get_epsilon(delta=1e-5) * 1.3


def test_client_side_dp_re_clips_an_update_a_client_did_not_clip(caplog) -> None:
    """dp-mode=client: an update of norm 1e3 (its client skipped clipping) moves the
    model by at most the clipping norm over the clients asked, as an honest one would."""
    c = 0.1
    cfg = config(
        method="fedavg",
        **{"dp-mode": "client", "dp-noise-multiplier": 0.0, "dp-clipping-norm": c},
    )
    strategy = make_strategy(cfg)
    start = [a.copy() for a in strategy.global_arrays]
    honest = [a.copy() for a in start]
    hostile = [a + 1e3 / math.sqrt(sum(x.size for x in start)) for a in start]
    replies = [(FakeProxy(1), fit_res(honest, "a")), (FakeProxy(2), fit_res(hostile, "b"))]
    strategy.aggregate_fit(1, replies, [])
    moved = math.sqrt(
        sum(float(np.sum((a - s) ** 2)) for a, s in zip(strategy.global_arrays, start))
    )
    assert moved <= c / 2 * 1.001  # the hostile update clipped to c, divided by 2 asked
    assert strategy.rounds[1].extra["dp_reclipped"] == 1
    assert "re-clipped: b (" in caplog.text


def test_a_client_refuses_a_noise_share_sized_for_another_round() -> None:
    """The fit's dp-participants must equal the SecAgg+ round's own sample size."""
    from types import SimpleNamespace

    from client_app.app import dp_share_refusal

    def msg(stage: str, asked: int) -> SimpleNamespace:
        records = {
            "secaggplus_configs": {"stage": stage},
            "fitins.config": {"dp-participants": asked},
        }
        return SimpleNamespace(config_records=records)

    state = SimpleNamespace(config_records={"secaggplus_state": {"sample_num": 5}})
    assert dp_share_refusal(msg("collect_masked_vectors", 5), state) is None
    why = dp_share_refusal(msg("collect_masked_vectors", 50), state)
    assert why is not None and "dp-participants=50" in why and "5 participants" in why
    assert dp_share_refusal(msg("share_keys", 50), state) is None  # no upload in that stage
