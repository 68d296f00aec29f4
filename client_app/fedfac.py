"""FedFac's client: plain local training of the whole model (the paper's
ClientUpdate), with the element-level split of the Lambda layers applied on
receive and upload.

The client keeps its own latest values of every Lambda element (not only the
personal ones): under dynamic FedFac the server decides the split after the
round's training, so any element may turn personal; its value is then the
client's own. On receive, personal elements (the mask in the config) take the
kept values, shared ones the global ones; so a change of split loses nothing.
Uploads carry every Lambda element when the server needs them for FA
(``fa-full-upload``), otherwise only the shared ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.common import NDArrays, Scalar

from client_app.base import CLIENT_KEY, PFLClient
from client_app.train import evaluate, train_epochs
from models.fedfac import (
    MASK_KEY,
    array_to_bytes,
    bytes_to_array,
    element_entries,
    layer_sizes,
    parse_layers,
    unpack_mask,
)
from models.roles import get_arrays

HELD_OUT = "fa-held-out"
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

    # ---- personal state: base personal tensors + own Lambda values + masks ---------------

    def personal_state(self) -> dict[str, np.ndarray]:
        state = super().personal_state()
        names = list(self.layer_of)
        state.update({_LOCAL + n: a for n, a in zip(names, get_arrays(self.model, names))})
        state.update({_MASK + k: m.astype(np.uint8) for k, m in self.personal.items()})
        return state

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

    def receive(self, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        super().receive(parameters, config)
        masks = self.masks(config)
        state = self.model.state_dict()
        with torch.no_grad():
            for layer, personal in masks.items():
                for entry in self.entries[layer]:
                    if entry in self.local:
                        own = torch.as_tensor(self.local[entry][personal])
                        state[entry][torch.as_tensor(personal)] = own.to(state[entry].device)
        self.personal.update(masks)

    def upload(self, config: dict[str, Scalar]) -> NDArrays:
        arrays = super().upload(config)
        if config.get("fa-full-upload", True):
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
        if self.held_out(config):  # a new client never trains with the federation
            return [], int(self.y_train.shape[0]), {CLIENT_KEY: self.client_key, HELD_OUT: 1}
        return super().fit(parameters, config)

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        phase = config.get("fa-phase", "")
        n = int(self.y_test.shape[0])
        if phase == "predict":  # a trained client predicts for a new client
            self.restore_personal()
            self.receive(parameters, config)
            probs = self.predict_proba(bytes_to_array(config["fa-inputs"]))
            return 0.0, n, {CLIENT_KEY: self.client_key, "fa-probs": array_to_bytes(probs)}
        if not self.held_out(config):
            return super().evaluate(parameters, config)
        tag = {CLIENT_KEY: self.client_key, HELD_OUT: 1}
        if phase == "inputs":  # Ensemble, step 1: the new client's test inputs
            return 0.0, n, {**tag, "fa-inputs": array_to_bytes(self.x_test.cpu().numpy())}
        if phase == "score":  # Ensemble, step 3: score the mean prediction
            probs = torch.as_tensor(bytes_to_array(config["fa-probs"]))
            acc = float((probs.argmax(dim=1) == self.y_test.cpu()).float().mean())
            loss = float(
                torch.nn.functional.nll_loss(probs.clamp_min(1e-12).log(), self.y_test.cpu())
            )
            return loss, n, {**tag, "accuracy": acc}
        if self.cfg.new_client_mode == "localtrain":
            loss, acc = self.local_train_new(parameters, config)
            return loss, n, {**tag, "accuracy": acc}
        return 0.0, n, tag  # Ensemble is scored in the server's prediction round

    def local_train_new(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, float]:
        """LocalTrain: shared params from the server, personal elements trained here
        (starting from the global's value of each personal element: its initial
        value, or its last average if it was shared once); nothing is stored."""
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
        generator = torch.Generator().manual_seed(self.cfg.seed + self.seed_offset)
        try:
            train_epochs(
                self.model,
                params,
                self.x_train,
                self.y_train,
                self.cfg.local_epochs,
                self.cfg,
                generator,
            )
        finally:
            for h in hooks:
                h.remove()
        with torch.no_grad():  # shared rows exactly as received (no decay drift)
            for entry, (rows, values) in keep.items():
                state[entry][~rows] = values
        return evaluate(self.model, self.x_test, self.y_test)

    @torch.no_grad()
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities of this client's personalised model."""
        self.model.eval()
        xt = torch.as_tensor(x, device=self.device)
        out = [torch.softmax(self.model(xb), dim=1) for xb in xt.split(512)]
        return torch.cat(out).cpu().numpy().astype(np.float32)
