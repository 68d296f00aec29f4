"""DualFed's local schedule and its three-way score.

Stage-wise (the paper's default): stage 1 trains encoder, projector and personal
classifier with CE(h_p(u)) + lambda * SupCon(u), the global classifier frozen
(``dualfed.personal-loss=combined``: the CE of the combined prediction instead, h_s
still frozen, as FedRoD trains its personal head on top of a generic one);
stage 2 trains only the global classifier (``dualfed.global-head-epochs`` at
``dualfed.global-head-lr``) with CE(h_s(z)) on z computed once
under no_grad with the encoder frozen (eval mode, so its BN statistics stay
untouched too). A fresh optimizer per stage. ``dualfed.schedule=simultaneous`` trains
every parameter on the sum of both stages' losses for ``local-epochs``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from flwr.common import Scalar
from pytorch_metric_learning.losses import SupConLoss
from torch import nn

from client_app.base import PFLClient
from client_app.train import evaluate, train_epochs
from methods.dualfed import DualFedParams
from methods.dualfed.model import DualFedModel


def supcon_loss(temperature: float) -> SupConLoss:
    """Single-view supervised contrastive loss (Khosla et al.; DualFed eq. 7).

    pytorch-metric-learning's SupConLoss is that loss: cosine similarity (u is
    L2-normalised), positives = other samples of the anchor's class, denominator =
    every sample but the anchor, averaged over anchors that have a positive.
    Called as ``loss(u, labels)``.
    """
    return SupConLoss(temperature=temperature)


@torch.no_grad()
def encode(model: DualFedModel, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """z = f(x) in eval mode, batched, without gradients."""
    was_training = model.features.training
    model.features.eval()
    try:
        return torch.cat(
            [model.features(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
        )
    finally:
        model.features.train(was_training)


def labels_skewed(counts: torch.Tensor, level: float = 0.05) -> bool:
    """Whether label counts differ from uniform by Pearson's chi-square test at ``level``
    (scipy's). IID draws from a balanced set pass (their deviations are sampling noise);
    a Dirichlet label skew fails by orders of magnitude."""
    from scipy.stats import chisquare

    if counts.numel() < 2 or float(counts.sum()) == 0:
        return False
    return bool(chisquare(counts.cpu().double().numpy()).pvalue < level)


class DualFedClient(PFLClient):
    """Stage-wise (or simultaneous) training of the dual-branch model."""

    model: DualFedModel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.supcon = supcon_loss(DualFedParams.of(self.cfg).supcon_temperature)
        # log of this client's training label frequencies (add-one smoothed), added to
        # h_s(z) in the combination (dual-global-prior); computed here, never sent
        counts = torch.bincount(self.y_train, minlength=self.model.head.out_features).float()
        mode = DualFedParams.of(self.cfg).global_prior
        use = mode == "client" or (mode == "client-if-skewed" and labels_skewed(counts))
        self.log_prior = ((counts + 1.0) / (counts + 1.0).sum()).log() if use else None

    def _main_params(self) -> list[nn.Parameter]:
        m = self.model
        return [*m.features.parameters(), *m.projector.parameters(), *m.personal_head.parameters()]

    def _losses(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(CE(h_p(u)) + lambda * SupCon(u), CE(h_s(z))) from one forward pass; with
        ``dualfed.personal-loss=combined`` the first CE is the combined prediction's."""
        z = model.features(x)
        u = model.projector(z)
        personal, glob = model.personal_head(u), model.head(z)
        if DualFedParams.of(self.cfg).personal_loss == "combined":
            ce = F.cross_entropy(self._combine(personal, glob), y)
        else:
            ce = F.cross_entropy(personal, y)
        return ce + DualFedParams.of(self.cfg).supcon_lambda * self.supcon(u, y), F.cross_entropy(
            glob, y
        )

    def _main_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Stage 1's loss (h_s is not among its parameters)."""
        if x.shape[0] < 2:  # BatchNorm1d cannot train on one sample: skip a 1-sample tail batch
            return model.personal_head.weight.sum() * 0.0
        return self._losses(model, x, y)[0]

    def stage1(self, generator: torch.Generator) -> float:
        """Encoder, projector and h_p for ``local-epochs``; h_s frozen."""
        m, cfg = self.model, self.cfg
        return train_epochs(
            m,
            self._main_params(),
            self.x_train,
            self.y_train,
            cfg.local_epochs,
            cfg,
            generator,
            self._main_loss,
        )

    def stage2(self, generator: torch.Generator) -> float:
        """h_s alone for ``global-head-epochs`` at ``global-head-lr`` on z = f(x)
        computed once, f frozen."""
        m, cfg = self.model, self.cfg
        z = encode(m, self.x_train)  # train_epochs over the head module sees z as its input
        head_cfg = cfg.model_copy(update={"lr": DualFedParams.of(cfg).global_head_lr})
        epochs = DualFedParams.of(cfg).global_head_epochs
        return train_epochs(
            m.head, list(m.head.parameters()), z, self.y_train, epochs, head_cfg, generator
        )

    def simultaneous(self, generator: torch.Generator) -> float:
        """Every parameter on stage 1's loss + CE(h_s(z))."""
        m, cfg = self.model, self.cfg

        def joint(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if x.shape[0] < 2:
                return model.personal_head.weight.sum() * 0.0
            main, global_head = self._losses(model, x, y)
            return main + global_head

        params = self._main_params() + list(m.head.parameters())
        return train_epochs(
            m, params, self.x_train, self.y_train, cfg.local_epochs, cfg, generator, joint
        )

    def local_train(self, config: dict[str, Scalar], generator: torch.Generator) -> dict[str, Any]:
        if DualFedParams.of(self.cfg).schedule == "simultaneous":
            return {"train-loss": self.simultaneous(generator)}
        main_loss = self.stage1(generator)  # each train_epochs call makes a fresh optimizer
        return {"train-loss": main_loss, "global-head-loss": self.stage2(generator)}

    def _combine(self, personal: torch.Tensor, glob: torch.Tensor) -> torch.Tensor:
        """The prediction from h_p(u) and h_s(z): the logits summed, or (``dual-combine=
        probabilities``) the two heads' softmax outputs, returned as log((p_p + p_s) / 2)
        so that cross-entropy and argmax apply unchanged; h_s(z) first moved to the
        client's label prior when ``dual-global-prior`` applies it."""
        if self.log_prior is not None:
            glob = glob + self.log_prior
        if DualFedParams.of(self.cfg).combine == "logits":
            return personal + glob
        return torch.log((F.softmax(personal, dim=1) + F.softmax(glob, dim=1)) / 2)

    def score(self) -> tuple[float, dict[str, Scalar]]:
        """The combined accuracy, each head's alone, the heads' logit scales (the mean
        L2 norm of their logit vectors: which head dominates a logit sum) and their
        confidence (the mean top softmax probability: how close their calls are)."""
        m = self.model
        m.eval()
        z = encode(m, self.x_test)
        with torch.no_grad():  # each head once; the scores below read these logits
            personal, glob = m.personal_logits(z), m.head(z)
            combined = self._combine(personal, glob)

        def score_of(
            logits: torch.Tensor, extra: dict[str, float] | None = None
        ) -> tuple[float, float]:
            return evaluate(m, logits, self.y_test, predict=lambda t: t, extra=extra)

        auc: dict[str, float] = {}
        loss, acc = score_of(combined, auc)
        metrics: dict[str, Scalar] = {
            **auc,
            "accuracy": acc,
            "accuracy-global": score_of(glob)[1],
            "accuracy-personal": score_of(personal)[1],
        }
        for name, logits in (("global", glob), ("personal", personal)):
            top = F.softmax(logits, dim=1).max(dim=1).values
            metrics[f"logit-norm-{name}"] = float(logits.norm(dim=1).mean()) if len(z) else 0.0
            metrics[f"confidence-{name}"] = float(top.mean()) if len(z) else 0.0
        return loss, metrics


CLIENTS = {"dualfed": DualFedClient}
