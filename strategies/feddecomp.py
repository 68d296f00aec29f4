"""FedDecomp's aggregation."""

from __future__ import annotations

from strategies.base import PFLStrategy


class FedDecompStrategy(PFLStrategy):
    """sigma_bar = plain mean over the participating clients (paper eq. 7);
    ``aggregation = weighted`` gives the sample-weighted mean. The base's
    ``aggregate`` implements both; this class only changes the default."""

    default_aggregation = "mean"
