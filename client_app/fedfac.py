"""FedFac's client: plain local training of the whole model (the paper's
ClientUpdate), with the element-level split of the Lambda layers applied on
receive and upload.

The client keeps its own latest values of every Lambda element (not only the
personal ones): under dynamic FedFac the server decides the split after the
round's training, so any element may turn personal; its value is then the
client's own. On receive, personal elements (the mask in the config) take the
kept values, shared ones the global ones; so a change of split loses nothing.
Uploads carry every Lambda element when the server needs them for FA
(``fa-full-upload``), otherwise only the shared ones; with ``fa-upload-start``
(``fa-input=updates``) the start values of the rows that were personal go up
too, so the server can compute each row's change from what this client really
started from (its shared rows started from the global values it sent).
Once a split exists, downloads carry only the shared rows of a Lambda layer
(``expand`` puts them back beside the client's own personal rows).

New clients (held out): LocalTrain trains its personal rows and keeps them
between rounds like any client's personal state. Ensemble (``ensemble-share-
models=true``, the sites' consent) scores the mean prediction of the trained
clients' personalised models, which the new client receives: no input, label or
prediction of any client travels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.common import NDArrays, Scalar

from client_app.base import PFLClient
from client_app.train import evaluate, train_epochs
from models.fedfac import (
    FULL_UPLOAD,
    HELD_OUT,
    MASK_KEY,
    PERSONAL_ROWS,
    PHASE,
    UPLOAD_START,
    element_entries,
    layer_sizes,
    parse_layers,
    unpack_mask,
)
from models.roles import CLIENT_KEY, get_arrays, set_arrays

_LOCAL = "fedfac.local."
_MASK = "fedfac.mask."


class FedFacClient(PFLClient):
    """Trains everything; keeps personal elements; uploads shared (or all) elements."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        layers = parse_layers(self.cfg.fa_layers)
        self.entries = element_entries(self.model, layers)
        self.sizes = layer_sizes(self.model, layers)
        self.layer_of = {e: layer for layer, es in self.entries.items() for e in es}
        self.local: dict[str, np.ndarray] = {}  # own latest values of every Lambda entry
        self.personal: dict[str, np.ndarray] = {}  # last mask seen, True = personal
        self.start: dict[str, np.ndarray] = {}  # Lambda weights as this round began

    # ---- personal state: base personal tensors + own Lambda values + masks ---------------

    def personal_state(self) -> dict[str, np.ndarray]:
        state = super().personal_state()
        names = list(self.layer_of)
        state.update({_LOCAL + n: a for n, a in zip(names, get_arrays(self.model, names))})
        state.update({_MASK + k: m.astype(np.uint8) for k, m in self.personal.items()})
        return state

    def personal_tensors(self) -> dict[str, np.ndarray]:
        """The base personal tensors plus the rows of each Lambda entry that the
        current mask marks personal."""
        out = super().personal_tensors()
        state = self.model.state_dict()
        for layer, personal in self.personal.items():
            if not personal.any():
                continue
            for entry in self.entries[layer]:
                if state[entry].dim():
                    values = state[entry].detach().cpu().numpy()
                    out[entry + PERSONAL_ROWS] = values[personal].copy()
        return out

    def load_personal_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_personal_state(state)
        self.local = {k[len(_LOCAL) :]: v for k, v in state.items() if k.startswith(_LOCAL)}
        self.personal = {
            k[len(_MASK) :]: v.astype(bool) for k, v in state.items() if k.startswith(_MASK)
        }

    def masks(self, config: dict[str, Scalar]) -> dict[str, np.ndarray]:
        """The personal-element mask of each Lambda layer sent with the payload."""
        out = {}
        for layer, size in self.sizes.items():
            data = config.get(MASK_KEY + layer)
            if isinstance(data, bytes):
                out[layer] = unpack_mask(data, size)
        return out

    # ---- the split on the wire ------------------------------------------------------------

    def expand(self, parameters: NDArrays, masks: dict[str, np.ndarray]) -> NDArrays:
        """Compact downloads (shared rows only) back to full arrays; the personal
        rows take the model's current values (replaced by the kept ones next)."""
        state = self.model.state_dict()
        out = []
        for name, a in zip(self.roles.shared, parameters, strict=True):
            layer = self.layer_of.get(name)
            full = state[name]
            if layer in masks and full.dim() and a.shape[0] != full.shape[0]:
                values = full.detach().cpu().numpy().copy()
                values[~masks[layer]] = a
                a = values
            out.append(a)
        return out

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        masks = self.masks(config)
        super().receive(self.expand(parameters, masks) if parameters else parameters, config)
        state = self.model.state_dict()
        with torch.no_grad():
            for layer, personal in masks.items():
                for entry in self.entries[layer]:
                    if entry in self.local:
                        own = torch.as_tensor(self.local[entry][personal])
                        state[entry][torch.as_tensor(personal)] = own.to(state[entry].device)
        self.personal.update(masks)
        if config.get(UPLOAD_START):  # fa-input=updates: keep where this round began
            weights = [f"{layer}.weight" for layer in self.entries]
            self.start = dict(zip(weights, get_arrays(self.model, weights)))

    def upload(self, config: dict[str, Scalar]) -> NDArrays:
        arrays = super().upload(config)
        if config.get(FULL_UPLOAD, True):
            if config.get(UPLOAD_START):  # fa-input=updates: where personal rows began
                masks = self.masks(config)
                arrays += [
                    self.start[f"{layer}.weight"][personal] for layer, personal in masks.items()
                ]
            return arrays
        masks = self.masks(config)
        return [
            a[~masks[self.layer_of[n]]] if n in self.layer_of else a
            for n, a in zip(self.roles.shared, arrays)
        ]

    # ---- new clients ----------------------------------------------------------------------

    def held_out(self, config: dict[str, Scalar]) -> bool:
        return self.client_key in str(config.get(HELD_OUT, "")).split(",")

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        if config.get(PHASE) == "share-model":  # Ensemble, with the sites' consent
            if not (self.cfg.new_client_mode == "ensemble" and self.cfg.ensemble_share_models):
                raise PermissionError(
                    f"client {self.client_key} refuses to send its whole model: the run "
                    "did not ask for Ensemble with ensemble-share-models=true"
                )
            self.restore_personal()
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
        if self.cfg.new_client_mode == "localtrain":
            loss, acc = self.local_train_new(parameters, config)
            return loss, n, {**tag, "accuracy": acc}
        return 0.0, n, tag  # Ensemble is scored in the server's last-round ensemble step

    def local_train_new(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, float]:
        """LocalTrain: shared rows from the server, personal rows trained here and
        kept between rounds (they start from this client's initial values)."""
        self.restore_personal()
        self.receive(parameters, config)
        masks = self.masks(config)
        state = self.model.state_dict()
        params, hooks, keep = [], [], {}
        named = dict(self.model.named_parameters())
        for layer, personal in masks.items():
            for entry in self.entries[layer]:
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
            )
        finally:
            for h in hooks:
                h.remove()
        with torch.no_grad():  # shared rows exactly as received (no decay drift)
            for entry, (rows, values) in keep.items():
                state[entry][~rows] = values
        self.store_personal()
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
