"""Secure aggregation (Flower's SecAgg+): the server only ever sees the sum of the
shared uploads; methods that need individual uploads refuse before training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from methods import get_method, method_names, parse_run_config
from pflower.config.schema import ConfigError
from strategies.base import PFLStrategy

SMALL = {"sim-samples": 60, "hidden-dim": 16, "num-server-rounds": 2}


@pytest.mark.parametrize("method", [m for m in method_names() if get_method(m).per_client])
def test_methods_that_need_each_upload_refuse_naming_the_key(method: str) -> None:
    with pytest.raises(ConfigError, match="'secure-aggregation'") as err:
        parse_run_config({"method": method, "secure-aggregation": True})
    assert get_method(method).per_client in str(err.value)


@pytest.mark.parametrize(
    "method", ["fedavg", "fedavg-ft", "fedper", "fedrep", "fedbn", "feddecomp", "fedcp", "dualfed"]
)
def test_mean_aggregating_methods_accept_it(method: str) -> None:
    assert parse_run_config({"method": method, "secure-aggregation": True}).secure_aggregation


def _run(method: str, secure: bool, tmp_path: Path, seen: list, counts: list | None = None) -> dict:
    from pflower.engine.simulate import simulate

    config = {
        **SMALL,
        "method": method,
        "secure-aggregation": secure,
        "output-dir": str(tmp_path),
        "run-name": f"{method}-{secure}",
    }
    if not secure:  # each upload reaches `aggregate` (a streamed round folds them itself)
        config["streamed-aggregation"] = False
    original = PFLStrategy.aggregate

    def spy(self, server_round, replies):  # what reaches aggregation, in the server thread
        seen.append([[a.copy() for a in r.arrays] for r in replies])
        if counts is not None:
            counts.append([r.num_examples for r in replies])
        return original(self, server_round, replies)

    PFLStrategy.aggregate = spy
    try:
        return simulate(config, 3, num_cpus=2.0)
    finally:
        PFLStrategy.aggregate = original


@pytest.mark.slow
@pytest.mark.parametrize("method", [pytest.param("fedavg", marks=pytest.mark.flower142), "fedper"])
def test_secure_runs_equal_plain_runs_up_to_quantization(method: str, tmp_path: Path) -> None:
    secure_seen: list = []
    plain_seen: list = []
    secure_counts: list = []
    plain_counts: list = []
    secure = _run(method, True, tmp_path, secure_seen, secure_counts)
    plain = _run(method, False, tmp_path, plain_seen, plain_counts)
    # the sample counts weigh inside the mask; none travels in plaintext beside it
    assert secure_counts == [[1, 1, 1]] * 2 and plain_counts == [[48, 48, 48]] * 2
    # the strategy never received an individual upload: every reply it was given is
    # one and the same aggregate
    assert len(secure_seen) == 2
    for replies in secure_seen:
        assert len(replies) == 3
        for other in replies[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(replies[0], other))
    # ... and that aggregate is the plain run's weighted mean up to SecAgg+'s
    # quantization. Each client scales its upload by n / max-weight before quantizing
    # with a step of 2 * clipping-range / quantization-range, and the server divides
    # the sum by sum(n) / max-weight: the error of a value is at most
    # step * max-weight / mean(n) (all clients' rounding errors of one sign).
    n = 48  # 60 samples, 80% for training
    step = 2 * 8.0 / 4194304 * 1000.0 / n
    for s_replies, p_replies in zip(secure_seen, plain_seen):
        weights = np.ones(3) / 3  # equal partitions (60 samples each)
        for i, tensor in enumerate(s_replies[0]):
            plain_mean = sum(w * r[i].astype(np.float64) for w, r in zip(weights, p_replies))
            error = np.abs(tensor - plain_mean).max()
            assert 0 < error <= step * 1.01  # quantized (not bit-equal), within the bound
        break  # round 1 starts from the same global state; later rounds inherit the error
    # accuracy within a point
    assert abs(secure["final_accuracy_mean"] - plain["final_accuracy_mean"]) <= 0.01
    for record in secure["rounds"]:
        assert 0 < record["secagg_aggregate_max_abs"] < 8.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["client", "distributed"])
def test_client_side_dp_composes_with_secure_aggregation(
    mode: str, tmp_path: Path, monkeypatch
) -> None:
    """client: clipped on the clients, noised by the server once a round; distributed:
    the server adds no noise, each fit tells the client how many were asked, and the
    clients' shares add up to the same noise on the mean. Both reach the target
    multiplier when every client replies, and epsilon grows round by round."""
    import strategies.privacy
    from models.roles import DP_PARTICIPANTS
    from pflower.engine.simulate import simulate
    from pflower.privacy import noise_std

    server_noise: list[float] = []
    add_noise = strategies.privacy.add_noise

    def counted(arrays, std, rng) -> None:  # noqa: ANN001
        server_noise.append(std)
        add_noise(arrays, std, rng)

    monkeypatch.setattr(strategies.privacy, "add_noise", counted)
    told: list = []
    configure_fit = PFLStrategy.configure_fit

    def telling(self, *args):  # noqa: ANN001
        sent = configure_fit(self, *args)
        told.extend(ins.config.get(DP_PARTICIPANTS) for _, ins in sent)
        return sent

    monkeypatch.setattr(PFLStrategy, "configure_fit", telling)
    config = {
        **SMALL,
        "method": "fedper",
        "secure-aggregation": True,
        "dp-mode": mode,
        "dp-noise-multiplier": 0.5,
        "dp-clipping-norm": 0.5,
        "output-dir": str(tmp_path),
        "run-name": "secagg-dp",
    }
    res = simulate(config, 3, num_cpus=2.0)
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    eps = [r["dp_epsilon"] for r in res["rounds"]]
    assert all(e is not None and np.isfinite(e) for e in eps) and eps[0] < eps[1]
    assert res["dp_epsilon"] == eps[-1]
    assert all("secagg_aggregate_max_abs" in r for r in res["rounds"])
    assert len(told) == 6  # 3 clients, 2 rounds
    std = noise_std(0.5, 0.5, 3)
    if mode == "client":
        assert server_noise == [std, std] and told == [None] * 6
    else:
        assert server_noise == [] and told == [3] * 6
    for r in res["rounds"]:
        assert r["dp_noise_multiplier_achieved"] == r["dp_noise_multiplier_target"] == 0.5
        assert r["dp_noise_std"] == pytest.approx(std)


def test_a_distributed_client_adds_its_share_of_the_noise_a_client_mode_one_none() -> None:
    """The client's side of the two modes: both clip the update to the clipping norm;
    only distributed adds noise, of std z C / sqrt(n) (n = the clients asked), so that
    n shares summed and divided by n carry the server's noise std z C / n."""
    from client_app.base import privatize
    from models.roles import DP_PARTICIPANTS

    received = [np.zeros(40_000, np.float32)]
    update = [np.full(40_000, 0.01, np.float32)]  # norm 2: clipped to 0.5
    base = {"method": "fedavg", "dp-noise-multiplier": 0.5, "dp-clipping-norm": 0.5}
    client = privatize(
        [update[0].copy()], received, parse_run_config({**base, "dp-mode": "client"}), {}
    )
    assert np.linalg.norm(client[0]) == pytest.approx(0.5, rel=1e-4)
    cfg = parse_run_config({**base, "dp-mode": "distributed", "secure-aggregation": True})
    shared = privatize([update[0].copy()], received, cfg, {DP_PARTICIPANTS: 4})
    noise = shared[0] - client[0]
    assert noise.std() == pytest.approx(0.5 * 0.5 / 2, rel=0.03) and abs(noise.mean()) < 0.003
    with pytest.raises(ValueError, match=DP_PARTICIPANTS):
        privatize([update[0].copy()], received, cfg, {})


@pytest.mark.slow
def test_a_secure_round_survives_a_client_that_drops_before_sharing_keys(tmp_path: Path) -> None:
    """Client 0 drops out of round 1 at SecAgg+'s first stage (dropout-rate 0.3 at the
    default seed). Flower 1.39 then counts it dead at the unmask stage and asks the
    others for shares they never got: every site fails and the round is lost. Here
    the other three are summed, and distributed DP counts the three noise shares that
    arrived (achieved multiplier sqrt(3/4) of the target)."""
    from pflower.engine.simulate import simulate

    config = {
        **SMALL,
        "method": "fedavg",
        "num-server-rounds": 1,
        "secure-aggregation": True,
        "secagg-reconstruction-threshold": 0.5,
        "dp-mode": "distributed",
        "dp-noise-multiplier": 1.0,
        "dropout-rate": 0.3,
        "eval-in-fit": False,
        "output-dir": str(tmp_path),
        "run-name": "dropout",
    }
    (record,) = simulate(config, 4, num_cpus=2.0)["rounds"]
    assert record["replies"] == 3
    assert record["dp_noise_multiplier_achieved"] == pytest.approx(0.75**0.5)
    assert record["dp_epsilon"] > 0
