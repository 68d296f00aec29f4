"""FedALA's local schedule: adaptive local aggregation (the paper's Algorithm 1,
lines 6-16), then ordinary local training of the mixed model (docs/fedala.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import Scalar
from torch.func import functional_call

from client_app.base import PFLClient
from methods.fedala import FedAlaParams
from methods.fedala.model import NO_LOCAL, SETTLED, START, FedAlaModel, mix

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def weight_step(
    weight: torch.Tensor,
    grad: torch.Tensor,
    previous: torch.Tensor,
    received: torch.Tensor,
    eta: float,
) -> None:
    """One step of W in place: d loss / d W = grad * (theta_global - theta_prev) (the
    chain rule through ``mix``, ``grad`` the loss's gradient at the mix), then W
    clipped to [0, 1]."""
    weight.sub_(eta * grad * (received - previous)).clamp_(0.0, 1.0)


def ala_sample(
    x: torch.Tensor, y: torch.Tensor, percent: int, batch_size: int, generator: torch.Generator
) -> Batches:
    """A random ``percent`` of the training data (at least one sample), in batches
    that stay the same for every pass of this round's W learning."""
    n = int(y.shape[0])
    keep = max(1, int(n * percent / 100))
    idx = torch.randperm(n, generator=generator)[:keep].to(x.device)
    return [
        (x[idx[s : s + batch_size]], y[idx[s : s + batch_size]]) for s in range(0, keep, batch_size)
    ]


def settled(losses: list[float], params: FedAlaParams) -> bool:
    """The start phase's stopping rule: more than ``num-pre-loss`` losses recorded and
    the (population) standard deviation of the last ``num-pre-loss`` under ``threshold``."""
    window = params.num_pre_loss
    return len(losses) > window and float(np.std(losses[-window:])) < params.threshold


def learn_weights(
    model: FedAlaModel, sample: Batches, params: FedAlaParams, converge: bool
) -> list[float]:
    """W learned on ``sample`` with ``net`` holding the received model: one pass, or
    (``converge``) passes until ``settled`` or ``max-start-epochs``. Each batch scores
    the mix, steps W and re-mixes. Lower layers and buffers are the received ones (the
    buffers copied: BatchNorm's statistics are not moved). Returns each pass's last
    batch loss."""
    net, top = model.net, model.top
    previous, weights = model.previous.of(top), model.weights.of(top)
    received = [p.detach().clone() for p in model.top_parameters()]
    fixed = {n: p.detach() for n, p in net.named_parameters()}
    fixed.update({n: b.clone() for n, b in net.named_buffers()})
    losses: list[float] = []
    while True:
        loss = torch.zeros(())
        for xb, yb in sample:
            pairs = zip(previous, received, weights)
            theta = [mix(p, g, w).requires_grad_(True) for p, g, w in pairs]
            out = functional_call(net, {**fixed, **dict(zip(top, theta))}, (xb,))
            loss = F.cross_entropy(out, yb)
            grads = torch.autograd.grad(loss, theta)
            with torch.no_grad():
                for w, g, p, r in zip(weights, grads, previous, received):
                    weight_step(w, g, p, r, params.eta)
        losses.append(float(loss.detach()))
        if not converge or settled(losses, params) or len(losses) >= params.max_start_epochs:
            return losses


def local_aggregation(model: FedAlaModel, sample: Batches, params: FedAlaParams) -> int:
    """ALA on a model whose ``net`` holds the received model: W learned (until settled
    in the start phase, one pass after), then ``net``'s top set to the mix; its lower
    layers keep the received values. Returns the passes W took."""
    model.net.train()  # as the model W learns for trains (dropout, batch statistics)
    passes = len(learn_weights(model, sample, params, converge=int(model.phase) == START))
    model.set_top(model.mixed_top())
    model.phase.fill_(SETTLED)
    return passes


class FedAlaClient(PFLClient):
    """With a local model, ``local_aggregation`` first; without one (its first fit),
    the received model as it is. Then ``local-epochs`` on every parameter; the
    trained top becomes the previous local model."""

    model: FedAlaModel

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        model, params, passes = self.model, FedAlaParams.of(self.cfg), 0
        if int(model.phase) != NO_LOCAL:
            size = self.cfg.batch_size
            sample = ala_sample(self.x_train, self.y_train, params.rand_percent, size, generator)
            passes = local_aggregation(model, sample, params)
        metrics = super().local_train(config, generator)
        model.keep_local()
        return {**metrics, "ala-epochs": passes}

    def personal_tensors(self) -> dict[str, np.ndarray]:
        """What the upload does not already give away: W. The previous local model is
        the top of this client's last upload (the trained ``net``), so not its secret."""
        own = super().personal_tensors()
        return {n: a for n, a in own.items() if not n.startswith("previous.")}

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """The personalised model: the received one with its top mixed by the kept W."""
        with self.model.personalised():
            return super().score()


CLIENTS = {"fedala": FedAlaClient}
