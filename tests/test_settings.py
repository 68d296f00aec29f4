"""Every method out of the box: its paper's settings (``auto``), model-aware keys,
user values that win, augmentation, FedAvg + fine-tuning, and the method x
backbone matrix."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays

from benchmarks.presets import subset_parquet
from client_app.train import augment_batch, evaluate
from methods import get_method, method_names, parse_run_config, registry
from methods.fedfac import FA_LAYERS
from methods.fedfac.model import check_fa_layers
from models.backbones import build_backbone
from pflower.config.defaults import AUTO_KEYS
from pflower.config.schema import ConfigError, describe_settings
from pflower.data import data_info
from pflower.engine.inprocess import run_inprocess
from tests.helpers import config, make_client, make_strategy

ROOT = Path(__file__).resolve().parents[1]
BASE = {"local-epochs": 1, "optimizer": "sgd", "weight-decay": 0.0}

# each paper's, written out: (local-epochs, batch-size, optimizer, lr, momentum, wd)
PAPER = {
    "feddecomp": (5, 100, "sgd", 0.1, 0.9, 0.0),
    "fedcp": (1, 10, "sgd", 0.005, 0.0, 0.0),
    "factorized-fl-alpha": (5, 256, "sgd", 1e-3, 0.9, 1e-6),
    "factorized-fl-beta": (5, 256, "sgd", 1e-3, 0.9, 1e-6),
    "fedfac-static": (1, 32, "adam", 1e-3, 0.0, 0.0),
    "fedfac-dynamic": (1, 32, "adam", 1e-3, 0.0, 0.0),
    "dualfed": (1, 256, "sgd", 0.01, 0.5, 0.0),
    "gpfl": (1, 10, "sgd", 0.005, 0.0, 0.0),
}
# baselines: one epoch of SGD at the backbone's stable step (methods/baselines)
BASELINE = {
    "mlp": (1, 32, "sgd", 0.05, 0.0, 0.0),
    "cnn4": (1, 50, "sgd", 0.01, 0.9, 0.0),
    "resnet8": (1, 50, "sgd", 0.1, 0.9, 0.0),
}


def schedule(cfg) -> tuple:
    return (cfg.local_epochs, cfg.batch_size, cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay)


@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("model", ["mlp", "cnn4", "resnet8"])
def test_auto_resolves_to_the_papers_settings(method: str, model: str) -> None:
    cfg = parse_run_config({"method": method, "model": model})
    assert schedule(cfg) == PAPER.get(method, BASELINE[model])
    if method == "feddecomp":
        assert cfg.params.lora_epochs == 2  # E_lora = 2 of E = 5


def test_pyproject_defaults_every_auto_key_to_auto() -> None:
    from flwr.common.config import flatten_dict

    nested = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    app = flatten_dict(nested)
    own = {f"{m.params.namespace}.{k}" for m in registry().values() for k in m.params.auto_keys}
    # domain-groups' "auto" is one of its own values (it needs the data set to resolve)
    assert {k for k, v in app.items() if v == "auto"} - {"domain-groups"} == {*AUTO_KEYS, *own}
    # the whole pyproject default config is valid for every method as it stands
    for method in method_names():
        parse_run_config({**app, "method": method})


def test_python_floor_is_311() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"


@pytest.mark.parametrize(
    ("method", "key", "value"),
    [
        ("feddecomp", "lr", 0.02),  # a schedule key
        ("fedcp", "batch-size", 64),
        ("fedfac-static", "optimizer", "sgd"),
        ("feddecomp", "feddecomp.lora-epochs", 4),  # a method key derived from another
        ("dualfed", "augment", "none"),  # augmentation
        ("fedfac-dynamic", "fedfac.fa-layers", "features.0"),  # a model-aware key
        ("factorized-fl-beta", "factorized-fl.epsilon", 3.0),  # a partitioner-aware key
    ],
)
def test_a_user_value_wins_over_auto(method: str, key: str, value) -> None:
    raw = {"method": method, "model": "cnn4", "dataset": "x.parquet", "partitioner": "domain"}
    raw[key] = value
    cfg = parse_run_config(raw)
    assert cfg.as_dict()[key] == value and key not in cfg.auto_resolved
    auto = parse_run_config({**raw, key: "auto"})
    assert auto.as_dict()[key] != value and key in auto.auto_resolved
    assert f"{key}={value} (set)" in describe_settings(cfg)


def test_derived_and_scenario_keys() -> None:
    # feddecomp.lora-epochs follows local-epochs (2 of 5), FedDecomp needs 2 epochs to alternate
    assert parse_run_config({"method": "feddecomp", "local-epochs": 10}).params.lora_epochs == 4
    with pytest.raises(ConfigError, match="'local-epochs'"):
        parse_run_config({"method": "feddecomp", "local-epochs": 1})
    # Factorized-FL's domain-scenario values follow partitioner=domain
    dom = parse_run_config({"method": "factorized-fl-beta", "partitioner": "domain"})
    assert (dom.params.sim_threshold, dom.params.epsilon, dom.params.min_aggr) == (0.95, 20.0, 4)
    single = parse_run_config({"method": "factorized-fl-beta", "partitioner": "dirichlet"})
    assert (single.params.sim_threshold, single.params.epsilon, single.params.min_aggr) == (
        0.0,
        1.0,
        10,
    )
    # DualFed augments images with flips and rotations; nothing augments the generated study
    assert parse_run_config({"method": "dualfed", "dataset": "a.parquet"}).augment == "flip-rotate"
    assert parse_run_config({"method": "dualfed"}).augment == "none"
    assert parse_run_config({"method": "fedavg", "dataset": "a.parquet"}).augment == "none"
    # DualFed's stage 2 with pretrained weights: stage 1's epochs and lr (the paper's),
    # h_s as is; set values win
    raw = {"method": "dualfed", "dataset": "a.parquet", "model": "resnet18"}
    pretrained = {**raw, "pretrained-weights": "imagenet"}
    paper = parse_run_config(pretrained)
    assert (paper.params.global_head_epochs, paper.params.global_head_lr) == (1, 0.01)
    assert (paper.params.global_prior, paper.batch_size) == ("none", 256)
    own = parse_run_config({**pretrained, "local-epochs": 3, "lr": 0.2})
    assert (own.params.global_head_epochs, own.params.global_head_lr) == (3, 0.2)
    # from random init on images: a stage 2 that trains h_s, and the client's label prior
    scratch = parse_run_config(raw)
    assert (scratch.params.global_head_epochs, scratch.params.global_head_lr, scratch.lr) == (
        20,
        0.1,
        0.01,
    )
    assert scratch.params.global_prior == "client-if-skewed"
    # and the baselines' batch (the paper's 256 leaves the personal branch few steps)
    assert scratch.batch_size == 50
    assert parse_run_config({**raw, "batch-size": 128}).batch_size == 128
    # the generated study keeps the paper's stage 2 and batch
    study = parse_run_config({"method": "dualfed"})
    assert (study.params.global_head_epochs, study.params.global_head_lr) == (1, 0.01)
    assert (study.params.global_prior, study.batch_size) == ("none", 256)
    set_ = parse_run_config(
        {**raw, "dualfed.global-head-epochs": 2, "dualfed.global-prior": "none"}
    )
    assert (
        set_.params.global_head_epochs,
        set_.params.global_head_lr,
        set_.params.global_prior,
    ) == (
        2,
        0.1,
        "none",
    )


@pytest.mark.parametrize("model", sorted(FA_LAYERS))
def test_fa_layers_auto_names_splittable_layers_of_each_backbone(model: str) -> None:
    cfg = parse_run_config({"method": "fedfac-dynamic", "model": model})
    shape = (20,) if model == "mlp" else (3, 32, 32)
    check_fa_layers(build_backbone(model, shape, 10), cfg)  # raises ConfigError if not


def test_keys_a_model_cannot_use_are_config_errors() -> None:
    cfg = parse_run_config(
        {"method": "fedfac-static", "model": "mlp", "fedfac.fa-layers": "features.7"}
    )
    with pytest.raises(ConfigError, match="'fedfac.fa-layers'"):
        get_method(cfg.method).build_model(cfg, data_info(cfg))
    with pytest.raises(ConfigError, match="'pretrained-weights'"):
        parse_run_config({"model": "cnn4", "pretrained-weights": "w.pt"})


@pytest.mark.parametrize("kind", ["crop-flip", "flip-rotate"])
def test_augmentation_is_seeded_per_sample_and_keeps_shape(kind: str) -> None:
    x = torch.randn(16, 3, 32, 32)
    a = augment_batch(x, kind, torch.Generator().manual_seed(1))
    b = augment_batch(x, kind, torch.Generator().manual_seed(1))
    c = augment_batch(x, kind, torch.Generator().manual_seed(2))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    changed = [(a[i] != x[i]).any().item() for i in range(16)]
    assert 0 < sum(changed) <= 16  # some samples altered ...
    # ... each with its own draw: no two altered samples moved by the same transform
    diffs = {tuple((a[i] - x[i]).flatten()[:50].tolist()) for i in range(16) if changed[i]}
    assert len(diffs) > 1
    assert augment_batch(x, "none", torch.Generator()) is x
    flat = torch.randn(8, 20)  # non-image inputs pass through
    assert augment_batch(flat, kind, torch.Generator()) is flat


def test_crop_flip_is_a_shifted_window_of_the_padded_image() -> None:
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6) + 1
    out = augment_batch(x, "crop-flip", torch.Generator().manual_seed(0))
    for i in range(2):
        padded = torch.nn.functional.pad(x[i], (4, 4, 4, 4))
        windows = [padded[:, dy : dy + 6, dx : dx + 6] for dy in range(9) for dx in range(9)]
        windows += [w.flip(-1) for w in windows]
        assert any(torch.equal(out[i], w) for w in windows)


def test_fedavg_ft_fine_tunes_a_copy_that_never_leaves() -> None:
    cfg = config(method="fedavg-ft", **{"fedavg-ft.finetune-epochs": 3})
    client, _ = make_client(cfg)
    strategy = make_strategy(cfg)
    payload = parameters_to_ndarrays(strategy.global_payload())
    before = copy.deepcopy(client.model.state_dict())
    client.receive(payload, {})
    loss, _, metrics = client.evaluate(payload, {"server-round": 1})
    after = client.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the copy was discarded
    global_loss, _ = evaluate(client.model, client.x_test, client.y_test)
    assert loss != pytest.approx(global_loss)  # the score is the fine-tuned copy's
    upload, _, _ = client.fit(payload, {"server-round": 1})
    assert len(upload) == len(strategy.spec)  # FedAvg's wire: the whole model
    no_ft = make_client(config(method="fedavg-ft", **{"fedavg-ft.finetune-epochs": 0}))[0]
    loss0, _, m0 = no_ft.evaluate(payload, {"server-round": 1})
    assert m0["accuracy"] == m0["accuracy-global"]
    assert loss0 == pytest.approx(evaluate(no_ft.model, no_ft.x_test, no_ft.y_test)[0])


# ---- the matrix: every method on every backbone, 1 round, 2 clients ----------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    return subset_parquet(160, 0, tmp_path_factory.mktemp("data"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "cnn4", "resnet8"])
@pytest.mark.parametrize("method", method_names())
def test_every_method_runs_on_every_backbone(
    method: str, model: str, images, tmp_path, monkeypatch
) -> None:
    import torch

    lrs: list[float] = []  # the learning rate of every optimizer the clients build
    init = torch.optim.Optimizer.__init__

    def seen(self, params, defaults) -> None:  # noqa: ANN001
        lrs.append(float(defaults.get("lr", float("nan"))))
        init(self, params, defaults)

    monkeypatch.setattr(torch.optim.Optimizer, "__init__", seen)
    data = {"sim-samples": 60, "hidden-dim": 16} if model == "mlp" else {"dataset": images}
    cfg = {
        "method": method,
        "model": model,
        "num-server-rounds": 1,
        "output-dir": str(tmp_path),
        "run-name": "cell",
        **data,
    }
    res = run_inprocess(cfg, num_clients=2)
    (record,) = res["rounds"]
    assert sorted(record["per_client_accuracy"]) == ["client-0", "client-1"]
    assert 0.0 <= record["accuracy_mean"] <= 1.0 and np.isfinite(record["accuracy_mean"])
    resolved = parse_run_config({"method": method, "model": model, **data})
    assert res["config"]["lr"] == resolved.lr  # recorded as resolved
    assert resolved.lr in lrs, lrs  # and the clients' training used it
    if method != "local":
        assert record["bytes_up"] > 0


def test_docs_settings_table_is_current() -> None:
    """docs/SETTINGS.md is what `python -m methods.config_tables settings` prints now."""
    from methods.config_tables import settings_markdown

    committed = (ROOT / "docs" / "SETTINGS.md").read_text()
    assert committed.strip() == settings_markdown().strip()


def test_pyproject_has_every_method_key_with_its_default() -> None:
    """pyproject.toml's method tables are what `python -m methods.config_tables` writes."""
    from methods.config_tables import committed, tables

    assert committed() == tables()


def test_a_run_resolves_its_config_once_per_process(monkeypatch, tmp_path) -> None:
    """The ServerApp, every ClientApp message and its mods read one parsed config:
    ``auto`` is resolved once in a process that runs the whole federation."""
    import methods
    import pflower.config.schema as schema

    calls = []
    resolve = schema.resolve_auto
    monkeypatch.setattr(schema, "resolve_auto", lambda *a: calls.append(1) or resolve(*a))
    methods._parse_cached.cache_clear()
    raw = {"method": "fedper", "num-server-rounds": 2, "sim-samples": 40, "hidden-dim": 8}
    res = run_inprocess({**raw, "output-dir": str(tmp_path), "run-name": "once"}, num_clients=2)
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        ({"mmd-lambda": 5}, "'fedcp.mmd-lambda'"),  # a method's key without its namespace
        ({"local-epoch": 2}, "'local-epochs'"),
        ({"method": "fedcp", "fedcp.mmd-lamda": 1}, "'fedcp.mmd-lambda'"),
    ],
)
def test_an_unknown_key_suggests_the_closest_valid_one(raw: dict, hint: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean {hint}"):
        parse_run_config(raw)


def test_an_unknown_key_with_nothing_close_gets_no_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        parse_run_config({"zzz-qqq": 1})
    assert "unknown config key 'zzz-qqq'" in str(err.value) and "did you mean" not in str(err.value)


def test_the_settings_line_names_the_model_and_the_data_it_runs_on(tmp_path) -> None:
    """#106: the log said 'on synthetic' while the clients read their folders."""
    folders = [tmp_path / "hospital-a", tmp_path / "hospital-b"]
    for f in folders:
        (f / "benign").mkdir(parents=True)
    cfg = config(model="cnn4", **{"client-data-paths": ",".join(map(str, folders))})
    line = describe_settings(cfg)
    assert line.endswith("; model=cnn4 on 2 per-client folders (hospital-a, ...)")
    assert describe_settings(config()).endswith(f"; model={config().model} on synthetic")
    declared = config(**{"input-shape": "3,32,32", "num-classes": 2})
    assert describe_settings(declared).endswith("on the sites' data")
