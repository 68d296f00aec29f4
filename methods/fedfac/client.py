"""FedFac's client: plain local training of the whole model (the paper's
ClientUpdate), with the element-level split of the Lambda layers applied by the
wire (methods/fedfac/model.py: ``FedFacWire``).

The client keeps its own latest values of every Lambda element (not only the
personal ones): under dynamic FedFac the server decides the split after the
round's training, so any element may turn personal; its value is then the
client's own. Its personal state puts them into the model before a payload is
read; the payload's shared rows replace only the shared ones, so a change of split
loses nothing.

New clients (held out): LocalTrain trains its personal rows and keeps them
between rounds like any client's personal state. Ensemble (``fedfac.ensemble-share-
models=true``, the sites' consent) scores the mean prediction of the trained
clients' personalised models, which the new client receives: no input, label or
prediction of any client travels.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import NDArrays, Scalar
from torch import nn

from client_app.base import PFLClient, message_round
from client_app.train import evaluate, train_epochs
from methods.fedfac import PERSONAL_ROWS, FedFacParams
from methods.fedfac.model import HELD_OUT, PHASE, FedFacWire
from models.roles import CLIENT_KEY, Roles, get_arrays, set_arrays
from models.wire import Wire

_LOCAL = "fedfac.local."


class FedFacClient(PFLClient):
    """Trains everything; keeps its own values of every Lambda row; what travels is
    the wire's (``FedFacWire``: the split, then the shared rows or every row)."""

    wire: FedFacWire
    start: NDArrays = []  # fa-input=updates: this round's personal rows as it began

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        """The payload on the wire of the split it carries; with ``fa-input=updates``
        the personal rows' values as the round begins, for the upload."""
        self.wire = self.wire.for_payload(parameters)
        super().receive(parameters, config)
        if parameters and self.wire.upload_start():
            self.start = self.wire.start_values(self.model)

    def upload(self, config: dict[str, Scalar]) -> NDArrays:
        """The shared tensors as the wire carries them, then (``upload_start``) the start
        values of the rows that were personal."""
        start = self.start if self.wire.upload_start() else []
        return self.wire.encode_up(self.model) + start

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy, the batch mean or (``fedfac.ce-reduction='sum'``, the
        authors' code) its sum."""
        return F.cross_entropy(model(x), y, reduction=FedFacParams.of(self.cfg).ce_reduction)

    # ---- personal state: own values of every Lambda entry ------------------------------------

    @classmethod
    def personal_bytes(cls, model: nn.Module, roles: Roles, wire: Wire) -> int:
        """The base personal tensors plus this client's own values of every Lambda entry."""
        if not isinstance(wire, FedFacWire):
            raise TypeError(f"FedFac's client needs FedFac's wire, not {type(wire).__name__}")
        state, own = model.state_dict(), list(wire.layer_of)
        extra = sum(state[n].numel() * state[n].element_size() for n in own)
        return super().personal_bytes(model, roles, wire) + extra

    def personal_state(self) -> dict[str, np.ndarray]:
        state = super().personal_state()
        names = list(self.wire.layer_of)
        state.update({_LOCAL + n: a for n, a in zip(names, get_arrays(self.model, names))})
        return state

    def load_personal_state(self, state: dict[str, np.ndarray]) -> None:
        """The base personal tensors, then this client's own values of every Lambda
        entry into the model: the rows a payload leaves out stay these."""
        super().load_personal_state(state)
        model = self.model.state_dict()
        own = {n: state[_LOCAL + n] for n in self.wire.layer_of if _LOCAL + n in state}
        misfit = [n for n, a in own.items() if tuple(a.shape) != tuple(model[n].shape)]
        if misfit:  # another model wrote it: keep it aside, start afresh
            self.store.set_aside(f"it does not fit this model ({', '.join(misfit[:3])})")
            return
        set_arrays(self.model, list(own), list(own.values()))

    def personal_tensors(self) -> dict[str, np.ndarray]:
        """The base personal tensors plus the rows of each Lambda entry that the
        current split marks personal."""
        out = super().personal_tensors()
        if self.wire.shared is None:
            return out
        state = self.model.state_dict()
        for layer in self.wire.sizes:
            personal = self.wire.personal(layer)
            if not personal.any():
                continue
            for entry in self.wire.entries[layer]:
                if state[entry].dim():
                    values = state[entry].detach().cpu().numpy()
                    out[entry + PERSONAL_ROWS] = values[personal].copy()
        return out

    # ---- new clients ----------------------------------------------------------------------

    def held_out(self, config: dict[str, Scalar]) -> bool:
        return self.client_key in str(config.get(HELD_OUT, "")).split(",")

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        if config.get(PHASE) == "share-model":  # Ensemble, with the sites' consent
            if not (
                FedFacParams.of(self.cfg).new_client_mode == "ensemble"
                and FedFacParams.of(self.cfg).ensemble_share_models
            ):
                raise PermissionError(
                    f"client {self.client_key} refuses to send its whole model: the run "
                    "did not ask for Ensemble with fedfac.ensemble-share-models=true"
                )
            self.restore_personal(message_round(config))
            self.receive(parameters, config)
            names = list(self.model.state_dict())
            return get_arrays(self.model, names), int(self.y_train.shape[0]), self.tag()
        if self.held_out(config):  # a new client never trains with the federation
            return [], int(self.y_train.shape[0]), {**self.tag(), HELD_OUT: 1}
        return super().fit(parameters, config)

    def tag(self) -> dict[str, Scalar]:
        return {CLIENT_KEY: self.client_key}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        if not self.held_out(config):
            return super().evaluate(parameters, config)
        n = int(self.y_test.shape[0])
        tag = {**self.tag(), HELD_OUT: 1}
        if config.get(PHASE) == "ensemble":
            loss, acc = self.ensemble_score(parameters)
            return loss, n, {**tag, "accuracy": acc}
        if FedFacParams.of(self.cfg).new_client_mode == "localtrain":
            loss, acc = self.local_train_new(parameters, config)
            return loss, n, {**tag, "accuracy": acc}
        return 0.0, n, tag  # Ensemble is scored in the server's last-round ensemble step

    def local_train_new(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, float]:
        """LocalTrain: shared rows from the server, personal rows trained here and
        kept between rounds (they start from this client's initial values)."""
        self.restore_personal(message_round(config))
        self.receive(parameters, config)
        wire = self.wire
        masks = {} if wire.shared is None else {k: wire.personal(k) for k in wire.sizes}
        state = self.model.state_dict()
        params, hooks, keep = [], [], {}
        named = dict(self.model.named_parameters())
        for layer, personal in masks.items():
            for entry in self.wire.entries[layer]:
                if entry not in named:
                    continue  # BN running statistics: updated by the forward pass
                p = named[entry]
                rows = torch.as_tensor(personal, device=p.device)
                grad_mask = rows.reshape(-1, *([1] * (p.dim() - 1))).to(p.dtype)
                hooks.append(p.register_hook(lambda g, m=grad_mask: g * m))
                keep[entry] = (rows, state[entry][~rows].clone())
                params.append(p)
        try:
            train_epochs(
                self.model,
                params,
                self.x_train,
                self.y_train,
                self.cfg.local_epochs,
                self.cfg,
                self.round_generator(config),
                loss_fn=self.loss,
            )
        finally:
            for h in hooks:
                h.remove()
        with torch.no_grad():  # shared rows exactly as received (no decay drift)
            for entry, (rows, values) in keep.items():
                state[entry][~rows] = values
        self.store_personal(config)
        return evaluate(self.model, self.x_test, self.y_test)

    @torch.no_grad()
    def ensemble_score(self, parameters: NDArrays) -> tuple[float, float]:
        """The mean class probabilities of the personalised models in ``parameters``
        (whole state dicts, one after another), on this client's own test split."""
        names = list(self.model.state_dict())
        if not parameters or len(parameters) % len(names):
            raise ValueError(
                f"ensemble payload of {len(parameters)} arrays is not whole models "
                f"of {len(names)} tensors"
            )
        own = get_arrays(self.model, names)
        total = torch.zeros(())
        try:
            for k in range(0, len(parameters), len(names)):
                set_arrays(self.model, names, parameters[k : k + len(names)])
                self.model.eval()
                p = torch.cat([torch.softmax(self.model(xb), 1) for xb in self.x_test.split(512)])
                total = total + p.cpu()
            probs = total / (len(parameters) // len(names))
        finally:
            set_arrays(self.model, names, own)
        y = self.y_test.cpu()
        acc = float((probs.argmax(dim=1) == y).float().mean())
        loss = float(torch.nn.functional.nll_loss(probs.clamp_min(1e-12).log(), y))
        return loss, acc


CLIENTS = {"fedfac-static": FedFacClient, "fedfac-dynamic": FedFacClient}
