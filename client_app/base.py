"""The one NumPyClient every method builds on.

fit: restore personal -> load received shared -> run the method's schedule ->
store personal -> return only the shared tensors. evaluate: the personalised
model (received shared + own personal) on the client's own test split.
Methods override ``local_train`` (the schedule) and, where they need to, the
``receive`` / ``upload`` / ``loss`` / ``score`` hooks.
"""

from __future__ import annotations

import copy
import logging
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common import NDArrays, Scalar
from torch import nn

from client_app import timing
from client_app.site_data import ASK_DATA_INFO
from client_app.state import PersonalStore
from client_app.train import cross_entropy, evaluate, train_epochs
from models.roles import (
    CHECKPOINT_ROUND,
    CHECKPOINT_WRITING,
    CLASSES_KEY,
    CLIENT_KEY,
    DATA_KEY,
    DEVICE_KEY,
    DP_PARTICIPANTS,
    EVAL_PREFIX,
    EVALUATE_FIRST,
    Roles,
    get_arrays,
    reset_entries,
    set_arrays,
)
from models.wire import Wire
from pflower.config.schema import RunConfig
from pflower.data import ClientData
from pflower.privacy import add_noise, clip_update, noise_share_std

log = logging.getLogger("flwr.pflower")


def message_round(config: dict[str, Scalar]) -> int | None:
    """The round a fit or evaluate message belongs to (counted across resumes)."""
    return int(config["server-round"]) if "server-round" in config else None


def privatize(
    upload: NDArrays,
    received: NDArrays,
    cfg: RunConfig,
    config: dict[str, Scalar],
    views: bool = False,
) -> NDArrays:
    """The upload under the run's DP mode: clipped to the clipping norm around what
    was received (client, distributed), plus this client's share of the noise
    (distributed), drawn from OS entropy. ``views``: the upload is the model's own
    memory, copied before it is clipped in place."""
    if views and cfg.dp_mode != "off":
        upload = [np.array(a) for a in upload]
    if cfg.dp_mode in ("client", "distributed"):
        clip_update(upload, received, cfg.dp_clipping_norm)
    if cfg.dp_mode == "distributed":
        if DP_PARTICIPANTS not in config:  # a share sized for no one: refuse
            raise ValueError(f"dp-mode=distributed, but the fit has no '{DP_PARTICIPANTS}'")
        asked = int(config[DP_PARTICIPANTS])
        std = noise_share_std(cfg.dp_noise_multiplier, cfg.dp_clipping_norm, asked)
        add_noise(upload, std, np.random.default_rng())
    return upload


def misfits(
    state: dict[str, np.ndarray], model: dict[str, Any], names: tuple[str, ...]
) -> list[str]:
    """The personal tensors a stored state lacks or holds in another shape."""
    missing = [n for n in names if n not in state]
    return missing + [
        n for n in names if n in state and tuple(state[n].shape) != tuple(model[n].shape)
    ]


def train_every_parameter(
    client: PFLClient, generator: torch.Generator, optimizer: torch.optim.Optimizer | None = None
) -> float:
    """The base schedule: every parameter of ``client``'s model for ``local-epochs`` on
    its ``loss``, with ``optimizer`` (None: a fresh one of the run's settings)."""
    return train_epochs(
        client.model,
        list(client.model.parameters()),
        client.x_train,
        client.y_train,
        client.cfg.local_epochs,
        client.cfg,
        generator,
        loss_fn=client.loss,
        optimizer=optimizer,
    )


def fine_tuned_copy(client: PFLClient, epochs: int) -> nn.Module:
    """A copy of ``client``'s model after ``epochs`` of the run's optimizer on every
    parameter and its own train split, on its own seeded stream (the same at every
    evaluation, so two scores of one model agree)."""
    tuned = copy.deepcopy(client.model)
    cfg = client.cfg
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + client.seed_offset)
    params = list(tuned.parameters())
    x, y = client.x_train, client.y_train
    train_epochs(tuned, params, x, y, epochs, cfg, generator, loss_fn=client.loss)
    return tuned


def score_fine_tuned(client: PFLClient, epochs: int) -> tuple[float, dict[str, Scalar]]:
    """``client``'s score of its ``fine_tuned_copy`` (``accuracy``) beside its model's
    own (``accuracy-global``). The copy is dropped: it never leaves the client."""
    tuned = fine_tuned_copy(client, epochs)
    extra: dict[str, float] = {}
    loss, acc = evaluate(tuned, client.x_test, client.y_test, extra=extra)
    _, acc_global = evaluate(client.model, client.x_test, client.y_test)
    return loss, {"accuracy": acc, "accuracy-global": acc_global, **extra}


def settle(client: PFLClient, received: bool) -> None:
    """A resident model's entries left as the last client had them for ``receive`` to
    overwrite (``client.stale``: the template and those entries; client_app/build.py):
    ``received``, they were; else they get the template's values (no tensors came)."""
    stale = client.stale
    if stale is not None and not received:
        template, keep = stale
        reset_entries(client.model, template, frozenset(client.model.state_dict()) - keep)
    client.stale = None


def reply_metrics(client: PFLClient, metrics: dict, evaluation: dict) -> dict[str, Scalar]:
    """A fit reply's metrics: its client key and class digest, and (unless the site's
    policy withholds them) its training metrics, its evaluation and its facts."""
    facts = {DEVICE_KEY: client.device.type}
    if client.report_data_digest:
        facts[DATA_KEY] = client.data.digest
    sent = {CLIENT_KEY: client.client_key}
    if not client.withhold_metrics:
        sent.update({**metrics, **evaluation, **facts})
    if client.class_fingerprint:  # the server stops a run whose sites' labels differ
        sent[CLASSES_KEY] = client.class_fingerprint
    return sent


@dataclass(frozen=True)
class ClientSetup:
    """What the builder decides of a client beside its model, data and store
    (client_app/build.py); the defaults are a bare client's."""

    # The weight a fit reply reports: its sample count, or 1 where the method takes
    # a plain mean under secure aggregation (SecAgg+ weights the sum by it;
    # pflower/config/weighting.py).
    weight_by_samples: bool = True
    # a digest of this client's own class list (its data's, when the run gives no
    # class-names): the server stops a run whose sites disagree
    class_fingerprint: str = ""
    # a deployed site's answer to the data-info query (client_app/site_data.py)
    data_info: dict[str, Scalar] = field(default_factory=dict)
    # a digest of the client's data goes into results.json in simulation only: from a
    # deployed site it would let the server confirm which data the site holds
    report_data_digest: bool = False
    # a site that requires SecAgg+ and has not accepted 'metrics' (pflower/privacy/policy.py):
    # a fit reply carries its client key (and class digest) only
    withhold_metrics: bool = False
    # a resident model: the template and the entries receive overwrites (``settle``)
    stale: tuple[nn.Module, frozenset[str]] | None = None


class PFLClient(NumPyClient):
    """Base client: plain local training of every tensor (FedAvg's schedule)."""

    def __init__(
        self,
        model: nn.Module,
        roles: Roles,
        data: ClientData,
        cfg: RunConfig,
        store: PersonalStore,
        device: torch.device,
        client_key: str,
        wire: Wire,
        setup: ClientSetup | None = None,
    ) -> None:
        setup = setup or ClientSetup()
        self.weight_by_samples = setup.weight_by_samples
        self.class_fingerprint = setup.class_fingerprint
        self.data_info = setup.data_info
        self.report_data_digest = setup.report_data_digest
        self.withhold_metrics = setup.withhold_metrics
        self.stale = setup.stale  # put back by ``settle`` once a message has begun
        self.model, self.roles = model.to(device), roles
        self.wire = wire  # how the shared tensors travel, built as the server builds it
        self.cfg = cfg
        self.store = store
        self.device = device
        self.client_key = client_key
        non_blocking = device.type == "cuda"
        self.x_train = data.x_train.to(device, non_blocking=non_blocking)
        self.y_train = data.y_train.to(device, non_blocking=non_blocking)
        self.x_test = data.x_test.to(device, non_blocking=non_blocking)
        self.y_test = data.y_test.to(device, non_blocking=non_blocking)
        self.data = data  # as loaded (its digest goes into results.json)

    # ---- the protocol, written once ------------------------------------------------------

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """What the server may ask before the first round: this client's key and the
        digest of its class list (names only), so sites that disagree on labels are
        stopped before any of them trains."""
        props: dict[str, Scalar] = {CLIENT_KEY: self.client_key}
        if self.class_fingerprint:
            props[CLASSES_KEY] = self.class_fingerprint
        if config.get(ASK_DATA_INFO):  # client_app/site_data.py: the shape its data give
            props.update(self.data_info)
        return props

    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        settle(self, received=False)
        return self.upload(config)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        evaluation = self.fit_begin(parameters, config)
        metrics = self.local_train(config, self.round_generator(config))
        timing.mark("train")
        return self.fit_end(parameters, config, metrics, evaluation)

    def fit_begin(self, parameters: NDArrays, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """A fit up to its training: state restored, (eval-in-fit) the last round scored."""
        server_round = message_round(config)
        self.restore_personal(None if server_round is None else server_round - 1)
        self.receive(parameters, config)
        timing.mark("personal state")
        evaluation: dict[str, Scalar] = {}
        if config.get(EVALUATE_FIRST):  # the previous round's evaluation (eval-in-fit)
            loss, scores = self.score()
            timing.mark("evaluate")
            scores.update({"loss": loss, "num-examples": int(self.y_test.shape[0])})
            evaluation = {f"{EVAL_PREFIX}{k}": v for k, v in scores.items()}
        return evaluation

    def fit_end(
        self, parameters: NDArrays, config: dict[str, Scalar], metrics: dict, evaluation: dict
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """A fit after its local training: the personal state stored, the reply."""
        self.store_personal(config)
        upload = privatize(self.upload(config), parameters, self.cfg, config, self.wire.views)
        timing.mark("store + upload")
        weight = int(self.y_train.shape[0]) if self.weight_by_samples else 1
        return upload, weight, reply_metrics(self, metrics, evaluation)

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        self.restore_personal(message_round(config))
        self.receive(parameters, config)
        timing.mark("personal state")
        loss, metrics = self.score()
        timing.mark("evaluate")
        return loss, int(self.y_test.shape[0]), {CLIENT_KEY: self.client_key, **metrics}

    # ---- personal state ------------------------------------------------------------------

    @property
    def seed_offset(self) -> int:
        return zlib.crc32(self.client_key.encode())

    def round_generator(self, config: dict[str, Scalar]) -> torch.Generator:
        """This client's random stream for this round (shuffling, augmentation)."""
        server_round = int(config.get("server-round", 0))
        return torch.Generator().manual_seed(
            self.cfg.seed * 1_000_003 + server_round * 7919 + self.seed_offset
        )

    @classmethod
    def personal_bytes(cls, model: nn.Module, roles: Roles, wire: Wire) -> int:
        """The bytes a client of this class keeps as personal state for ``model`` (read
        off the model before the client is built: its store is chosen by it)."""
        state = model.state_dict()
        return sum(state[n].numel() * state[n].element_size() for n in roles.personal)

    def personal_state(self) -> dict[str, np.ndarray]:
        """What survives between rounds: the personal tensors (plus method extras)."""
        return dict(zip(self.roles.personal, get_arrays(self.model, self.roles.personal)))

    def personal_tensors(self) -> dict[str, np.ndarray]:
        """What must stay on this site now (the content audit's ground truth): the personal
        tensors; a method whose split is finer names the personal parts (FedFac's rows)."""
        return dict(zip(self.roles.personal, get_arrays(self.model, self.roles.personal)))

    def load_personal_state(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of ``personal_state``."""
        set_arrays(self.model, self.roles.personal, [state[n] for n in self.roles.personal])

    def restore_personal(self, upto: int | None = None) -> None:
        """The personal state saved at round ``upto`` or before (None: the newest):
        a fit of round r starts from r - 1's, an evaluation scores round r's."""
        state = self.store.load(upto)
        if state is None:
            return  # first round, or unreadable state: keep the initial personal part
        misfit = misfits(state, self.model.state_dict(), self.roles.personal)
        if misfit:  # a different model or method wrote it: keep it aside, start afresh
            self.store.set_aside(f"it does not fit this model ({', '.join(misfit[:3])})")
            return
        self.load_personal_state(state)

    def store_personal(self, config: dict[str, Scalar] | None = None) -> None:
        """Keep the personal state as of this message's round, unless training
        diverged: non-finite values are not stored, so the next round starts from the
        last good state (and the server rejects the non-finite upload)."""
        state = self.personal_state()
        bad = [k for k, a in state.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
        if bad:
            log.warning(
                "client %s: training diverged (non-finite %s); the personal state from "
                "before this round is kept",
                self.client_key,
                ", ".join(bad[:3]),
            )
            return
        told = [(config or {}).get(key) for key in (CHECKPOINT_ROUND, CHECKPOINT_WRITING)]
        self.store.save(
            state, message_round(config or {}), *(None if r is None else int(r) for r in told)
        )

    # ---- hooks a method overrides --------------------------------------------------------

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        """Load what the server sent: the shared tensors, as the wire carries them."""
        if parameters:
            dense = self.wire.decode_down(parameters, self.model)
            set_arrays(self.model, self.roles.shared, dense)
        settle(self, received=bool(parameters))

    def upload(self, config: dict[str, Scalar]) -> NDArrays:
        """What leaves the client: exactly the shared tensors, as the wire carries them."""
        return self.wire.encode_up(self.model)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The local objective (cross-entropy by default)."""
        return cross_entropy(model, x, y)

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        """The local schedule: every parameter for ``local-epochs`` on ``loss``."""
        return {"train-loss": train_every_parameter(self, generator)}

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """(loss, metrics with at least ``accuracy``) on the local test split."""
        extra: dict[str, float] = {}
        loss, acc = evaluate(self.model, self.x_test, self.y_test, extra=extra)
        return loss, {"accuracy": acc, **extra}
