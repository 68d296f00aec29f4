"""Per-FedAvg's local schedule: meta steps on fresh batches, and one step of alpha on a
training batch before each evaluation."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import (
    LossFn,
    augment_batch,
    batches,
    evaluate,
    make_optimizer,
    only_trainable,
)
from methods.per_fedavg import PerFedAvgParams
from pflower.config.schema import RunConfig

Batch = tuple[torch.Tensor, torch.Tensor]


def batch_stream(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator
) -> Iterator[Batch]:
    """Shuffled batches without end: a fresh permutation each time the data run out, so a
    meta step always finds its batches, however few the client's samples."""
    while True:
        yield from batches(x, y, batch_size, generator)


def gradients(
    model: nn.Module, params: Sequence[nn.Parameter], loss_fn: LossFn, batch: Batch
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(loss, its gradient in each of ``params``) at the parameters' current values; a
    parameter the loss does not reach gets zeros."""
    loss = loss_fn(model, *batch)
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    return loss.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


@torch.no_grad()
def _move(params: Sequence[nn.Parameter], direction: Sequence[torch.Tensor], by: float) -> None:
    for p, d in zip(params, direction):
        p.add_(d, alpha=by)


@torch.no_grad()
def _put(params: Sequence[nn.Parameter], values: Sequence[torch.Tensor]) -> None:
    for p, v in zip(params, values):
        p.copy_(v)


def meta_gradient(
    model: nn.Module,
    params: Sequence[nn.Parameter],
    loss_fn: LossFn,
    steps: Sequence[Batch],
    alpha: float,
    delta: float = 0.001,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the loss at w', the direction the meta step moves w against) for ``params`` at
    their values w, which they hold again on return (copied back, not stepped back).

    ``steps`` = (D, D'): first-order, grad f(w'; D') with w' = w - alpha grad f(w; D).
    ``steps`` = (D, D', D''): hessian-free, that minus alpha (grad f(w + delta g; D'') -
    grad f(w - delta g; D'')) / (2 delta), g = grad f(w'; D'): the paper's
    (I - alpha Hessian f(w; D'')) g with the Hessian-vector product by finite differences.
    """
    w = [p.detach().clone() for p in params]
    _, inner = gradients(model, params, loss_fn, steps[0])
    _move(params, inner, -alpha)  # w'
    loss, outer = gradients(model, params, loss_fn, steps[1])
    _put(params, w)
    if len(steps) == 2:
        return loss, outer
    _move(params, outer, delta)
    _, plus = gradients(model, params, loss_fn, steps[2])
    _put(params, w)
    _move(params, outer, -delta)
    _, minus = gradients(model, params, loss_fn, steps[2])
    _put(params, w)
    scale = alpha / (2 * delta)
    return loss, [g - scale * (a - b) for g, a, b in zip(outer, plus, minus)]


def meta_steps(samples: int, cfg: RunConfig, batches_each: int) -> int:
    """Meta steps in a round: per epoch, ``local-steps`` where set, else as many as use
    the client's samples about once (each step takes ``batches_each`` batches)."""
    per_epoch = cfg.local_steps or max(1, math.ceil(samples / (batches_each * cfg.batch_size)))
    return cfg.local_epochs * per_epoch


def adapted(model: nn.Module, loss_fn: LossFn, batch: Batch, alpha: float) -> nn.Module:
    """A copy of ``model`` after one plain gradient step of ``alpha`` on ``batch``, every
    parameter: the personalised model Per-FedAvg's objective scores."""
    tuned = copy.deepcopy(model)
    tuned.train()
    params = list(tuned.parameters())
    with only_trainable(tuned, params):
        _, grads = gradients(tuned, params, loss_fn, batch)
    _move(params, grads, -alpha)
    return tuned


class PerFedAvgClient(PFLClient):
    """Training: meta steps from the received model (what goes back). Evaluation: the
    received model after one step of alpha (``personalised``), never uploaded."""

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, own = self.cfg, PerFedAvgParams.of(self.cfg)
        model = self.model
        params = list(model.parameters())
        each = 3 if own.variant == "hessian-free" else 2
        stream = batch_stream(self.x_train, self.y_train, cfg.batch_size, generator)
        # the outer step: the run's optimizer, at beta
        opt = make_optimizer(params, cfg.model_copy(update={"lr": own.beta}))
        samples = int(self.y_train.shape[0])
        steps = meta_steps(samples, cfg, each) if samples else 0
        total = torch.zeros((), device=self.x_train.device)
        model.train()
        with only_trainable(model, params):
            for _ in range(steps):
                drawn = [next(stream) for _ in range(each)]
                drawn = [(augment_batch(xb, cfg.augment, generator), yb) for xb, yb in drawn]
                loss, direction = meta_gradient(
                    model, params, self.loss, drawn, own.alpha, own.delta
                )
                for p, g in zip(params, direction):
                    p.grad = g
                opt.step()
                total += loss
        opt.zero_grad(set_to_none=True)  # no gradient left on the (resident) model
        return {"train-loss": float(total) / max(steps, 1)}

    def adaptation_batch(self) -> Batch:
        """The training batch the evaluation step takes: the first of a seeded shuffle,
        the same at every evaluation, so two evaluations of one model agree."""
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.seed_offset)
        return next(batches(self.x_train, self.y_train, self.cfg.batch_size, generator))

    def personalised(self) -> nn.Module:
        """The received model after one SGD step of alpha on ``adaptation_batch``."""
        if self.y_train.shape[0] == 0:  # nothing to adapt on: the global model itself
            return self.model
        alpha = PerFedAvgParams.of(self.cfg).alpha
        return adapted(self.model, self.loss, self.adaptation_batch(), alpha)

    def score(self) -> tuple[float, dict[str, Scalar]]:
        extra: dict[str, float] = {}
        loss, acc = evaluate(self.personalised(), self.x_test, self.y_test, extra=extra)
        _, acc_global = evaluate(self.model, self.x_test, self.y_test)
        return loss, {"accuracy": acc, "accuracy-global": acc_global, **extra}


CLIENTS = {"per-fedavg": PerFedAvgClient}
