"""APFL's local schedule (the paper's Algorithm 1 with its adaptive alpha), and
PFLlib's reading of it under ``apfl.variant='pfllib'`` (docs/apfl.md)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from flwr.common import Scalar

from client_app.base import PFLClient
from client_app.train import augment_batch, epoch_batches, make_optimizer, only_trainable
from methods.apfl import ApflParams
from methods.apfl.model import ApflModel


def step_alpha(model: ApflModel, grad: torch.Tensor, params: ApflParams) -> None:
    """One projected gradient step on alpha: down its gradient (plus the decay
    term), then clipped to [0, 1], where the mix is a convex combination."""
    with torch.no_grad():
        grad = grad + params.alpha_decay * model.alpha
        model.alpha.sub_(params.alpha_lr * grad).clamp_(0.0, 1.0)


def paper_step(
    model: ApflModel,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    params: ApflParams,
) -> torch.Tensor:
    """One batch of the paper's schedule, every gradient at the same (pre-step)
    point: w on f(w); v on f(alpha v + (1 - alpha) w) (the chain rule gives v
    alpha times the mix's gradient); alpha on the same loss, whose gradient is
    <v - w, grad f(mix)>. Returns (w's loss, the mix's loss)."""
    alpha = model.alpha.detach().clone().requires_grad_(params.adaptive_alpha)
    global_loss = F.cross_entropy(model.global_model(x), y)
    # w detached in the mix: its gradient is its own loss's alone
    mixed_loss = F.cross_entropy(model.mixed(x, alpha, detach_global=True), y)
    opt.zero_grad(set_to_none=True)
    (global_loss + mixed_loss).backward()
    opt.step()
    if params.adaptive_alpha and alpha.grad is not None:
        step_alpha(model, alpha.grad, params)
    return torch.stack([global_loss.detach(), mixed_loss.detach()])


def pfllib_alpha_grad(model: ApflModel) -> torch.Tensor:
    """PFLlib's gradient for alpha (clientapfl.py:69-76): <v - w, alpha grad f(v) +
    (1 - alpha) grad f(w)>, with v and w after their steps and each gradient taken
    at its own model (not at the mix); the decay term is added by ``step_alpha``."""
    a = model.alpha
    total = torch.zeros_like(a)
    pairs = zip(model.local_model.parameters(), model.global_model.parameters(), strict=True)
    with torch.no_grad():
        for v, w in pairs:
            if v.grad is not None and w.grad is not None:
                total += ((v - w) * (a * v.grad + (1 - a) * w.grad)).sum()
    return total


def pfllib_step(
    model: ApflModel,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    params: ApflParams,
) -> torch.Tensor:
    """One batch of PFLlib's schedule (clientapfl.py:44-56): w on f(w), v on its own
    f(v), then alpha. Returns (w's loss, v's loss)."""
    global_loss = F.cross_entropy(model.global_model(x), y)
    local_loss = F.cross_entropy(model.local_model(x), y)
    opt.zero_grad(set_to_none=True)
    (global_loss + local_loss).backward()  # the two losses share no parameter
    opt.step()
    if params.adaptive_alpha:
        step_alpha(model, pfllib_alpha_grad(model), params)
    return torch.stack([global_loss.detach(), local_loss.detach()])


def mix_into_local(model: ApflModel) -> None:
    """PFLlib's round end (clientapfl.py:58-59): v becomes the mix's parameters."""
    a = model.alpha
    pairs = zip(model.local_model.parameters(), model.global_model.parameters(), strict=True)
    with torch.no_grad():
        for v, w in pairs:
            v.copy_(a * v + (1 - a) * w)


class ApflClient(PFLClient):
    """``local-epochs`` of batches from the received w; w, v and alpha all step
    each batch (w and v with one optimizer of the run's settings, fresh each round;
    alpha by plain projected gradient descent at ``apfl.alpha-lr``)."""

    model: ApflModel

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        cfg, model = self.cfg, self.model
        params = ApflParams.of(cfg)
        step = paper_step if params.variant == "paper" else pfllib_step
        trained = [*model.global_model.parameters(), *model.local_model.parameters()]
        opt = make_optimizer(trained, cfg)
        model.train()
        total, count = torch.zeros(2, device=self.x_train.device), 0
        with only_trainable(model, trained):
            for _ in range(cfg.local_epochs):
                for xb, yb in epoch_batches(self.x_train, self.y_train, cfg, generator):
                    xb = augment_batch(xb, cfg.augment, generator)
                    total += step(model, opt, xb, yb, params)
                    count += 1
        if params.variant == "pfllib":
            mix_into_local(model)
        global_loss, personal_loss = (float(t) / max(count, 1) for t in total)
        return {"train-loss": personal_loss, "global-loss": global_loss}


CLIENTS = {"apfl": ApflClient}
