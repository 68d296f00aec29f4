"""What an ``auto`` key resolves to: the common part.

Every key in ``AUTO_KEYS`` (and each method's own ``auto_keys``) may be ``"auto"``
(the default in pyproject.toml) or left out; it then takes the method's value
(its package's ``defaults``: the paper's local schedule, or the baselines'
per-backbone one) or the common default. A value the user sets always wins. This
module is plain data and imports nothing heavy: the pre-flight resolves a config
in well under a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pflower.config.params import AUTO

if TYPE_CHECKING:
    from pflower.config.params import MethodSpec

SCHEDULE_KEYS = ("local-epochs", "batch-size", "optimizer", "lr", "momentum", "weight-decay")
AUTO_KEYS = (*SCHEDULE_KEYS, "augment", "eval-in-fit")

# profile = "pfllib": every method's local schedule as PFLlib d832e76's system/main.py
# runs it by default (-lbs 10 :399, -lr 0.005 :400, -ls 1 :407; torch.optim.SGD without
# momentum or weight decay, clientbase.py), on its 4-layer CNN (-m CNN: FedAvgCNN); every
# client every round (-jr 1 :410) is our fraction-fit default already
PFLLIB_MODEL = "cnn4"
PFLLIB_SCHEDULE = {
    "local-epochs": 1,
    "batch-size": 10,
    "optimizer": "sgd",
    "lr": 0.005,
    "momentum": 0.0,
    "weight-decay": 0.0,
}


def is_image(raw: dict[str, Any]) -> bool:
    """Whether the run's data are images: every data set but the generated study."""
    return raw.get("dataset", "synthetic") != "synthetic" or bool(raw.get("client-data-paths"))


def resolve_auto(raw: dict[str, Any], spec: MethodSpec) -> tuple[dict[str, Any], list[str]]:
    """Replace every ``auto`` (or missing) common key of ``AUTO_KEYS`` and every
    pending key of the method's own ``auto_keys`` in a raw config.

    Returns the new raw config and the keys that were resolved (namespaced for the
    method's own). ``raw`` uses the run-config keys; values that are not ``auto``
    are kept as given. ValueError names a key whose value leaves no valid choice.
    """
    out = dict(raw)
    resolved = []

    def pending(key: str) -> bool:
        return out.get(key, AUTO) == AUTO

    profile = out.get("profile", "ours")
    wanted = PFLLIB_SCHEDULE if profile == "pfllib" else spec.defaults(out)
    for key in SCHEDULE_KEYS:
        if pending(key) and key in wanted:
            out[key] = wanted[key]
            resolved.append(key)
    if pending("augment"):  # augmentation only where the method's paper trained with it
        out["augment"] = wanted.get("augment", "none") if is_image(out) else "none"
        resolved.append("augment")
    if pending("eval-in-fit"):  # off under SecAgg+: a site may not score beside its mask
        secure = str(out.get("secure-aggregation", False)).lower() == "true"
        out["eval-in-fit"] = wanted.get("eval-in-fit", True) and not secure
        resolved.append("eval-in-fit")
    ns = spec.params.namespace
    own = [k for k in spec.params.auto_keys if pending(f"{ns}.{k}")]
    # a profile's values first: the method's ``auto`` may read them (APFL's variant)
    given = spec.params.profile_keys.get(str(profile), {})
    for key in [k for k in own if k in given]:
        out[f"{ns}.{key}"] = given[key]
        resolved.append(f"{ns}.{key}")
    own = [k for k in own if k not in given]
    if own:
        values = spec.params.auto(out)
        for key in own:
            out[f"{ns}.{key}"] = values[key] if key in values else spec.params.default(key)
            resolved.append(f"{ns}.{key}")
    return out, resolved
