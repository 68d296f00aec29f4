"""The validated run config: read once at the edge, passed down as a typed object.

Every common field's alias is the hyphenated key of ``[tool.flwr.app.config]``; a
method's own keys are namespaced (``fedcp.mmd-lambda``) and validated by its
package's ``MethodParams`` (``cfg.params``). A bad value fails before any training
with a message naming the key. ``parse_run_config`` takes the methods it may run
(``methods.parse_run_config`` passes the registry and caches the result, so a
process resolves a config once).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from pflower.config.defaults import PFLLIB_MODEL, SCHEDULE_KEYS, resolve_auto
from pflower.config.params import AUTO, MethodParams, MethodSpec, NoParams

PARTITIONERS = ("iid", "dirichlet", "dirichlet-client", "pathological", "natural", "domain")
# simulated hostile clients (client_app/attacks.py); an attack on one method's own
# machinery is listed on that method's card (``attacks``) and lives in its package
ATTACKS = ("none", "inflate-count", "scale", "sign-flip", "label-flip", "head-flip")


SETTINGS_SHOWN = (*SCHEDULE_KEYS, "augment")


class ConfigError(ValueError):
    """A run config value is invalid; the message names the key."""


# resume-from="latest": a run started again by the same command (a supervisor, a
# restart policy) goes on from its own last checkpoint (strategies/checkpoint.py)
RESUME_LATEST = "latest"


def _field(default: Any, **kw: Any) -> Any:
    return Field(default, **kw)


def _per_client(info: ValidationInfo) -> str:
    """Why the method has no mean of one global state ('' if it has one)."""
    spec = (info.context or {}).get("spec")
    return getattr(spec, "per_client", "") if spec is not None else ""


def _profile_problem(method: str, profile: str, model: str, info: ValidationInfo) -> str:
    """Why ``profile`` cannot run (one line naming the key), or ''."""
    spec = (info.context or {}).get("spec")
    profiles = ("ours",)
    if spec is not None:
        profiles = spec.params.profiles + (("pfllib",) if spec.pfllib else ())
    if profile not in profiles:
        return (
            f"config key 'profile': method '{method}' has no '{profile}' profile (it has "
            f"{', '.join(repr(p) for p in profiles)})"
        )
    if profile == "pfllib" and model != PFLLIB_MODEL:
        return (
            f"config key 'model': profile 'pfllib' runs PFLlib's 4-layer CNN "
            f"(FedAvgCNN, system/flcore/trainmodel/models.py), ours '{PFLLIB_MODEL}': set "
            f"model='{PFLLIB_MODEL}' (and image data), or another profile"
        )
    return ""


def _parts_weighed_apart(aggregation: str, dp_mode: str, info: ValidationInfo) -> str:
    """Which of the method's mean's parts weighs otherwise than the run's rule ('' if
    none: the whole upload takes one weight, as SecAgg+ needs)."""
    spec = (info.context or {}).get("spec")
    if spec is None or dp_mode != "off":  # DP averages every part with equal weights
        return ""
    rule = spec.aggregation if aggregation == "default" else aggregation
    equal = [p.prefix for p in spec.means if p.weights == "equal"]
    if not equal or rule != "weighted":
        return ""
    return (
        f"with aggregation='weighted' it averages {equal[0]}* with equal weights and the "
        "rest by sample count, and SecAgg+ scales a whole upload by one weight (use "
        "aggregation='mean')"
    )


class TaskKeys(BaseModel):
    """What to run: the method, the data and how it is split, the model."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    method: str = "fedavg"  # a registered method (methods/)
    dataset: str = "synthetic"
    partitioner: Literal[PARTITIONERS] = "iid"  # type: ignore[valid-type]
    alpha: float = _field(0.5, gt=0)
    classes_per_client: int = _field(2, alias="classes-per-client", ge=1)
    partition_by: str = _field("label", alias="partition-by")
    test_fraction: float = _field(0.2, alias="test-fraction", gt=0, lt=1)
    train_per_client: int = _field(500, alias="train-per-client", ge=1)
    test_per_client: int = _field(100, alias="test-per-client", ge=1)
    permute_labels: bool = _field(False, alias="permute-labels")
    num_domains: int = _field(4, alias="num-domains", ge=1)
    # partitioner=domain: the data's semantic class groups (CIFAR-100's coarse_label,
    # CIFAR-10's vehicles/animals), or num-domains seeded random ones; auto: semantic
    # when the data set has them
    domain_groups: Literal["auto", "semantic", "random"] = _field("auto", alias="domain-groups")
    domain_shift: bool = _field(False, alias="domain-shift")
    client_data_paths: str = _field("", alias="client-data-paths")
    # the run's classes by name, in label order (comma-separated): every site maps its
    # labels through them, so a site missing a class keeps the others' ids
    class_names: str = _field("", alias="class-names")
    # the data's shape and class count as the run declares them: with input-shape and
    # class-names (or num-classes) the server builds the model without any data, and
    # every site checks its own data against them
    input_shape: str = _field("", alias="input-shape")  # "C,H,W" (images) or "D" (vectors)
    num_classes: int = _field(0, alias="num-classes", ge=0)  # 0: len(class-names), or the data
    # tabular data (a parquet or CSV file, or one per site): the label column (default:
    # label / fine_label / labels), the column marking rows train / test, the feature
    # columns (default: every other numeric column), and the categorical ones, one-hot
    # encoded from their declared levels ("cp:1/2/3/4,restecg:0/1/2"; the first level
    # is the reference and gets no column). Each site standardises its features with
    # its own training rows' mean and standard deviation.
    label_column: str = _field("", alias="label-column")
    split_column: str = _field("split", alias="split-column")
    feature_columns: str = _field("", alias="feature-columns")
    categorical_columns: str = _field("", alias="categorical-columns")
    model: Literal["logreg", "mlp", "cnn4", "resnet8", "resnet9", "resnet10", "resnet18"] = "mlp"
    # every ``auto`` key as our reading of the method's paper sets it, as its authors'
    # code ran it (Factorized-FL, FedFac: docs/factorized_fl.md, docs/fedfac.md), or as
    # PFLlib d832e76's system/main.py runs it by default (pflower/config/defaults.py)
    profile: Literal["ours", "authors", "pfllib"] = "ours"
    hidden_dim: int = _field(200, alias="hidden-dim", ge=1)
    pretrained_weights: str = _field("", alias="pretrained-weights")

    @model_validator(mode="after")
    def _declared_data(self) -> TaskKeys:
        if self.input_shape:
            dims = self.input_shape.split(",")
            if len(dims) not in (1, 3) or not all(d.strip().isdigit() and int(d) > 0 for d in dims):
                raise ValueError(
                    f"config key 'input-shape': {self.input_shape!r} is not 'C,H,W' (images) "
                    "or 'D' (vectors) of positive integers"
                )
        names = [n for n in self.class_names.split(",") if n.strip()]
        if names and self.num_classes and self.num_classes != len(names):
            raise ValueError(
                f"config key 'num-classes': {self.num_classes} but 'class-names' lists "
                f"{len(names)} classes"
            )
        return self

    @model_validator(mode="after")
    def _backbone_keys(self) -> TaskKeys:
        weights = self.pretrained_weights
        if weights and self.model != "resnet18":
            raise ValueError(
                f"config key 'pretrained-weights': only model 'resnet18' loads pretrained "
                f"weights (got model '{self.model}')"
            )
        if weights and weights != "imagenet" and not Path(weights).expanduser().is_file():
            raise ValueError(
                f"config key 'pretrained-weights': no weight file at {weights!r} (give a "
                "ResNet-18 state_dict saved with torch.save, or 'imagenet' for torchvision's)"
            )
        return self


class RunConfig(TaskKeys):
    """The common run-config keys, and the method's own (``params``)."""

    # schedule
    num_server_rounds: int = _field(10, alias="num-server-rounds", ge=1)
    local_epochs: int = _field(1, alias="local-epochs", ge=1)
    # > 0: an epoch is this many batches (the data reshuffled as often as needed), so
    # every site takes the same number of steps whatever its size (FLamby's budget)
    local_steps: int = _field(0, alias="local-steps", ge=0)
    batch_size: int = _field(32, alias="batch-size", ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = _field(0.05, gt=0)
    momentum: float = _field(0.0, ge=0, lt=1)
    weight_decay: float = _field(0.0, alias="weight-decay", ge=0)
    augment: Literal["none", "crop-flip", "flip-rotate"] = "none"
    # default: the method's own (mean or weighted); median / trimmed-mean: robust rules
    aggregation: Literal["default", "mean", "weighted", "median", "trimmed-mean"] = "default"
    trim_fraction: float = _field(0.1, alias="trim-fraction", ge=0, lt=0.5)  # from each end
    # what one client can do (strategies/robust.py): weight <= cap x the lower median
    # count, update norm <= bound x the lower median update norm (0: off)
    weight_cap: float = _field(2.0, alias="weight-cap", ge=0)
    update_norm_bound: float = _field(3.0, alias="update-norm-bound", ge=0)
    update_norm_action: Literal["clip", "reject"] = _field("clip", alias="update-norm-action")
    # the norm bound's reference also holds the norms accepted in this many earlier rounds
    norm_history_rounds: int = _field(3, alias="norm-history-rounds", ge=0)
    # from this many replies, an update pointing against the round's median is rejected
    direction_check_from: int = _field(4, alias="direction-check-from", ge=0)
    direction_min_cosine: float = _field(0.0, alias="direction-min-cosine", ge=-1, le=1)
    direction_action: Literal["project", "reject"] = _field("project", alias="direction-action")
    # fold each fit reply into the round's mean as it arrives (strategies/streaming.py)
    streamed_aggregation: bool = _field(True, alias="streamed-aggregation")
    # replies a streamed round fixes its bounds' references from (held at once)
    stream_reservoir: int = _field(8, alias="stream-reservoir", ge=1)
    fraction_fit: float = _field(1.0, alias="fraction-fit", gt=0, le=1)
    # one message per client and round: fit replies carry the previous round's evaluation
    eval_in_fit: bool = _field(True, alias="eval-in-fit")
    # score the model after every Nth round (counted across resumes) and after the last;
    # the rounds between keep their records (time, bytes, bounds) without accuracy
    evaluate_every: int = _field(1, alias="evaluate-every", ge=1)
    fraction_evaluate: float = _field(1.0, alias="fraction-evaluate", gt=0, le=1)
    min_replies: int = _field(1, alias="min-replies", ge=1)
    min_available_clients: int = _field(1, alias="min-available-clients", ge=1)
    max_abs_value: float = _field(1e6, alias="max-abs-value", gt=0)
    # seconds a round waits for replies (0: Flower's 12-hour message TTL); 900 is about
    # 10x the slowest round measured here (docs/RELIABILITY.md)
    round_timeout: float = _field(900.0, alias="round-timeout", ge=0)
    dropout_rate: float = _field(0.0, alias="dropout-rate", ge=0, lt=1)
    # simulated hostile clients (client_app/attacks.py; never on a deployed site)
    attack: str = "none"  # one of ATTACKS or of the method's own (parse_run_config checks)
    attack_clients: int = _field(0, alias="attack-clients", ge=0)  # the first k partitions
    attack_scale: float = _field(10.0, alias="attack-scale", gt=0)
    seed: int = _field(0, ge=0)

    # secure aggregation (Flower's SecAgg+): the server only sees the sum of the uploads
    secure_aggregation: bool = _field(False, alias="secure-aggregation")
    secagg_num_shares: float = _field(1.0, alias="secagg-num-shares", gt=0)
    secagg_reconstruction_threshold: float = _field(
        0.66, alias="secagg-reconstruction-threshold", gt=0
    )
    secagg_clipping_range: float = _field(8.0, alias="secagg-clipping-range", gt=0)
    secagg_quantization_range: int = _field(4194304, alias="secagg-quantization-range", ge=2)
    secagg_max_weight: float = _field(1000.0, alias="secagg-max-weight", gt=0)
    # differential privacy for the shared update (pflower.privacy)
    # client: clip on the client, noise on the server; server: both on the server;
    # distributed: clip and a share of the noise on each client, under SecAgg+
    dp_mode: Literal["off", "client", "server", "distributed"] = _field("off", alias="dp-mode")
    dp_noise_multiplier: float = _field(1.0, alias="dp-noise-multiplier", ge=0)
    dp_clipping_norm: float = _field(1.0, alias="dp-clipping-norm", gt=0)
    dp_delta: float = _field(1e-5, alias="dp-delta", gt=0, lt=1)

    # where results go; the server checkpoint (strategies/checkpoint.py)
    output_dir: str = _field("outputs", alias="output-dir")
    run_name: str = _field("", alias="run-name")
    checkpoint_every: int = _field(1, alias="checkpoint-every", ge=0)  # 0: never
    # > 0: stop cleanly after the round during which this many minutes have passed since
    # the run (or its resume) began; its checkpoint is written (strategies/budget.py)
    max_minutes: float = _field(0.0, alias="max-minutes", ge=0)
    tensorboard: bool = False  # event files under the run dir (the tensorboard extra)
    # one `pflower-phases {...}` log line per ClientApp message: where its time goes
    log_phases: bool = _field(False, alias="log-phases")
    # every accepted fit reply as it entered its round's sum, and each aggregate's
    # digest, under <run dir>/replies/ (strategies/reply_log.py): an audit trail that a
    # replay checks; streamed rounds only
    reply_log: bool = _field(False, alias="reply-log")
    # a server-state.npz or its run dir; "latest" (RESUME_LATEST): this run-name's own last
    # checkpoint if there is one, num-server-rounds then counting the whole run
    resume_from: str = _field("", alias="resume-from")
    # a deployment's sites and their authenticated node ids (strategies/roster.py): a
    # client key is then bound only to its own site's node
    roster: str = ""
    # simulation: personal state in the engine's memory, or spilled to disk (client_app/app.py)
    # budget: in memory while all clients' state fits personal-state-budget-mb, else on disk
    personal_state: Literal["budget", "memory", "disk"] = _field("budget", alias="personal-state")
    personal_state_budget_mb: float = _field(2048.0, alias="personal-state-budget-mb", gt=0)
    # how the in-process engine trains a round's clients (pflower/engine/cohort.py):
    # per-client, a Message through the ClientApp each; cohort, the round's sampled
    # clients one step, without a message a client (in-process simulation only)
    local_training: Literal["per-client", "cohort"] = _field("per-client", alias="local-training")

    # the FedFac simulation study generator (the embedded default data set): per client
    # 100 samples, teachers sharing 80% of their neurons and 80% of the covariates, where
    # the shared part carries most of the label (docs/main_job.md measured why)
    sim_samples: int = _field(100, alias="sim-samples", ge=10)
    sim_dim: int = _field(100, alias="sim-dim", ge=2)
    sim_shared_neurons: float = _field(0.8, alias="sim-shared-neurons", ge=0, le=1)
    sim_shared_covariates: float = _field(0.8, alias="sim-shared-covariates", ge=0, le=1)
    sim_noise: float = _field(0.1, alias="sim-noise", ge=0)
    # each client's data from its own random stream, seeded by (seed, client): any client
    # drawn alone at once (a million clients); false: the study's one stream (the default)
    sim_client_streams: bool = _field(False, alias="sim-client-streams")

    @model_validator(mode="after")
    def _secure_aggregation_fits_the_method(self, info: ValidationInfo) -> RunConfig:
        if not self.secure_aggregation:
            return self
        why = _per_client(info) or _parts_weighed_apart(self.aggregation, self.dp_mode, info)
        if why:
            raise ValueError(
                f"config key 'secure-aggregation': method '{self.method}' cannot use it: {why}"
            )
        return self

    @model_validator(mode="after")
    def _dp_fits_the_method(self, info: ValidationInfo) -> RunConfig:
        if self.dp_mode == "off":
            return self
        why = _per_client(info)
        if why:
            raise ValueError(f"config key 'dp-mode': method '{self.method}' cannot use it: {why}")
        if self.dp_mode == "distributed" and not self.secure_aggregation:
            raise ValueError(
                "config key 'dp-mode': 'distributed' noise is a share per client, too little "
                "to hide one upload on its own: it needs secure-aggregation=true, so that "
                "the server only ever sees the noised sum"
            )
        if self.dp_mode == "server" and self.secure_aggregation:
            raise ValueError(
                "config key 'dp-mode': 'server' clips each client's update, which secure "
                "aggregation hides from the server; use dp-mode='client' with it"
            )
        if self.aggregation == "weighted":
            raise ValueError(
                "config key 'aggregation': differential privacy averages the clipped updates "
                "with equal weights (its noise is calibrated to that); leave it 'default'"
            )
        return self

    @model_validator(mode="after")
    def _profile_fits_the_method(self, info: ValidationInfo) -> RunConfig:
        why = _profile_problem(self.method, self.profile, self.model, info)
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _run_name_is_one_name(self) -> RunConfig:
        # it names a folder under output-dir and every site's state folder
        name = self.run_name
        if name and (name in (".", "..") or not all(c.isalnum() or c in "-_.=" for c in name)):
            raise ValueError(
                f"config key 'run-name': {name!r} is not one plain folder name (letters, "
                "digits, '-', '_', '.', '='; not '.' or '..'): it names the results and every "
                "site's state folder"
            )
        return self

    @model_validator(mode="after")
    def _robust_rule_fits(self, info: ValidationInfo) -> RunConfig:
        if self.aggregation not in ("median", "trimmed-mean"):
            return self
        why: str | None = _per_client(info) or None
        if why is not None:
            why = f"method '{self.method}' has its own aggregation: {why}"
        elif self.secure_aggregation:
            why = "secure aggregation hides the individual uploads it needs"
        elif self.dp_mode != "off":
            why = "differential privacy's noise is calibrated to the mean"
        if why is not None:
            raise ValueError(
                f"config key 'aggregation': '{self.aggregation}' cannot be used: {why}"
            )
        return self

    # the method's own keys (its package's MethodParams), and the keys ``auto`` resolved
    params: MethodParams = NoParams()
    auto_resolved: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The config as the run-config keys (for results.json): the common keys
        hyphenated, the method's own namespaced."""
        out = self.model_dump(by_alias=True, exclude={"params", "auto_resolved"})
        ns = type(self.params).namespace
        own = self.params.model_dump(by_alias=True)
        return {**out, **{f"{ns}.{k}": v for k, v in own.items()}}


def _name_key(loc: tuple[Any, ...], model: type[BaseModel], prefix: str = "") -> str:
    if not loc:
        return "<config>"
    name = str(loc[0])
    info = model.model_fields.get(name)
    return prefix + ((info.alias or name) if info else name)


def unknown_key(key: str, known: Iterable[str] = ()) -> str:
    """ "unknown config key", with the closest valid key where one is close (a method's
    key without its namespace finds it: mmd-lambda -> fedcp.mmd-lambda)."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    close = close or [k for k in known if k.partition(".")[2] == key][:1]
    return f"unknown config key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else "")


def known_keys(methods: Mapping[str, MethodSpec]) -> set[str]:
    """Every valid key: the common ones and each method's ``namespace.key``."""
    common = {(f.alias or n) for n, f in RunConfig.model_fields.items() if n not in _INTERNAL}
    own = {f"{m.params.namespace}.{k}" for m in methods.values() for k in m.params.keys()}
    return common | own


_INTERNAL = ("params", "auto_resolved")


def _problems(
    err: ValidationError, model: type[BaseModel], prefix: str = "", known: Iterable[str] = ()
) -> list[str]:
    problems = []
    for e in err.errors():
        key = _name_key(tuple(e["loc"]), model, prefix)
        if e["type"] == "extra_forbidden":
            problems.append(unknown_key(key, known))
        elif not e["loc"]:  # a cross-key check: its message names the keys
            problems.append(str(e["msg"]).removeprefix("Value error, "))
        else:
            problems.append(f"config key '{key}': {e['msg']} (got {e.get('input')!r})")
    return problems


def parse_run_config(raw: Mapping[str, Any], methods: Mapping[str, MethodSpec]) -> RunConfig:
    """Validate a Flower run config for one of ``methods``; raise ConfigError naming
    every bad key. ``auto`` keys resolve here, once (``cfg.auto_resolved``)."""
    data = {(k if "." in k else k.replace("_", "-")): v for k, v in raw.items()}
    method = data.get("method", "fedavg")
    spec = methods.get(method) if isinstance(method, str) else None
    if spec is None:
        raise ConfigError(
            f"invalid run config: config key 'method': unknown method {method!r}, expected "
            f"one of {sorted(methods)}"
        )
    problems = []
    attack = data.get("attack", "none")
    owners = [m.name for m in methods.values() if attack in m.attacks]
    if attack not in ATTACKS and not owners:
        own = sorted({a for m in methods.values() for a in m.attacks})
        problems.append(
            f"config key 'attack': unknown attack {attack!r}, expected one of "
            f"{[*ATTACKS, *own]} (the last {len(own)} on one method's own machinery)"
        )
    elif owners and attack not in spec.attacks:
        problems.append(
            f"config key 'attack': '{attack}' attacks the own machinery of "
            f"{' / '.join(owners)}, not of method '{method}'"
        )
    namespaces = {m.params.namespace: m.params for m in methods.values()}
    known = known_keys(methods)
    for key in [k for k in data if "." in k]:
        ns, _, name = key.partition(".")
        if ns not in namespaces or name not in namespaces[ns].keys():
            problems.append(unknown_key(key, known))
    if problems:
        raise ConfigError("invalid run config: " + "; ".join(problems))
    try:
        data, resolved = resolve_auto(data, spec)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        # a value the method's ``auto`` rules cannot read (an unknown model, say):
        # validate with the rules' values left out, so the error names that key
        unresolved = {k: v for k, v in data.items() if v != AUTO}
        try:
            RunConfig.model_validate(
                {k: v for k, v in unresolved.items() if "." not in k}, context={"spec": spec}
            )
        except ValidationError as bad:
            problems = _problems(bad, RunConfig, known=known)
            raise ConfigError("invalid run config: " + "; ".join(problems)) from None
        raise ConfigError(f"invalid run config: {err}") from None
    ns = spec.params.namespace
    own = {k.partition(".")[2]: v for k, v in data.items() if k.startswith(f"{ns}.") and ns}
    common = {k: v for k, v in data.items() if "." not in k}
    params: MethodParams | None = None
    try:
        params = spec.params.model_validate(own)
    except ValidationError as err:
        problems += _problems(err, spec.params, f"{ns}.")
    try:
        cfg = RunConfig.model_validate(
            {**common, "params": params or NoParams(), "auto_resolved": tuple(resolved)},
            context={"spec": spec},
        )
    except ValidationError as err:
        problems += _problems(err, RunConfig, known=known)
        cfg = None
    if cfg is not None and params is not None:
        try:
            params.check(cfg)
        except ValueError as err:
            problems.append(str(err))
    if problems or cfg is None:
        raise ConfigError("invalid run config: " + "; ".join(problems))
    return cfg


def describe_settings(cfg: RunConfig) -> str:
    """One line: the method's local schedule and its own ``auto`` keys, each marked
    if the user set it."""
    data = cfg.as_dict()
    params = type(cfg.params)
    keys = [*SETTINGS_SHOWN, *(f"{params.namespace}.{k}" for k in params.auto_keys)]
    auto = set(cfg.auto_resolved)
    parts = [f"{k}={data[k]}{'' if k in auto else ' (set)'}" for k in keys if k in data]
    return (
        f"{cfg.method} settings ('auto' unless marked set): "
        + " ".join(parts)
        + f"; model={cfg.model} on {data_source(cfg)}"
    )


def data_source(cfg: RunConfig) -> str:
    """What the run trains on, in words: the per-client folders it names, its data set,
    or (a deployment that declares the input shape) the sites' own data."""
    folders = [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    if folders:
        return f"{len(folders)} per-client folders ({Path(folders[0]).name}, ...)"
    if cfg.dataset == "synthetic" and cfg.input_shape:
        return "the sites' data"
    return cfg.dataset


def check_against_data(cfg: RunConfig, num_classes: int) -> None:
    """Checks that need the data set: raise ConfigError naming the key."""
    if cfg.partitioner == "pathological" and cfg.classes_per_client > num_classes:
        raise ConfigError(
            f"config key 'classes-per-client': {cfg.classes_per_client} is more than the "
            f"{num_classes} classes of the data set"
        )
    if (
        cfg.partitioner == "domain"
        and cfg.domain_groups == "random"
        and cfg.num_domains > num_classes
    ):
        raise ConfigError(
            f"config key 'num-domains': {cfg.num_domains} domains need at least as many "
            f"classes, the data set has {num_classes}"
        )
