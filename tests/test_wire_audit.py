"""The wire audit: every reply of every client (fit and evaluate: arrays and
metrics), and every instruction's config, for every method and mode, in a real
run (server_app/inprocess.py: the real strategy, real clients per message).

A fit reply carries exactly the method's upload spec (checked by the strategy's
own spec of that round), or nothing (a held-out new client), or, only with
``ensemble-share-models=true``, the site's whole personalised model. Metrics are
numbers or short identifiers: never bytes, never long strings. Evaluate replies
carry no arrays (Flower's EvaluateRes has none) and the same kind of metrics.
The one bytes value in an instruction is FedFac's packed personal-element mask,
exactly the size of its layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flwr.common import EvaluateRes, FitRes, parameters_to_ndarrays

from models.fedfac import MASK_KEY
from run_config.schema import METHODS, parse_run_config
from server_app.inprocess import build_inprocess

MODES = [(m, {}) for m in METHODS] + [
    (
        "fedfac-static",
        {"new-clients": 1, "new-client-mode": "ensemble", "ensemble-share-models": True},
    ),
    ("fedfac-dynamic", {"new-clients": 1, "new-client-mode": "localtrain"}),
    ("fedfac-dynamic", {"fa-input": "updates"}),
]
SHORT = 64  # longest string a metric may carry (client keys, mode names)


def check_values(where: str, values: dict[str, Any], masks: dict[str, int] | None = None) -> None:
    for key, value in values.items():
        if isinstance(value, bytes):
            assert masks is not None and key.startswith(MASK_KEY), f"{where}: bytes in {key!r}"
            size = masks[key.removeprefix(MASK_KEY)]
            assert len(value) == (size + 7) // 8, f"{where}: {key!r} is not a {size}-bit mask"
        elif isinstance(value, str):
            assert len(value) <= SHORT, f"{where}: {len(value)}-char string in {key!r}"
        else:
            assert isinstance(value, (bool, int, float)), f"{where}: {type(value)} in {key!r}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "mode"), MODES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(MODES)]
)
def test_every_reply_carries_only_what_the_method_shares(method, mode, tmp_path) -> None:
    config = {
        "method": method,
        "num-server-rounds": 2,
        "sim-samples": 60,
        "hidden-dim": 16,
        "output-dir": str(tmp_path),
        "run-name": "audit",
        **mode,
    }
    cfg = parse_run_config(config)
    seen: dict[str, int] = {"fit": 0, "evaluate": 0, "share-model": 0}

    def record(kind: str, cid: str, ins: Any, res: FitRes | EvaluateRes) -> None:
        strategy = server.strategy
        masks = getattr(strategy, "sizes", None)
        check_values(f"{kind} instruction to node {cid}", ins.config, masks)
        check_values(f"{kind} reply from node {cid}", res.metrics)
        key = res.metrics.get("client-key")
        assert isinstance(key, str) and key.startswith("client-")
        if kind == "evaluate":  # an EvaluateRes holds only loss, count and metrics
            seen["evaluate"] += 1
            return
        arrays = parameters_to_ndarrays(res.parameters)
        if ins.config.get("fa-phase") == "share-model":  # the consented Ensemble
            assert cfg.ensemble_share_models
            assert [a.shape for a in arrays] == [s.shape for s in strategy.model_spec]
            seen["share-model"] += 1
        elif res.metrics.get("fa-held-out"):
            assert arrays == []  # a new client never uploads
        else:
            assert strategy.check_reply(key, arrays, res.num_examples) is None
            seen["fit"] += 1

    threads = torch.get_num_threads()
    try:
        server, rounds = build_inprocess(config, 3, record)
        server.fit(rounds, timeout=None)
    finally:
        torch.set_num_threads(threads)
    assert seen["fit"] >= 2 and seen["evaluate"] >= 2  # eval-in-fit: evaluate closes the run
    assert (seen["share-model"] > 0) == cfg.ensemble_share_models
    assert (
        np.isfinite(server.strategy.global_arrays[0]).all()
        if server.strategy.global_arrays
        else True
    )
