"""Per-method and per-model settings: what an ``auto`` key resolves to.

Every key in ``AUTO_KEYS`` may be ``"auto"`` (the default in pyproject.toml) or
left out; it then takes the method's paper value (``PAPER_SETTINGS``), or for the
baselines a model-aware default (``BASELINE_SETTINGS``), or a value that depends
on the backbone or the partitioner (``resolve_auto``). A value the user sets
always wins. This module is plain data and imports nothing heavy: the pre-flight
check (``python -m run_config.check``) resolves a config in well under a second.

Sources: ../shared/METHODS.md (each paper, or its reference code where the paper
is silent). Baselines: the values the project measured as stable per backbone
(docs/RESULTS.md: lr 0.05 collapsed FedAvg's CNN, lr 0.01 with momentum did not;
ResNet-8 with BatchNorm trains stably at FedDecomp's lr 0.1).
"""

from __future__ import annotations

from typing import Any

AUTO = "auto"

# The local schedule and optimiser of each method's paper.
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    # FedDecomp: E = 5 (2 on tau, 3 on sigma), SGD 0.1, momentum 0.9, batch 100
    "feddecomp": {
        "local-epochs": 5,
        "batch-size": 100,
        "optimizer": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "weight-decay": 0.0,
    },
    # FedCP: SGD 0.005, no momentum, batch 10, 1 epoch
    "fedcp": {
        "local-epochs": 1,
        "batch-size": 10,
        "optimizer": "sgd",
        "lr": 0.005,
        "momentum": 0.0,
        "weight-decay": 0.0,
    },
    # Factorized-FL (reference): SGD 1e-3, momentum 0.9, wd 1e-6, 5 epochs, batch 256
    "factorized-fl-alpha": {
        "local-epochs": 5,
        "batch-size": 256,
        "optimizer": "sgd",
        "lr": 0.001,
        "momentum": 0.9,
        "weight-decay": 1e-6,
    },
    # FedFac: Adam 1e-3 (the paper states no epochs or batch size: 1 and 32)
    "fedfac-static": {
        "local-epochs": 1,
        "batch-size": 32,
        "optimizer": "adam",
        "lr": 0.001,
        "momentum": 0.0,
        "weight-decay": 0.0,
    },
    # DualFed: SGD 0.01, momentum 0.5, batch 256, E = 1 per stage
    "dualfed": {
        "local-epochs": 1,
        "batch-size": 256,
        "optimizer": "sgd",
        "lr": 0.01,
        "momentum": 0.5,
        "weight-decay": 0.0,
    },
}
PAPER_SETTINGS["factorized-fl-beta"] = PAPER_SETTINGS["factorized-fl-alpha"]
PAPER_SETTINGS["fedfac-dynamic"] = PAPER_SETTINGS["fedfac-static"]

# Baselines (fedavg, local, fedper, fedrep, fedbn, fedavg-ft): one local epoch of
# SGD, with the step size the backbone trains stably at.
BASELINE_SETTINGS: dict[str, dict[str, Any]] = {
    "mlp": {"lr": 0.05, "momentum": 0.0, "batch-size": 32},
    "cnn4": {"lr": 0.01, "momentum": 0.9, "batch-size": 50},
    "resnet": {"lr": 0.1, "momentum": 0.9, "batch-size": 50},
}
BASELINE_COMMON = {"local-epochs": 1, "optimizer": "sgd", "weight-decay": 0.0}

# FedFac's Lambda per backbone: the hidden layers below the head whose elements
# do not sit on a residual path (a ResNet block's first conv: its channels feed
# only the block's second conv, so a personal channel never mixes into the skip).
FA_LAYERS: dict[str, str] = {
    "mlp": "features.1",  # the hidden Linear (the simulation study's m neurons)
    "cnn4": "features.7",  # the 512-unit Linear before the head
    "resnet8": "features.4.conv1,features.5.conv1,features.6.conv1",
    "resnet10": "features.4.conv1,features.5.conv1,features.6.conv1,features.7.conv1",
    "resnet18": "features.0.layer3.0.conv1,features.0.layer4.0.conv1",
}

# Methods whose paper trained with augmentation (DualFed: flips and rotations).
PAPER_AUGMENT = {"dualfed": "flip-rotate"}

SCHEDULE_KEYS = ("local-epochs", "batch-size", "optimizer", "lr", "momentum", "weight-decay")
AUTO_KEYS = (
    *SCHEDULE_KEYS,
    "lora-epochs",
    "augment",
    "fa-layers",
    "ffl-sim-threshold",
    "ffl-epsilon",
    "ffl-min-aggr",
    "eval-in-fit",
    "supcon-lambda",
    "global-head-epochs",
    "global-head-lr",
    "dual-global-prior",
)

# The method-specific auto keys, and the methods that read them.
_FFL = ("factorized-fl-alpha", "factorized-fl-beta")
USED_BY = {
    "lora-epochs": ("feddecomp",),
    "fa-layers": ("fedfac-static", "fedfac-dynamic"),
    "ffl-sim-threshold": _FFL,
    "ffl-epsilon": _FFL,
    "ffl-min-aggr": _FFL,
    "supcon-lambda": ("dualfed",),
    "global-head-epochs": ("dualfed",),
    "global-head-lr": ("dualfed",),
    "dual-global-prior": ("dualfed",),
}


def _model_family(model: str) -> str:
    return "resnet" if model.startswith("resnet") else model


def is_image(raw: dict[str, Any]) -> bool:
    """Whether the run's data are images: every data set but the generated study."""
    return raw.get("dataset", "synthetic") != "synthetic" or bool(raw.get("client-data-paths"))


def resolve_auto(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Replace every ``auto`` (or missing) key of ``AUTO_KEYS`` in a raw config.

    Returns the new raw config and the keys that were resolved. ``raw`` uses the
    hyphenated keys; values that are not ``auto`` are kept as given.
    """
    out = dict(raw)
    method = str(out.get("method", "fedavg"))
    model = str(out.get("model", "mlp"))
    settings = PAPER_SETTINGS.get(method)
    if settings is None:  # a baseline
        settings = {**BASELINE_COMMON, **BASELINE_SETTINGS.get(_model_family(model), {})}
    domain = out.get("partitioner") == "domain"
    resolved = []

    def pending(key: str) -> bool:
        return out.get(key, AUTO) == AUTO

    # DualFed from random init on images (not the generated study, not pretrained)
    scratch_images = is_image(out) and not out.get("pretrained-weights")
    if method == "dualfed" and scratch_images:
        # the paper's batch 256 (for a pretrained encoder) gives a feature-shift client 5
        # steps a round: the personal branch stays under-confident and the combination
        # falls under it at 10 rounds; batch 50, the baselines', fixes it (docs/dualfed.md)
        settings = {**settings, "batch-size": 50}
    for key in SCHEDULE_KEYS:
        if pending(key) and key in settings:
            out[key] = settings[key]
            resolved.append(key)
    if pending("lora-epochs"):
        # the paper's 2 of 5 epochs on tau, in proportion when local-epochs changes:
        # at least 1 epoch on tau and 1 on sigma
        epochs = out.get("local-epochs")
        if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs >= 1:
            alternating = out.get("decomp-schedule", "alternating") == "alternating"
            if method == "feddecomp" and alternating and epochs < 2:
                raise ValueError(
                    f"config key 'local-epochs': FedDecomp's alternating round needs at least 2 "
                    f"epochs (lora-epochs on tau, the rest on sigma), got {epochs}; leave it "
                    "'auto' (5, the paper's) or set lora-epochs yourself"
                )
            out["lora-epochs"] = max(1, min(round(epochs * 2 / 5), epochs - 1))
        else:
            out["lora-epochs"] = 2
        resolved.append("lora-epochs")
    if pending("augment"):
        out["augment"] = PAPER_AUGMENT.get(method, "none") if is_image(out) else "none"
        resolved.append("augment")
    if pending("fa-layers"):
        out["fa-layers"] = FA_LAYERS.get(model, FA_LAYERS["mlp"])
        resolved.append("fa-layers")
    # Factorized-FL: the reference's domain-heterogeneous values with partitioner=domain
    for key, single, per_domain in (
        ("ffl-sim-threshold", 0.0, 0.95),
        ("ffl-epsilon", 1.0, 20.0),
        ("ffl-min-aggr", 10, 4),
    ):
        if pending(key):
            out[key] = per_domain if domain else single
            resolved.append(key)
    if pending("supcon-lambda"):
        # DualFed: the reference's 40 is for an ImageNet-pretrained encoder; from random
        # init it swamps the personal branch's CE (docs/dualfed.md: 53% -> 76%)
        out["supcon-lambda"] = 40.0 if out.get("pretrained-weights") else 1.0
        resolved.append("supcon-lambda")
    # DualFed's stage 2 (h_s on the frozen z) and how the combination reads h_s. With
    # pretrained weights (or on the generated study): the paper's E and lr, those of
    # stage 1, and h_s as is. From random init on images, stage 1's 5 small steps a round
    # leave h_s flat (9-17% over 30 rounds); 20 epochs at lr 0.1 train it, and the client's
    # label prior keeps its federation-wide class balance from outvoting the personal
    # branch under label skew (docs/dualfed.md: the combination then beats both heads);
    # applied only where the client's labels are measurably skewed (with IID labels the
    # prior is noise and cost 1.5 points at 10 rounds).
    if pending("global-head-epochs"):
        out["global-head-epochs"] = 20 if scratch_images else out.get("local-epochs", 1)
        resolved.append("global-head-epochs")
    if pending("global-head-lr"):
        out["global-head-lr"] = 0.1 if scratch_images else out.get("lr", 0.01)
        resolved.append("global-head-lr")
    if pending("dual-global-prior"):
        out["dual-global-prior"] = "client-if-skewed" if scratch_images else "none"
        resolved.append("dual-global-prior")
    if pending("eval-in-fit"):
        # FedFac's new clients are scored in evaluate messages (LocalTrain, Ensemble)
        held_out = bool(out.get("new-clients")) or bool(str(out.get("new-client-sites", "")))
        out["eval-in-fit"] = not (method.startswith("fedfac") and held_out)
        resolved.append("eval-in-fit")
    return out, resolved


def settings_markdown(methods: tuple[str, ...]) -> str:
    """The resolved settings of every method on every backbone (docs/SETTINGS.md)."""
    cols = (*SCHEDULE_KEYS, "augment")
    out = [
        "# Each method's resolved settings (`auto`)",
        "",
        "Made with `python -m run_config.defaults > docs/SETTINGS.md`: what `auto` resolves",
        "to on image data (`augment` is `none` on the generated simulation study) with the",
        "default partitioner. Sources: ../shared/METHODS.md; run_config/defaults.py.",
        "",
    ]
    for model in ("mlp", "cnn4", "resnet8", "resnet10", "resnet18"):
        out += [f"## model = {model}", "", "| method | " + " | ".join(cols) + " | method keys |"]
        out.append("|---" * (len(cols) + 2) + "|")
        for method in methods:
            raw = {"method": method, "model": model, "dataset": "images.parquet"}
            resolved, _ = resolve_auto(raw)
            own = [f"{k}={resolved[k]}" for k, users in USED_BY.items() if method in users]
            cells = [str(resolved[k]) for k in cols] + [", ".join(own)]
            out.append(f"| `{method}` | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    from run_config.schema import METHODS

    print(settings_markdown(METHODS))
