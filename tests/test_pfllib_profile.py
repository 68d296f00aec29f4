"""``profile = "pfllib"``: every method PFLlib has runs as PFLlib d832e76's
system/main.py runs it by default, with the keys a user sets still winning."""

from __future__ import annotations

import pytest

from methods import ConfigError, get_method, method_names, parse_run_config, registry
from pflower.config.defaults import PFLLIB_MODEL, PFLLIB_SCHEDULE

# system/main.py's -algo names at d832e76 (its `args.algorithm == "..."` branches)
PFLLIB_ALGORITHMS = set(
    "FedAvg Local FedMTL PerAvg pFedMe FedProx FedFomo FedAMP APFL FedPer Ditto FedRep "
    "FedPHP FedBN FedROD FedProto FedDyn MOON FedBABU APPLE FedGen SCAFFOLD FD FedALA "
    "FedPAC LG-FedAvg FedGC FML FedKD FedPCL FedCP GPFL FedNTD FedGH FedDBE FedCross".split()
)
IMAGES = {"model": PFLLIB_MODEL, "dataset": "images.parquet"}
WITH_PFLLIB = [m for m in method_names() if get_method(m).pfllib]


def test_the_methods_papers_compare_against_each_name_their_pfllib_algorithm() -> None:
    named = {m: get_method(m).pfllib for m in WITH_PFLLIB}
    assert set(named.values()) <= PFLLIB_ALGORITHMS, named
    want = {"fedavg", "local", "fedper", "fedrep", "fedbn", "ditto", "fedrod", "fedcp"}
    want |= {"fedprox", "scaffold", "lg-fedavg", "fedbabu", "apfl", "per-fedavg"}
    assert want <= set(named)


@pytest.mark.parametrize("method", WITH_PFLLIB)
def test_the_profile_sets_pfllibs_schedule(method: str) -> None:
    cfg = parse_run_config({"method": method, "profile": "pfllib", **IMAGES}).as_dict()
    assert {k: cfg[k] for k in PFLLIB_SCHEDULE} == PFLLIB_SCHEDULE
    assert cfg["augment"] == "none" and cfg["fraction-fit"] == 1.0


def test_each_profiles_keys_are_auto_keys_of_their_method() -> None:
    for method in registry().values():
        params = method.params
        for profile, keys in params.profile_keys.items():
            assert set(keys) <= set(params.auto_keys), (method.name, profile)
            parse_run_config({"method": method.name, "profile": profile, **IMAGES})


def test_the_method_keys_pfllib_runs_by_default() -> None:
    pfl = lambda m, **k: parse_run_config({"method": m, "profile": "pfllib", **IMAGES, **k})  # noqa: E731
    assert pfl("fedcp").params.mmd_lambda == 1.0  # -lam 1.0; ours the paper's 5
    assert parse_run_config({"method": "fedcp", **IMAGES}).params.mmd_lambda == 5.0
    assert pfl("fedbabu").params.finetune_epochs == 10  # -fte 10
    apfl = pfl("apfl").params
    assert (apfl.alpha, apfl.variant, apfl.alpha_decay, apfl.alpha_lr) == (
        1.0,
        "pfllib",
        0.02,
        0.005,
    )
    per = pfl("per-fedavg").params
    assert (per.alpha, per.beta, per.variant) == (0.005, 0.005, "first-order")
    assert pfl("fedprox").params.mu == 0.01  # PFLlib's 0 is FedAvg
    # a key the user sets wins over the profile, common and own
    mine = pfl("apfl", lr=0.01, **{"apfl.alpha": 0.3}).as_dict()
    assert (mine["lr"], mine["apfl.alpha"], mine["apfl.variant"]) == (0.01, 0.3, "pfllib")


def test_a_method_pfllib_lacks_or_another_model_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="config key 'profile': method 'fedfac-static'"):
        parse_run_config({"method": "fedfac-static", "profile": "pfllib", **IMAGES})
    with pytest.raises(ConfigError, match="config key 'model': profile 'pfllib'"):
        parse_run_config({"method": "fedavg", "profile": "pfllib", "model": "resnet8"})
