"""The cohort engine's batched step (pflower/engine/cohort.py): clients whose local
schedule is the base one (every parameter, ``local-epochs`` of minibatches on
cross-entropy, no augmentation) trained at once with ``torch.func``: their weights
stacked, ``vmap`` of ``grad`` over the clients, then torch's own SGD or Adam update
written out on the stacked tensors (elementwise, so each client's rows are its own
optimizer's). Each client draws its batches from its own round generator exactly as
``train_epochs`` does, so the same seeds give the same batches; the weights agree
with one client after another up to float rounding (tests/test_cohort.py measures it).

Only where it is faster: on a CPU, ``vmap`` over per-client convolution weights runs
a grouped convolution without channels-last, slower than one client after another
for CNN4 (docs/PERFORMANCE.md); the MLP trains faster at once. The clients of a
batch must hold the same number of training samples (the same batch shapes); the
others train one after another.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from client_app.base import PFLClient
from pflower.config.schema import RunConfig

# the backbones measured faster under vmap than one client after another on a CPU
VMAP_BACKBONES = ("mlp",)


def batchable(client: Any, cfg: RunConfig) -> bool:
    """Whether ``client``'s local training is the base schedule, on a model whose
    state is its parameters alone, that this step reproduces."""
    kind = type(client)
    return (
        isinstance(client, PFLClient)
        and kind.local_train is PFLClient.local_train
        and kind.loss is PFLClient.loss
        and cfg.model in VMAP_BACKBONES
        and cfg.augment == "none"
        and cfg.local_steps == 0
        and not list(client.model.buffers())
    )


def batch_orders(client: PFLClient, config: dict[str, Any]) -> list[torch.Tensor]:
    """The client's sample order for each epoch: ``train_epochs``'s draws."""
    generator = client.round_generator(config)
    n = int(client.y_train.shape[0])
    return [torch.randperm(n, generator=generator) for _ in range(client.cfg.local_epochs)]


def train_at_once(
    model: nn.Module,
    start: list[dict[str, torch.Tensor]],
    data: list[tuple[torch.Tensor, torch.Tensor]],
    orders: list[list[torch.Tensor]],
    cfg: RunConfig,
) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Each client's parameters after its local epochs, and its mean batch loss.
    ``start[i]``: client i's parameters by name; ``data[i]``: its (x, y) train split;
    ``orders[i]``: its sample order for each epoch. Every client holds as many
    samples as the first."""
    n, size = int(data[0][1].shape[0]), cfg.batch_size
    if any(int(y.shape[0]) != n for _, y in data):
        raise ValueError("train_at_once: the clients hold different numbers of samples")
    names = list(start[0])
    params = {k: torch.stack([s[k] for s in start]) for k in names}
    model.train()

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (x,)), y)

    step = vmap(grad_and_value(loss))
    update = _sgd(cfg) if cfg.optimizer == "sgd" else _adam(cfg)
    total, steps = torch.zeros(len(start)), 0
    for epoch in range(cfg.local_epochs):
        for first in range(0, n, size):
            idx = [order[epoch][first : first + size] for order in orders]
            xb = torch.stack([x[i] for (x, _), i in zip(data, idx)])
            yb = torch.stack([y[i] for (_, y), i in zip(data, idx)])
            grads, value = step(params, xb, yb)
            update(params, grads)
            total += value.detach()
            steps += 1
    trained = [{k: params[k][i] for k in names} for i in range(len(start))]
    return trained, [float(t) / max(steps, 1) for t in total]


Update = Any  # (params, grads) -> None, params updated in place of their entries


def _sgd(cfg: RunConfig) -> Update:
    """torch.optim.SGD's step (dampening 0, not Nesterov), on stacked tensors."""
    buffers: dict[str, torch.Tensor] = {}

    def update(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        for k, g in grads.items():
            if cfg.weight_decay:
                g = g.add(params[k], alpha=cfg.weight_decay)
            if cfg.momentum:
                buf = buffers.get(k)
                buffers[k] = g = (
                    torch.clone(g).detach() if buf is None else buf.mul_(cfg.momentum).add_(g)
                )
            params[k] = params[k].add(g, alpha=-cfg.lr)

    return update


def _adam(cfg: RunConfig, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> Update:
    """torch.optim.Adam's single-tensor step (its defaults), on stacked tensors."""
    first: dict[str, torch.Tensor] = {}
    second: dict[str, torch.Tensor] = {}
    count = [0]

    def update(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        count[0] += 1
        step = count[0]
        for k, g in grads.items():
            if cfg.weight_decay:
                g = g.add(params[k], alpha=cfg.weight_decay)
            m = first.setdefault(k, torch.zeros_like(g))
            v = second.setdefault(k, torch.zeros_like(g))
            m.lerp_(g, 1 - betas[0])
            v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
            step_size = cfg.lr / (1 - betas[0] ** step)
            denom = (v.sqrt() / (1 - betas[1] ** step) ** 0.5).add_(eps)
            params[k] = params[k].addcdiv(m, denom, value=-step_size)

    return update
