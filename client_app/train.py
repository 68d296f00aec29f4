"""Local training and evaluation loops, written once for every method."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import rankdata
from torch import nn

import pflower.patches
from pflower.config.schema import RunConfig

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default local loss."""
    return F.cross_entropy(model(x), y)


def augment_batch(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """A seeded, per-sample augmentation of an image batch (B, C, H, W) on its device.

    ``crop-flip``: random 4-pixel-padded crop + horizontal flip (standard CIFAR);
    ``flip-rotate``: horizontal flip + rotation in [-15, 15] degrees (DualFed).
    Written here rather than with torchvision.transforms.v2, which draws one set
    of random parameters per call (the whole batch would get the same crop or
    angle); the random draws come from ``generator``, so a run is reproducible.
    """
    if kind == "none" or x.dim() != 4:
        return x
    b, _, h, w = x.shape
    flip = (torch.rand(b, generator=generator) < 0.5).to(x.device)
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    if kind == "crop-flip":
        pad = 4
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator).to(x.device)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator).to(x.device)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        idx = torch.arange(b, device=x.device)[:, None, None, None]
        chan = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        return padded[idx, chan, rows, cols]
    angle = (torch.rand(b, generator=generator) * 30.0 - 15.0).deg2rad().to(x.device, x.dtype)
    cos, sin = angle.cos(), angle.sin()
    zero = torch.zeros_like(cos)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")


def batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches of in-memory tensors (no shuffle without a generator).

    A DataLoader would add per-batch collation and worker overhead for data that
    already sits in one tensor; slicing a permutation is the same sampling.
    """
    n = y.shape[0]
    if generator is None:
        order = None
    else:
        order = torch.randperm(n, generator=generator).to(x.device, non_blocking=True)
    for start in range(0, n, batch_size):
        if order is None:
            yield x[start : start + batch_size], y[start : start + batch_size]
        else:
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]


def epoch_batches(
    x: torch.Tensor, y: torch.Tensor, cfg: RunConfig, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch: a pass over the data, or with ``local-steps`` exactly that many
    batches, reshuffling each time the data runs out."""
    if cfg.local_steps <= 0:
        yield from batches(x, y, cfg.batch_size, generator)
        return
    steps = 0
    while steps < cfg.local_steps:
        for batch in batches(x, y, cfg.batch_size, generator):
            yield batch
            steps += 1
            if steps == cfg.local_steps:
                return


@contextmanager
def only_trainable(model: nn.Module, params: Iterable[nn.Parameter]) -> Iterator[None]:
    """Within the block, only ``params`` require grad (no wasted backward work)."""
    keep = {id(p) for p in params}
    before = {id(p): p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p in model.parameters():
            p.requires_grad_(before[id(p)])


# torch's SGD and Adam, without their torch._dynamo wrappers (pflower.patches says why)
SGD, Adam = pflower.patches.optimizers()
pflower.patches.npy_headers()  # the received tensors, without parsing their headers again


def make_optimizer(params: list[nn.Parameter], cfg: RunConfig) -> torch.optim.Optimizer:
    """A fresh optimizer for one phase of a schedule."""
    if cfg.optimizer == "adam":
        return Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def train_epochs(
    model: nn.Module,
    params: list[nn.Parameter],
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    cfg: RunConfig,
    generator: torch.Generator,
    loss_fn: LossFn = cross_entropy,
    optimizer: torch.optim.Optimizer | None = None,
) -> float:
    """Train ``params`` (only those) for ``epochs``; returns the mean batch loss."""
    if epochs <= 0 or not params:
        return 0.0
    opt = optimizer or make_optimizer(params, cfg)
    model.train()
    total, count = torch.zeros((), device=x.device), 0
    with only_trainable(model, params):
        for _ in range(epochs):
            for xb, yb in epoch_batches(x, y, cfg, generator):
                xb = augment_batch(xb, cfg.augment, generator)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model, xb, yb)
                loss.backward()
                opt.step()
                total += loss.detach()
                count += 1
    return float(total) / max(count, 1)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 512,
    predict: Callable[[torch.Tensor], torch.Tensor] | None = None,
    extra: dict[str, float] | None = None,
) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``predict`` (default: the model) on x, y.
    With ``extra``, a two-class task adds ``auc`` there (the ROC AUC of the class-1
    probability, where the test split holds both classes)."""
    if y.shape[0] == 0:
        return 0.0, 0.0
    model.eval()
    forward = predict or model
    loss_sum, correct = torch.zeros((), device=x.device), torch.zeros((), device=x.device)
    positive = []
    for xb, yb in batches(x, y, batch_size, None):
        logits = forward(xb)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum")
        correct += (logits.argmax(dim=1) == yb).sum()
        if extra is not None and logits.shape[1] == 2:
            positive.append(F.softmax(logits, dim=1)[:, 1].cpu())
    n = y.shape[0]
    labels = y.cpu().numpy() if positive else None  # only for AUC: no copy otherwise
    if labels is not None and len(set(labels.tolist())) == 2:
        extra["auc"] = roc_auc(labels, torch.cat(positive).numpy())
    return float(loss_sum) / n, float(correct) / n


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` for labels 0/1, ties averaged: sklearn's ``roc_auc_score``,
    as the Mann-Whitney U of the scores' ranks. Not sklearn's call itself: its input
    checks cost many times the ranking on a small test split, every client every
    round (tests/test_cohort.py checks the two agree)."""
    ranks = rankdata(scores)  # ties get their average rank, as sklearn's trapezoids count
    positive = labels == 1
    n_pos = int(positive.sum())
    n_neg = labels.shape[0] - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
