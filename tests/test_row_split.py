"""The split abstraction carries a row-level split (models/roles.py ``Split``,
``Roles.rows``); a rule may read the run config; FedFac's wire is of one split."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from models.roles import Roles, Split, nothing_personal


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_a_rule_may_split_rows_and_read_the_config() -> None:
    rows = np.array([True, False, False, True])

    def rule(model: nn.Module, cfg: dict) -> Split:
        return Split(frozenset(cfg["personal"]), {"0.weight": rows})

    roles = Roles.of(_model(), rule, {"personal": ["2.bias"]})
    assert roles.personal == ("2.bias",) and "0.weight" in roles.shared
    assert roles.shared_rows("0.weight").tolist() == [False, True, True, False]
    assert roles.shared_rows("0.bias") is None
    assert not roles.rows["0.weight"].flags.writeable  # the split is not edited in place
    assert Roles.of(_model(), nothing_personal).rows == {}  # the one-argument rules as before


def test_a_row_split_must_fit_a_shared_entry() -> None:
    roles = Roles.of(_model(), lambda m: {"2.bias"})
    with pytest.raises(ValueError, match="'2.bias', which is not a shared entry"):
        roles.with_rows({"2.bias": np.ones(2, bool)}, {"2.bias": 2})
    with pytest.raises(ValueError, match="'0.weight' is not 4 booleans"):
        roles.with_rows({"0.weight": np.ones(3, bool)}, {"0.weight": 4})


def test_fedfac_wire_is_of_one_split() -> None:
    from methods import get_method, parse_run_config
    from pflower.data import data_info

    cfg = parse_run_config({"method": "fedfac-static", "hidden-dim": 8, "sim-samples": 20})
    method = get_method(cfg.method)
    model = method.build_model(cfg, data_info(cfg))
    roles = method.roles(model, cfg)
    wire = method.build_wire(model, roles, cfg)
    assert wire.shared is None and wire.full_upload()
    shared = {"features.1": np.arange(8) < 5}
    split = wire.with_split(shared)
    assert wire.shared is None  # the first wire is unchanged
    assert split.roles.shared_rows("features.1.weight").tolist() == shared["features.1"].tolist()
    assert split.roles.shared_rows("features.1.bias").tolist() == shared["features.1"].tolist()
    payload = split.encode_down([np.zeros(s.shape, s.dtype) for s in wire.spec])
    got = wire.for_payload(payload)  # a client reads the split the payload carries
    assert got.shared is not None and (got.shared["features.1"] == shared["features.1"]).all()
    assert [s.shape for s in got.up_spec()] == [s.shape for s in split.up_spec()]
