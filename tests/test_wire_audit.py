"""The wire audit: every reply of every client (fit and evaluate: arrays and
metrics), and every instruction's config, for every method and mode, in a real
run (pflower/engine/inprocess.py: the real strategy, real clients per message).

By content, not by spec: for every fit reply, pflower.privacy.audit tries to rebuild
each of the client's personal tensors (as they stood when it replied) from what
the client sent and what the server had sent it. What it rebuilds must be exactly
what the method declares (``Method.disclosures``): an undeclared disclosure fails,
and so does a declared one that the wire does not carry (a stale declaration).
Metrics are numbers or short identifiers: never bytes, never long strings.
Evaluate replies carry no arrays (Flower's EvaluateRes has none). The one bytes
value in an instruction is FedFac's packed personal-element mask, exactly the
size of its layer.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

import numpy as np
import pytest
import torch
from flwr.common import EvaluateRes, FitRes, parameters_to_ndarrays

from client_app.method_client import client_class
from methods import get_method, parse_run_config
from pflower.cli.disclosures import MODES as TABLE_MODES
from pflower.engine.inprocess import build_inprocess
from pflower.privacy.audit import recover
from tests.helpers import image_folder

IMAGES = "<image folder>"  # replaced by a small image folder made per test

# every row of docs/PRIVACY.md's table, each method's options that change what it
# trains or sends, FedBN on a BatchNorm backbone, and more FedFac new-client variants
MODES = TABLE_MODES + [
    ("fedbn", {"model": "resnet8", "dataset": IMAGES}),
    ("fedper", {"model": "resnet8", "dataset": IMAGES}),
    ("ditto", {"ditto.lambda": 0.0, "ditto.personal-epochs": 2}),
    ("fedrep", {"fedrep.head-epochs": 2}),
    ("fedavg-ft", {"fedavg-ft.finetune-epochs": 0}),
    ("fedcp", {"fedcp.noisy-eval": True, "fedcp.mmd-lambda": 0.0}),
    ("dualfed", {"dualfed.personal-loss": "combined", "dualfed.global-prior": "none"}),
    ("factorized-fl-beta", {"factorized-fl.rank": 2, "factorized-fl.l1": 0.0}),
    ("feddecomp", {"feddecomp.rank-basis": "out", "feddecomp.linear-rank-abs": 2}),
    ("fedfac-static", {"fedfac.fa-split": "random"}),
    # the authors' keys (issue #92): mu whole on the wire, momentum kept as personal state;
    # every Lambda channel and every BN statistic personal
    (
        "factorized-fl-beta",
        {"factorized-fl.mu-wire": "dense", "factorized-fl.optimizer-state": "kept"},
    ),
    (
        "fedfac-dynamic",
        {"model": "resnet8", "dataset": IMAGES, "fedfac.tau": "inf", "fedfac.bn-stats": "local"},
    ),
    ("fedfac-dynamic", {"fedfac.new-clients": 1, "fedfac.new-client-mode": "localtrain"}),
    (
        "fedfac-dynamic",
        {
            "fedfac.new-clients": 1,
            "fedfac.new-client-mode": "ensemble",
            "fedfac.ensemble-share-models": True,
        },
    ),
]
SHORT = 64  # longest string a metric may carry (client keys, mode names)


def check_values(where: str, values: dict[str, Any]) -> None:
    """Instructions and metrics carry short scalars only: no tensor travels as config
    (FedFac's split travels in the payload, through its wire)."""
    for key, value in values.items():
        assert not isinstance(value, bytes), f"{where}: bytes in {key!r}"
        if isinstance(value, str):
            assert len(value) <= SHORT, f"{where}: {len(value)}-char string in {key!r}"
        else:
            assert isinstance(value, (bool, int, float)), f"{where}: {type(value)} in {key!r}"


def audit_run(method: str, mode: dict[str, Any], tmp_path, monkeypatch) -> dict[str, Any]:
    """A 2-round, 3-client in-process run of ``method`` in ``mode``; every fit reply
    audited by content. Returns what it saw, the personal tensors and what the
    audit rebuilt from the wire (name -> how)."""
    mode = dict(mode)
    if mode.get("dataset") == IMAGES:  # a BatchNorm backbone needs images
        mode["dataset"] = str(image_folder(tmp_path / "images", per_class=12, side=16))
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
    truth: dict[str, dict[str, np.ndarray]] = {}  # client key -> personal tensors at reply
    recovered: dict[str, str] = {}  # personal tensor name -> how the audit rebuilt it

    cls = client_class(get_method(method))
    fit = cls.fit

    def fit_and_note_personal(self, parameters, config):  # noqa: ANN001, ANN202
        reply = fit(self, parameters, config)
        truth[self.client_key] = self.personal_tensors()
        return reply

    monkeypatch.setattr(cls, "fit", fit_and_note_personal)

    def record(kind: str, cid: str, ins: Any, res: FitRes | EvaluateRes) -> None:
        strategy = server.strategy
        check_values(f"{kind} instruction to node {cid}", ins.config)
        check_values(f"{kind} reply from node {cid}", res.metrics)
        key = res.metrics.get("client-key")
        assert isinstance(key, str) and key.startswith("client-")
        if kind == "evaluate":  # an EvaluateRes holds only loss, count and metrics
            seen["evaluate"] += 1
            return
        sent = parameters_to_ndarrays(res.parameters)
        received = parameters_to_ndarrays(ins.parameters)
        for name, how in recover(truth[key], sent, received, res.metrics).items():
            recovered.setdefault(name, f"{how} (client {key}, {kind})")
        if ins.config.get("fa-phase") == "share-model":
            seen["share-model"] += 1
        elif res.metrics.get("fa-held-out"):
            assert sent == []  # a new client never uploads
        else:
            assert strategy.check_reply(key, sent, res.num_examples) is None
            seen["fit"] += 1

    threads = torch.get_num_threads()
    try:
        server, rounds = build_inprocess(config, 3, record)
        server.fit(rounds, timeout=None)
    finally:
        torch.set_num_threads(threads)
    return {"cfg": cfg, "seen": seen, "truth": truth, "recovered": recovered}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "mode"), MODES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(MODES)]
)
def test_what_leaves_a_client_is_exactly_what_the_method_declares(
    method, mode, tmp_path, monkeypatch
) -> None:
    run = audit_run(method, mode, tmp_path, monkeypatch)
    cfg, seen, truth, recovered = run["cfg"], run["seen"], run["truth"], run["recovered"]
    declared = get_method(method).disclosures(cfg)
    assert seen["fit"] >= 2 and seen["evaluate"] >= 2  # eval-in-fit: evaluate closes the run
    assert (seen["share-model"] > 0) == getattr(cfg.params, "ensemble_share_models", False)
    assert truth, "no fit reached a client"
    if method == "fedbn" and cfg.model == "resnet8":  # the audit has BatchNorm to look at
        assert any("bn" in name or "downsample.1" in name for name in next(iter(truth.values())))

    undeclared = {
        name: how
        for name, how in recovered.items()
        if not any(fnmatch(name, p) for d in declared for p in d.tensors)
    }
    assert not undeclared, f"{method} {mode}: undeclared disclosure {undeclared}"
    for d in declared:
        if d.audited:
            found = [n for n in recovered if any(fnmatch(n, p) for p in d.tensors)]
            assert found, f"{method} {mode}: declares {d.kind}, but the wire does not carry it"


# ---- planted leaks: each form an attacker at the server would exploit must fail the audit -----


def _ditto_personal(client: Any) -> list[np.ndarray]:
    return [v.copy() for v in client.personal_tensors().values()]


def _noisy(client: Any, upload: list[np.ndarray]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # N(0, 1e-4), as the probe in issue #42
    return [(p + rng.normal(0, 1e-4, p.shape)).astype(np.float32) for p in _ditto_personal(client)]


def _fp16(client: Any, upload: list[np.ndarray]) -> list[np.ndarray]:
    return [p.astype(np.float16).astype(np.float32) for p in _ditto_personal(client)]


def _half_rows(client: Any, upload: list[np.ndarray]) -> list[np.ndarray]:
    out = [u.copy() for u in upload]
    personal = _ditto_personal(client)
    rows = personal[0].shape[0] // 2  # personal.features.1.weight's first half
    out[0][:rows] = personal[0][:rows]
    return out


PLANTED = {
    "noise": ("ditto", _noisy, "personal.features.1.weight"),
    "float16": ("ditto", _fp16, "personal.features.1.weight"),
    "half-rows": ("ditto", _half_rows, "personal.features.1.weight"),
}


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_a_planted_leak_in_the_upload_fails_the_audit(form: str, tmp_path, monkeypatch) -> None:
    method, leak, tensor = PLANTED[form]
    cls = client_class(get_method(method))
    upload = cls.upload
    monkeypatch.setattr(cls, "upload", lambda self, c: leak(self, upload(self, c)))
    recovered = audit_run(method, {}, tmp_path, monkeypatch)["recovered"]
    assert tensor in recovered, f"{form}: the audit missed it ({recovered})"


def test_a_personal_head_sent_as_metrics_fails_the_audit(tmp_path, monkeypatch) -> None:
    cls = client_class(get_method("fedper"))
    fit = cls.fit

    def leaky(self, parameters, config):  # noqa: ANN001, ANN202
        arrays, n, metrics = fit(self, parameters, config)
        head = self.personal_tensors()["head.weight"].ravel()
        return arrays, n, {**metrics, **{f"h{i}": float(v) for i, v in enumerate(head[:8])}}

    monkeypatch.setattr(cls, "fit", leaky)
    recovered = audit_run("fedper", {}, tmp_path, monkeypatch)["recovered"]
    assert "head.weight" in recovered and "metrics" in recovered["head.weight"]
