"""The validated run config: read once at the edge, passed down as a typed object.

Every field's alias is the hyphenated key of ``[tool.flwr.app.config]``. A bad
value fails before any training with a message naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from run_config.defaults import SCHEDULE_KEYS, USED_BY, resolve_auto

METHODS = (
    "fedavg",
    "fedavg-ft",
    "local",
    "fedper",
    "fedrep",
    "fedbn",
    "feddecomp",
    "fedcp",
    "factorized-fl-alpha",
    "factorized-fl-beta",
    "fedfac-static",
    "fedfac-dynamic",
    "dualfed",
)
# Secure aggregation and DP both work on one mean of updates taken from one global
# state; these methods aggregate (or pay out) per client, so they refuse both.
ONLY_PER_CLIENT = {
    "local": "nothing leaves a client, so there is nothing to aggregate",
    "factorized-fl-alpha": "its aggregation is a per-client mixture of the individual uploads",
    "factorized-fl-beta": "its aggregation is a per-client mixture of the individual uploads",
    "fedfac-static": "its aggregation runs factor analysis on the individual uploads",
    "fedfac-dynamic": "its aggregation runs factor analysis on the individual uploads",
}
PARTITIONERS = ("iid", "dirichlet", "dirichlet-client", "pathological", "natural", "domain")


SETTINGS_SHOWN = (*SCHEDULE_KEYS, "augment")


class ConfigError(ValueError):
    """A run config value is invalid; the message names the key."""


def _field(default: Any, **kw: Any) -> Any:
    return Field(default, **kw)


class RunConfig(BaseModel):
    """All run-config keys. Aliases are the hyphenated TOML keys."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _resolve_auto(cls, data: Any) -> Any:
        """``auto`` (or a missing key of AUTO_KEYS) -> the method's or model's value
        (run_config/defaults.py); a value the user set is kept."""
        if not isinstance(data, dict):
            return data
        resolved, _ = resolve_auto({k.replace("_", "-"): v for k, v in data.items()})
        return resolved

    # what to run
    method: Literal[METHODS] = "fedavg"  # type: ignore[valid-type]
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
    model: Literal["mlp", "cnn4", "resnet8", "resnet10", "resnet18"] = "mlp"
    hidden_dim: int = _field(200, alias="hidden-dim", ge=1)
    pretrained_weights: str = _field("", alias="pretrained-weights")

    # schedule
    num_server_rounds: int = _field(10, alias="num-server-rounds", ge=1)
    local_epochs: int = _field(1, alias="local-epochs", ge=1)
    batch_size: int = _field(32, alias="batch-size", ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = _field(0.05, gt=0)
    momentum: float = _field(0.0, ge=0, lt=1)
    weight_decay: float = _field(0.0, alias="weight-decay", ge=0)
    head_epochs: int = _field(1, alias="head-epochs", ge=1)
    finetune_epochs: int = _field(1, alias="finetune-epochs", ge=0)  # fedavg-ft
    augment: Literal["none", "crop-flip", "flip-rotate"] = "none"
    # default: the method's own (mean or weighted); median / trimmed-mean: robust rules
    aggregation: Literal["default", "mean", "weighted", "median", "trimmed-mean"] = "default"
    trim_fraction: float = _field(0.1, alias="trim-fraction", ge=0, lt=0.5)  # from each end
    # what one client can do (strategies/robust.py): weight <= cap x the median count,
    # update norm <= bound x the median update norm (0: off)
    weight_cap: float = _field(2.0, alias="weight-cap", ge=0)
    update_norm_bound: float = _field(3.0, alias="update-norm-bound", ge=0)
    update_norm_action: Literal["clip", "reject"] = _field("clip", alias="update-norm-action")
    fraction_fit: float = _field(1.0, alias="fraction-fit", gt=0, le=1)
    # one message per client and round: fit replies carry the previous round's evaluation
    eval_in_fit: bool = _field(True, alias="eval-in-fit")
    fraction_evaluate: float = _field(1.0, alias="fraction-evaluate", gt=0, le=1)
    min_replies: int = _field(1, alias="min-replies", ge=1)
    min_available_clients: int = _field(1, alias="min-available-clients", ge=1)
    max_abs_value: float = _field(1e6, alias="max-abs-value", gt=0)
    # seconds a round waits for replies (0: Flower's 12-hour message TTL); 900 is about
    # 10x the slowest round measured here (docs/RELIABILITY.md)
    round_timeout: float = _field(900.0, alias="round-timeout", ge=0)
    dropout_rate: float = _field(0.0, alias="dropout-rate", ge=0, lt=1)
    # simulated hostile clients (client_app/attacks.py; never on a deployed site)
    attack: Literal["none", "inflate-count", "scale", "sign-flip", "label-flip"] = "none"
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
    # differential privacy for the shared update (pfl_privacy)
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
    tensorboard: bool = False  # event files under the run dir (the tensorboard extra)
    # one `pflower-phases {...}` log line per ClientApp message: where its time goes
    log_phases: bool = _field(False, alias="log-phases")
    resume_from: str = _field("", alias="resume-from")  # a server-state.npz or its run dir
    # simulation: personal state in the engine's memory, or spilled to disk (client_app/app.py)
    # budget: in memory while all clients' state fits personal-state-budget-mb, else on disk
    personal_state: Literal["budget", "memory", "disk"] = _field("budget", alias="personal-state")
    personal_state_budget_mb: float = _field(2048.0, alias="personal-state-budget-mb", gt=0)

    # the FedFac simulation study generator (the embedded default data set)
    sim_samples: int = _field(400, alias="sim-samples", ge=10)
    sim_dim: int = _field(100, alias="sim-dim", ge=2)
    sim_shared_neurons: float = _field(0.5, alias="sim-shared-neurons", ge=0, le=1)
    sim_shared_covariates: float = _field(0.4, alias="sim-shared-covariates", ge=0, le=1)
    sim_noise: float = _field(0.1, alias="sim-noise", ge=0)

    # FedFac (METHODS.md section 4); the paper trains with optimizer=adam, lr=0.001
    fa_layers: str = _field("features.1", alias="fa-layers")
    fa_quantile: float = _field(0.5, alias="fa-quantile", ge=0, le=1)
    fa_kappa: float = _field(0.85, alias="fa-kappa", gt=0, le=1)
    fa_input: Literal["weights", "updates"] = _field("weights", alias="fa-input")
    fa_smoothing: float = _field(0.0, alias="fa-smoothing", ge=0, lt=1)  # 0: the paper
    fa_split: Literal["fa", "true", "oracle", "random"] = _field("fa", alias="fa-split")
    new_clients: int = _field(0, alias="new-clients", ge=0)
    new_client_sites: str = _field("", alias="new-client-sites")  # deployment: site names
    new_client_mode: Literal["localtrain", "ensemble"] = _field(
        "localtrain", alias="new-client-mode"
    )
    # Ensemble discloses the trained sites' personalised models to the new clients
    ensemble_share_models: bool = _field(False, alias="ensemble-share-models")

    # Factorized-FL (reference defaults, single-domain permuted-label setting)
    ffl_rank: int = _field(1, alias="ffl-rank", ge=1)
    ffl_l1: float = _field(5e-4, alias="ffl-l1", ge=0)
    ffl_mu_threshold: float = _field(5e-4, alias="ffl-mu-threshold", ge=0)
    ffl_sim_threshold: float = _field(0.0, alias="ffl-sim-threshold", ge=-1, le=1)
    ffl_min_aggr: int = _field(10, alias="ffl-min-aggr", ge=1)
    ffl_epsilon: float = _field(1.0, alias="ffl-epsilon", ge=0)
    # what the similarity compares: v (the paper) or v minus its initial value, which
    # every client shares (docs/factorized_fl.md: v barely leaves it at this budget)
    ffl_match: Literal["v", "v-change"] = _field("v", alias="ffl-match")

    # FedCP (paper default lambda = 5; lr 0.005 / batch 10 are passed per run)
    mmd_lambda: float = _field(5.0, alias="mmd-lambda", ge=0)
    cp_noisy_eval: bool = _field(False, alias="cp-noisy-eval")

    # DualFed (paper: tau = 0.2; lambda = 40 as the reference's PACS run with tau = 0.2)
    supcon_lambda: float = _field(1.0, alias="supcon-lambda", ge=0)
    supcon_temperature: float = _field(0.2, alias="supcon-temperature", gt=0)
    # stage 2 (h_s on the frozen z): auto = stage 1's local-epochs and lr (the paper's),
    # 20 and 0.1 from random init on images (run_config/defaults.py)
    global_head_epochs: int = _field(1, alias="global-head-epochs", ge=1)
    global_head_lr: float = _field(0.01, alias="global-head-lr", gt=0)
    dual_schedule: Literal["stagewise", "simultaneous"] = _field("stagewise", alias="dual-schedule")
    dual_combine: Literal["logits", "probabilities"] = _field("probabilities", alias="dual-combine")
    # the personal branch's cross-entropy: on h_p(u) alone (the paper), or on the combined
    # prediction (h_s frozen in stage 1), so h_p learns what h_s gets wrong on this client
    dual_personal_loss: Literal["personal", "combined"] = _field(
        "personal", alias="dual-personal-loss"
    )
    # the global head's prediction as the combination uses it: as is (the paper), or moved
    # to this client's label prior (h_s(z) + log of the client's training label frequencies:
    # Bayes' rule for a label shift from a balanced federation; the counts stay local), or
    # that only where a chi-square test finds the client's labels unlike uniform at 5%
    # (client-if-skewed: IID counts are noise); auto: client-if-skewed from random init on
    # images, none otherwise
    dual_global_prior: Literal["none", "client", "client-if-skewed"] = _field(
        "none", alias="dual-global-prior"
    )
    projector_hidden: int = _field(256, alias="projector-hidden", ge=1)

    # FedDecomp (paper defaults: CIFAR-10's best R_c = R_l = 0.6, E_lora = 2)
    rank_basis: Literal["min", "out"] = _field("min", alias="rank-basis")
    conv_rank_ratio: float = _field(0.6, alias="conv-rank-ratio", gt=0, le=1)
    linear_rank_ratio: float = _field(0.6, alias="linear-rank-ratio", gt=0, le=1)
    linear_rank_abs: int = _field(0, alias="linear-rank-abs", ge=0)
    lora_epochs: int = _field(2, alias="lora-epochs", ge=0)
    decomp_schedule: Literal["alternating", "simultaneous"] = _field(
        "alternating", alias="decomp-schedule"
    )
    decomp_reverse: bool = _field(False, alias="decomp-reverse")

    @model_validator(mode="after")
    def _feddecomp_checks(self) -> RunConfig:
        if (
            self.method == "feddecomp"
            and self.decomp_schedule == "alternating"
            and self.lora_epochs > self.local_epochs
        ):
            raise ValueError(
                f"config key 'lora-epochs' ({self.lora_epochs}) must be <= 'local-epochs' "
                f"({self.local_epochs}): a FedDecomp round is lora-epochs on tau, then "
                "local-epochs - lora-epochs on sigma (the paper: 5 and 2, the 'auto' default)"
            )
        return self

    @model_validator(mode="after")
    def _backbone_keys(self) -> RunConfig:
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

    @model_validator(mode="after")
    def _secure_aggregation_fits_the_method(self) -> RunConfig:
        if not self.secure_aggregation:
            return self
        why = ONLY_PER_CLIENT.get(self.method)
        if why is not None:
            raise ValueError(
                f"config key 'secure-aggregation': method '{self.method}' cannot use it: {why}"
            )
        return self

    @model_validator(mode="after")
    def _dp_fits_the_method(self) -> RunConfig:
        if self.dp_mode == "off":
            return self
        why = ONLY_PER_CLIENT.get(self.method)
        if why is not None:
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
    def _robust_rule_fits(self) -> RunConfig:
        if self.aggregation not in ("median", "trimmed-mean"):
            return self
        why = ONLY_PER_CLIENT.get(self.method)
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

    @model_validator(mode="after")
    def _ensemble_consent(self) -> RunConfig:
        if self.new_client_mode == "ensemble" and not self.ensemble_share_models:
            raise ValueError(
                "config key 'ensemble-share-models' must be true for new-client-mode="
                "'ensemble': the trained sites' personalised models (shared and personal "
                "tensors) go to the new clients, so the sites must agree to disclose them"
            )
        return self

    @model_validator(mode="after")
    def _new_clients_once(self) -> RunConfig:
        if self.new_clients and self.new_client_sites.strip():
            raise ValueError(
                "config keys 'new-clients' and 'new-client-sites' both name the held-out "
                "clients: set one (new-clients in simulation, new-client-sites in deployment)"
            )
        return self

    def key(self, field_name: str) -> str:
        """The TOML key of a field."""
        info = type(self).model_fields[field_name]
        return info.alias or field_name

    def as_dict(self) -> dict[str, Any]:
        """The config as the hyphenated keys (for results.json)."""
        return self.model_dump(by_alias=True)


def _name_key(loc: tuple[Any, ...]) -> str:
    if not loc:
        return "<config>"
    name = str(loc[0])
    info = RunConfig.model_fields.get(name)
    return (info.alias or name) if info else name


def parse_run_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a Flower run config; raise ConfigError naming every bad key."""
    try:
        return RunConfig.model_validate(dict(raw))
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = _name_key(tuple(e["loc"]))
            if e["type"] == "extra_forbidden":
                problems.append(f"unknown config key '{key}'")
            elif not e["loc"]:  # a cross-key check: its message names the keys
                problems.append(str(e["msg"]).removeprefix("Value error, "))
            else:
                problems.append(f"config key '{key}': {e['msg']} (got {e.get('input')!r})")
        raise ConfigError("invalid run config: " + "; ".join(problems)) from None


def auto_resolved(raw: dict[str, Any]) -> list[str]:
    """The keys of a raw run config that ``auto`` (or their absence) resolved."""
    try:
        return resolve_auto({k.replace("_", "-"): v for k, v in raw.items()})[1]
    except ValueError:
        return []


def describe_settings(cfg: RunConfig, auto: list[str]) -> str:
    """One line: the method's local schedule and every auto-resolved key."""
    own = [k for k, users in USED_BY.items() if cfg.method in users]
    keys = [*SETTINGS_SHOWN, *own]
    data = cfg.as_dict()
    parts = [f"{k}={data[k]}{'' if k in auto else ' (set)'}" for k in keys if k in data]
    return f"{cfg.method} settings ('auto' unless marked set): " + " ".join(parts)


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
