"""FedProto's local schedule and evaluation (the paper's Algorithm 1; docs/fedproto.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import evaluate, train_epochs
from methods.fedproto import SHARED, FedProtoParams
from methods.fedproto.model import FedProtoModel, nearest_prototype


def prototype_penalty(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, present: torch.Tensor
) -> torch.Tensor:
    """The MSE (mean over the batch and the feature dims) between each embedding and
    its class's global prototype; a sample whose class has none is its own target
    (it adds zero but counts in the mean, as in PFLlib's and the authors' code)."""
    target = torch.where(present[y][:, None], protos[y], z.detach())
    return F.mse_loss(z, target)


def local_statistics(
    sums: torch.Tensor, seen: torch.Tensor, class_counts: torch.Tensor, weighting: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(proto_sums, proto_counts) to upload: each class's prototype (the mean of the
    embeddings seen in training) times its weight, and the weight: the class's number
    of training samples ('samples'), or 1 ('clients'); 0 for a class not seen."""
    has = seen > 0
    mean = sums / torch.where(has, seen, torch.ones_like(seen))[:, None]
    weight = class_counts.to(sums.dtype) if weighting == "samples" else torch.ones_like(seen)
    weight = weight * has
    return mean * weight[:, None], weight


class FedProtoClient(PFLClient):
    """``local-epochs`` of the run's optimizer on the whole model, on cross-entropy plus
    ``fedproto.lambda`` x the prototype penalty against the received global prototypes;
    the embeddings of the batches, summed per class, give the local prototypes."""

    model: FedProtoModel
    sent: dict[str, np.ndarray] | None = None  # the last upload's buffers (the audit's truth)

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, model = self.cfg, self.model
        params = FedProtoParams.of(cfg)
        protos, present = (t.detach().clone() for t in model.prototypes())
        sums = torch.zeros_like(model.proto_sums)
        seen = torch.zeros_like(model.proto_counts)
        penalties: list[torch.Tensor] = []

        def loss(m: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            z = m.features(xb)
            penalty = prototype_penalty(z, yb, protos, present)
            penalties.append(penalty.detach())
            sums.index_add_(0, yb, z.detach().to(sums.dtype))
            seen.index_add_(0, yb, torch.ones_like(yb, dtype=seen.dtype))
            return F.cross_entropy(m.head(z), yb) + params.lam * penalty

        total = train_epochs(
            model, list(model.parameters()), self.x_train, self.y_train,
            cfg.local_epochs, cfg, generator, loss,
        )  # fmt: skip
        counts = torch.bincount(self.y_train, minlength=seen.shape[0]).to(seen)
        up_sums, up_counts = local_statistics(sums, seen, counts, params.weighting)
        with torch.no_grad():
            model.proto_sums.copy_(up_sums)
            model.proto_counts.copy_(up_counts)
        self.sent = {n: getattr(model, n).detach().cpu().numpy().copy() for n in SHARED}
        penalty = float(torch.stack(penalties).mean()) if penalties else 0.0
        return {"train-loss": total, "proto-loss": penalty}

    def personal_tensors(self) -> dict[str, np.ndarray]:
        """The personal tensors, and the class prototypes and counts this site last
        sent: computed from its data, they are what the card declares."""
        return {**super().personal_tensors(), **(self.sent or {})}

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """The head's cross-entropy, and the accuracy of the nearest global prototype
        (``fedproto.predict='prototype'``, where the received buffers hold any) or of
        the head; the head's accuracy beside it as ``accuracy-head``."""
        model = self.model
        extra: dict[str, float] = {}
        loss, acc_head = evaluate(model, self.x_test, self.y_test, extra=extra)
        protos, present = model.prototypes()
        if FedProtoParams.of(self.cfg).predict == "head" or not bool(present.any()):
            return loss, {"accuracy": acc_head, **extra}
        extra = {}

        def predict(xb: torch.Tensor) -> torch.Tensor:
            return nearest_prototype(model.features(xb), protos, present)

        _, acc = evaluate(model, self.x_test, self.y_test, predict=predict, extra=extra)
        return loss, {"accuracy": acc, "accuracy-head": acc_head, **extra}


CLIENTS = {"fedproto": FedProtoClient}
