"""One hostile site against what only personalised FL has (docs/RELIABILITY.md):
FedFac's factor analysis, Factorized-FL's matching, the shared heads; and the bounds
measured on the wire each method really sends (FedFac's payload starts with masks)."""

from __future__ import annotations

import numpy as np
import pytest

from client_app.attacks import Attacker
from methods.factorized_fl.strategy import cap_matches, matching_weights
from methods.fedfac.factor_analysis import (
    layer_matrix,
    principal_factors,
    shared_elements,
    site_median_correlation,
)
from tests.helpers import config, make_client

# ---- FedFac: the factor analysis --------------------------------------------------------------


def _honest_blocks(k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """k clients' (neurons x inputs) weights: neurons 0-9 share one latent pattern per
    client and input (high communality), neurons 10-19 are independent noise."""
    out = []
    for _ in range(k):
        latent = rng.normal(size=30)
        w = rng.normal(size=(20, 30))
        w[:10] = latent + 0.3 * rng.normal(size=(10, 30))
        out.append(w)
    return out


def _steered(rng: np.random.Generator, scale: float) -> np.ndarray:
    """An attacker's block: neurons 10-19 given one common direction, times ``scale``."""
    w = 0.01 * rng.normal(size=(20, 30))
    w[10:] += scale * rng.choice([-1.0, 1.0], size=(10, 1)) * rng.normal(size=30)
    return w


def _split(blocks: list[np.ndarray], robust: bool) -> np.ndarray:
    # kappa 0.4: one factor, so that no noise neuron gets one of its own
    if robust:
        fit = principal_factors(np.zeros((1, 1)), 0.4, r=site_median_correlation(blocks))
    else:
        fit = principal_factors(layer_matrix(blocks), 0.4)
    return shared_elements(fit.communalities, 0.5)


@pytest.mark.parametrize("sites", [4, 10])
def test_one_site_steers_the_pooled_factor_analysis_and_not_the_site_median(sites: int) -> None:
    rng = np.random.default_rng(0)
    honest = _honest_blocks(sites - 1, rng)
    clean = _split(honest, robust=False)
    assert clean[:10].all() and not clean[10:].any()  # the honest structure is found
    attacked = [_steered(rng, 20.0), *honest]
    steered = _split(attacked, robust=False)
    assert steered[10:].mean() >= 0.5, steered  # the attacker's neurons become shared
    robust = _split(attacked, robust=True)
    assert (robust == clean).all(), robust
    assert (_split(honest, robust=True) == clean).all()  # and the same split clean


def test_fedfac_updates_are_bounded_against_the_payload_they_started_from(tmp_path) -> None:
    """FedFac's payload starts with its split masks: the norm bound must line the
    upload up by name (it measured every update as 0 before, so never bound)."""
    from pflower.engine.inprocess import run_inprocess

    raw = {"method": "fedfac-static", "sim-samples": 60, "hidden-dim": 16}
    raw |= {"num-server-rounds": 2, "attack": "scale", "attack-clients": 1}
    res = run_inprocess({**raw, "output-dir": str(tmp_path), "run-name": "r"}, 4)
    for r in res["rounds"]:  # round 1: the full upload; round 2: the shared rows only
        assert r["update_norm_limit"] > 0 and r["updates_clipped"] >= 1, r


def test_fa_steer_rewrites_only_the_factor_analysis_rows_of_a_full_upload() -> None:
    cfg = config(method="fedfac-static", attack="fa-steer", **{"attack-clients": 1})
    client, _ = make_client(cfg)
    sent = client.get_parameters({})
    sent = [np.zeros(0, np.uint8), *sent]  # round 1: no split yet (an empty mask)
    attacker = Attacker(client, "fa-steer", 10.0, seed=0)
    honest, _, _ = make_client(cfg)[0].fit(sent, {"server-round": 1})
    upload, _, _ = attacker.fit(sent, {"server-round": 1})
    i = client.wire.position["features.1.weight"]
    rows = upload[i] - sent[1 + i]
    chosen = np.linalg.norm(rows, axis=1) > 0
    assert chosen.sum() == round(0.5 * rows.shape[0])  # (1 - fa-quantile) of the neurons
    unit = rows[chosen] / np.linalg.norm(rows[chosen], axis=1, keepdims=True)
    assert np.allclose(np.abs(unit @ unit[0]), 1.0, atol=1e-4)  # one common direction
    for j, (u, h) in enumerate(zip(upload, honest)):
        if j != i:
            assert np.allclose(u, h)  # the rest is the honest upload


# ---- Factorized-FL: the matching --------------------------------------------------------------


def _magnet_similarities(n: int) -> np.ndarray:
    """Three groups of honest clients (similar within, not across) and client 0, whose
    matching vector is as close to everyone as it can be."""
    sim = np.full((n, n), 0.2)
    for group in np.array_split(np.arange(1, n), 3):
        sim[np.ix_(group, group)] = 0.96
    sim[0, :] = sim[:, 0] = 0.999
    np.fill_diagonal(sim, 1.0)
    return sim


def test_a_matching_magnet_enters_every_aggregate_unless_capped() -> None:
    n = 10
    sim = _magnet_similarities(n)
    keeps = [matching_weights(sim[k], k, 0.95, 4, 20.0)[0] for k in range(n)]
    assert all(0 in keep for keep in keeps)  # everyone's nearest neighbour
    capped = cap_matches(keeps, sim, 2.0)
    counts = [sum(i in keep for k, keep in enumerate(capped) if k != i) for i in range(n)]
    median = sorted(counts)[(n - 1) // 2]
    assert counts[0] <= 2 * median < n - 1, counts
    assert all(k in keep for k, keep in enumerate(capped))  # each keeps itself
    same = [k for k in range(1, n) if set(capped[k]) - {0} == set(keeps[k]) - {0}]
    assert len(same) == n - 1  # the honest matches are untouched


def test_the_match_cap_changes_nothing_where_everyone_keeps_everyone() -> None:
    sim = _magnet_similarities(10)
    keeps = [matching_weights(sim[k], k, 0.0, 10, 1.0)[0] for k in range(10)]
    assert [list(k) for k in cap_matches(keeps, sim, 2.0)] == [list(k) for k in keeps]


def test_match_magnet_sends_the_initial_matching_vector_and_a_flipped_scaled_update() -> None:
    cfg = config(method="factorized-fl-alpha", attack="match-magnet", **{"attack-clients": 1})
    client, _ = make_client(cfg)
    v0 = client.model.state_dict()[client.wire.match].numpy().reshape(-1).copy()
    attacker = Attacker(client, "match-magnet", 10.0)
    sent = client.get_parameters({})[:-1]  # the payload: the shared tensors, without v
    honest = make_client(cfg)[0].fit(sent, {"server-round": 1})[0]
    upload, _, _ = attacker.fit(sent, {"server-round": 1})
    assert np.array_equal(upload[-1], v0) and not np.allclose(honest[-1], v0)
    moved = [j for j, (h, s) in enumerate(zip(honest, sent)) if not np.allclose(h, s)]
    assert moved
    for j in moved:
        assert np.allclose(upload[j] - sent[j], -10.0 * (honest[j] - sent[j]), atol=1e-4)


def test_a_methods_own_attacks_live_in_its_package() -> None:
    """The generic machinery names no method's attack; each card's attacks are in its
    package's ATTACKS table, and a wire carries them only when the run asks for one."""
    from pathlib import Path

    from methods import method_attacks, registry

    for method in registry().values():
        assert set(method_attacks(method)) == set(method.attacks), method.name
        for attack in method.attacks:
            assert method_attacks(method)[attack].__module__ == f"{method.package}.attacks"
    generic = (Path(__file__).parents[1] / "client_app" / "attacks.py").read_text()
    assert "type: ignore" not in generic
    assert not any(a in generic for m in registry().values() for a in m.attacks)
    assert not make_client(config(method="factorized-fl-alpha"))[0].wire.attacks


# ---- the shared heads -------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "head"), [("fedcp", "global_head."), ("dualfed", "head.")])
def test_head_flip_changes_the_shared_head_only(method: str, head: str) -> None:
    cfg = config(method=method)
    client, _ = make_client(cfg)
    sent = client.get_parameters({})
    honest = make_client(cfg)[0].fit(sent, {"server-round": 1})[0]
    upload, _, _ = Attacker(client, "head-flip", 10.0).fit(sent, {"server-round": 1})
    names = [s.name for s in client.wire.up_spec()]
    assert any(n.startswith(head) for n in names)
    for name, u, h, s in zip(names, upload, honest, sent):
        if name.startswith(head):
            assert np.allclose(u - s, -10.0 * (h - s), atol=1e-4), name
        else:
            assert np.allclose(u, h), name
