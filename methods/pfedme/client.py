"""pFedMe's local schedule (the paper's Algorithm 1): per batch, K steps on the inner
problem for theta, then w's step on the Moreau envelope's gradient lambda (w - theta)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from flwr.common import Scalar
from torch import nn

from client_app.base import PFLClient
from client_app.train import augment_batch, epoch_batches, make_optimizer, only_trainable
from methods.pfedme import PFedMeParams
from methods.pfedme.model import PFedMeModel


def inner_steps(
    theta: list[nn.Parameter],
    w: list[torch.Tensor],
    loss_fn: Callable[[], torch.Tensor],
    params: PFedMeParams,
) -> torch.Tensor:
    """K gradient steps on f(theta) + lambda/2 ||theta - w||^2 + mu/2 ||theta||^2
    (``loss_fn`` is f on the batch at the current theta), each
    theta <- theta - personal-lr (grad f + lambda (theta - w) + mu theta). Returns f
    at the last step's starting point."""
    loss = torch.zeros(())
    for _ in range(params.k):
        loss = loss_fn()
        grads = torch.autograd.grad(loss, theta, allow_unused=True)
        with torch.no_grad():
            for t, g, anchor in zip(theta, grads, w, strict=True):
                step = params.lam * (t - anchor) + params.mu * t
                t.sub_(params.personal_lr * (step if g is None else g + step))
    return loss.detach()


def outer_step(
    w: list[nn.Parameter], theta: list[torch.Tensor], opt: torch.optim.Optimizer, lam: float
) -> None:
    """One step of ``opt`` (built over ``w``) on the gradient lambda (w - theta): under
    plain SGD at eta, the paper's w <- w - eta lambda (w - theta)."""
    with torch.no_grad():
        for p, t in zip(w, theta, strict=True):
            p.grad = lam * (p - t)
    opt.step()


def start_at(theta: list[nn.Parameter], w: list[torch.Tensor]) -> None:
    """theta's parameters <- w's (each round starts the inner problem at the received w,
    as the authors' code and PFLlib do); theta's buffers stay its own."""
    with torch.no_grad():
        for t, p in zip(theta, w, strict=True):
            t.copy_(p)


class PFedMeClient(PFLClient):
    """``local-epochs`` of batches from the received w; per batch, ``pfedme.k`` inner
    steps for theta (plain gradient steps at ``pfedme.personal-lr``, warm-started from
    the last batch's theta), then one step of w by the run's optimizer (fresh each
    round). theta, as it ends the round, is the personal model that is scored."""

    model: PFedMeModel

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, model = self.cfg, self.model
        params = PFedMeParams.of(cfg)
        w = list(model.global_model.parameters())
        theta = list(model.personal_model.parameters())
        start_at(theta, w)
        opt = make_optimizer(w, cfg)
        model.train()
        total, count = torch.zeros((), device=self.x_train.device), 0
        with only_trainable(model, theta):
            for _ in range(cfg.local_epochs):
                for xb, yb in epoch_batches(self.x_train, self.y_train, cfg, generator):
                    xb = augment_batch(xb, cfg.augment, generator)
                    batch_loss = partial(self.loss, model.personal_model, xb, yb)
                    total += inner_steps(theta, w, batch_loss, params)
                    outer_step(w, theta, opt, params.lam)
                    count += 1
        return {"train-loss": float(total) / max(count, 1)}


CLIENTS = {"pfedme": PFedMeClient}
