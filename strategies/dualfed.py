"""DualFed's aggregation: the plain (unweighted) mean of the shared tensors, i.e.
the encoder (with its BN affine) and the global classifier."""

from __future__ import annotations

from strategies.base import PFLStrategy


class DualFedStrategy(PFLStrategy):
    """Every client counts the same (the reference averages models unweighted)."""

    default_aggregation = "mean"
