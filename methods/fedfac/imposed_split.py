"""FedFac's imposed splits (``fedfac.fa-split`` = true | oracle | random): the
simulation study's references, fixed from round 1 instead of factor analysis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from methods.fedfac import FedFacParams
from methods.fedfac.factor_analysis import shared_elements

if TYPE_CHECKING:
    from methods.fedfac.strategy import FedFacStrategy


def imposed_split(
    strategy: FedFacStrategy, num_clients: int, held_out: set[str]
) -> dict[str, np.ndarray]:
    """``fa-split`` = true | oracle | random: a split imposed from round 1, for a
    federation of ``num_clients`` of which ``held_out`` never train."""
    cfg = strategy.cfg
    if FedFacParams.of(cfg).fa_split == "random":
        rng = np.random.default_rng(cfg.seed + 7)
        out = {}
        for layer, size in strategy.sizes.items():
            mask = np.zeros(size, dtype=bool)
            mask[
                rng.permutation(size)[: int(round((1 - FedFacParams.of(cfg).fa_quantile) * size))]
            ] = True
            out[layer] = mask
        return out
    from pflower.data import simulation_study

    if cfg.dataset != "synthetic" or list(strategy.sizes.values()) != [cfg.hidden_dim]:
        raise ValueError(
            f"fedfac.fa-split={FedFacParams.of(cfg).fa_split} needs the simulation study: "
            "dataset=synthetic, an MLP and fedfac.fa-layers naming its hidden layer only"
        )
    study = simulation_study(cfg, num_clients, teachers=True)
    layer = next(iter(strategy.sizes))
    if FedFacParams.of(cfg).fa_split == "true":
        return {layer: study.shared_neurons.copy()}
    # oracle: FA on the teacher's true incoming weights of the training clients
    trained = [w for i, w in enumerate(study.teacher_weights) if f"client-{i}" not in held_out]
    fit = strategy.factor_analysis(trained)
    return {layer: shared_elements(fit.communalities, FedFacParams.of(cfg).fa_quantile)}
