"""FedFac's aggregation (paper Sections 3-4): per-element split of the layers in
Lambda by factor analysis, sample-weighted mean of the shared elements only.

Static: the first round uploads every element of the Lambda layers, the server
runs FA once and fixes the split; later rounds upload only the shared elements.
Dynamic: every round uploads every element of the Lambda layers, FA runs on that
round's uploads and decides which elements are averaged. Personal elements of
the global arrays are not written in a round. ``fedfac.fa-split`` = true | oracle
| random imposes a fixed split instead (simulation study). The split is a row-level
split of the roles (``Roles.rows``), and the wire (``FedFacWire``) is of one split:
a new split is a new wire. It travels at the head of every payload, and once it
exists the payload carries only the shared rows of each Lambda layer (the personal
rows' global values are never used by a client).

``fedfac.fa-input=updates``: FA runs on each Lambda weight's change over the round from
what the client started from: the global rows where they were shared, the
client's own rows where they were personal; clients upload the start values of
those personal rows after the shared tensors (the server knows the rest).

New clients (paper Section 3.2, new_clients.py): the last ``fedfac.new-clients`` partitions
(``client-<i>``) or, in a deployment, the sites named in ``fedfac.new-client-sites``
never train. LocalTrain: shared params in, personal elements trained locally
and kept. Ensemble (needs ``fedfac.ensemble-share-models=true``: the sites agree to
disclose their personalised models to the new clients): in the final round the
trained clients send their personalised models (a fit reply), the server passes
them to each new client, which averages their predictions on its own test split.
No input, label or prediction travels.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import numpy as np
from flwr.common import Parameters, Scalar
from threadpoolctl import threadpool_limits
from torch import nn

from methods.fedfac import FedFacParams, new_clients
from methods.fedfac.factor_analysis import (
    FactorResult,
    layer_matrix,
    principal_factors,
    principal_factors_torch,
    server_device,
    shared_elements,
    site_median_correlation,
)
from methods.fedfac.imposed_split import imposed_split
from methods.fedfac.model import HELD_OUT, FedFacWire
from models.roles import wire_spec
from pflower.config.schema import RunConfig
from strategies.base import PFLStrategy, Reply

log = logging.getLogger("flwr.pflower")


class FedFacStrategy(PFLStrategy):
    """Element-level shared/personal split of the Lambda layers, by FA."""

    wire: FedFacWire

    def __init__(self, cfg: RunConfig, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(cfg=cfg, model=model, **kwargs)
        self.model_spec = wire_spec(model, list(model.state_dict()))  # Ensemble's shared models
        self._communalities: dict[str, np.ndarray] = {}  # fa-smoothing's running average
        self.bystanders: new_clients.NewClients = new_clients.NewClients(self)
        self.fa_device = server_device()  # None: numpy (factor_analysis.server_device)
        self.split_imposed = False  # fa-split true | oracle | random, tau inf: set once known

    @property
    def shared(self) -> dict[str, np.ndarray] | None:
        """The split: layer -> True where the element is shared; None before FA."""
        return self.wire.shared

    @property
    def sizes(self) -> dict[str, int]:
        return self.wire.sizes

    # ---- the split --------------------------------------------------------------------------

    def factor_analysis(self, per_client: list[np.ndarray]) -> FactorResult:
        # on the server's GPU when it has one (torch, float64: the same communalities
        # to float64 rounding); else numpy on one BLAS thread: the simulated clients
        # share the machine's cores. Iterated until Psi moves < 1e-4 or for 100 steps
        # (a wide layer takes seconds: it runs once a round, on the server)
        kappa = FedFacParams.of(self.cfg).fa_kappa
        device = self.fa_device
        fit = (
            principal_factors if device is None else partial(principal_factors_torch, device=device)
        )
        with threadpool_limits(1):
            if FedFacParams.of(self.cfg).fa_robust == "site-median" and len(per_client) > 1:
                r = site_median_correlation(per_client)
                return fit(np.zeros((1, 1)), kappa, tol=1e-4, max_iter=100, r=r)
            z = layer_matrix(per_client)
            return fit(z, kappa, tol=1e-4, max_iter=100)

    def run_fa(self, server_round: int, replies: list[Reply]) -> None:
        """FA per Lambda layer on this round's full uploads -> the new split."""
        new, factors = {}, {}
        for layer in self.sizes:
            i = self.wire.position[f"{layer}.weight"]
            per_client = [r.arrays[i].astype(np.float64) for r in replies]
            if FedFacParams.of(self.cfg).fa_input == "updates":
                per_client = [
                    w - start for w, start in zip(per_client, self.starts(layer, replies))
                ]
            fit = self.factor_analysis(per_client)
            new[layer] = shared_elements(
                self.smoothed(layer, fit.communalities), FedFacParams.of(self.cfg).fa_quantile
            )
            factors[layer] = fit.num_factors
        if self.shared is not None:
            changed = sum(int((new[k] != self.shared[k]).sum()) for k in new)
            self.note(server_round, fa_changed_fraction=changed / sum(self.sizes.values()))
        self.note(server_round, fa_num_factors=factors)
        self.set_split(new)

    def smoothed(self, layer: str, communalities: np.ndarray) -> np.ndarray:
        """``fa-smoothing`` = beta > 0: an exponential average of each element's
        communality over the rounds (dynamic FedFac), so that one noisy round does
        not flip an element between shared and personal (docs/fedfac.md measures
        the churn without it). beta = 0: this round's FA alone (the paper)."""
        beta = FedFacParams.of(self.cfg).fa_smoothing
        previous = self._communalities.get(layer)
        if beta > 0 and previous is not None:
            communalities = beta * previous + (1 - beta) * communalities
        self._communalities[layer] = communalities
        return communalities

    def set_split(self, shared: dict[str, np.ndarray] | None) -> None:
        """The wire of split ``shared`` from now on (the payload re-encoded with it)."""
        self.wire = self.payloads.wire = self.wire.with_split(shared)
        self.set_global(self.global_arrays)

    # ---- the checkpoint: the global tensors and the split -----------------------------------

    def server_state(self) -> dict[str, np.ndarray]:
        state = super().server_state()
        for layer, mask in (self.shared or {}).items():
            state[f"split/{layer}"] = mask
        return state

    def restore_server_state(self, arrays: dict[str, np.ndarray]) -> None:
        super().restore_server_state(arrays)
        split = {k.removeprefix("split/"): v for k, v in arrays.items() if k.startswith("split/")}
        if not split:
            return  # saved before the first FA
        for layer, size in self.sizes.items():
            mask = split.get(layer)
            if mask is None or mask.dtype != bool or mask.shape != (size,):
                raise ValueError(f"no {size}-element boolean split for layer '{layer}'")
        self.set_split({layer: split[layer] for layer in self.sizes})

    # ---- payloads: the wire carries the split; held-out clients are told so -----------------

    def starts(self, layer: str, replies: list[Reply]) -> list[np.ndarray]:
        """Each reply's start values of ``layer``'s weight: the global rows that were
        shared this round, the client's own uploaded rows that were personal."""
        i = self.wire.position[f"{layer}.weight"]
        if not self.wire.upload_start():
            return [self.global_arrays[i]] * len(replies)
        extra = list(self.sizes).index(layer)
        out = []
        for r in replies:
            start = self.global_arrays[i].astype(np.float64)
            start[~self.wire.shared[layer]] = self.wire.decode_up(r.arrays)[1][extra]
            out.append(start)
        return out

    def client_config(self, client_key: str | None, server_round: int) -> dict[str, Scalar]:
        held_out = self.bystanders.held_out
        return {HELD_OUT: ",".join(sorted(held_out))} if held_out else {}

    def payload_for(self, client_key: str | None, server_round: int) -> Parameters:
        """The payload; the first after ``NewClients.prepare`` has counted the federation
        fixes the split that factor analysis does not decide (``federation_known``)."""
        if not self.split_imposed and self.bystanders.num_clients:
            self.federation_known()
        return super().payload_for(client_key, server_round)

    def federation_known(self) -> None:
        """The split imposed from round 1, once the federation's size and held-out
        clients are known: ``fedfac.fa-split`` true | oracle | random, or every element
        personal (tau infinite)."""
        self.split_imposed = True
        new = self.bystanders
        if FedFacParams.of(self.cfg).fa_split != "fa":
            self.set_split(imposed_split(self, new.num_clients, new.held_out))
        elif self.fa_decides_nothing:
            self.set_split(
                {layer: np.zeros(size, dtype=bool) for layer, size in self.sizes.items()}
            )

    @property
    def fa_decides_nothing(self) -> bool:
        """``fedfac.tau='inf'`` (the authors' scripts): no communality reaches tau."""
        return FedFacParams.of(self.cfg).tau == "inf"

    # ---- aggregation ------------------------------------------------------------------------

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        # this round's uploads carry every Lambda row (dynamic: every round; static:
        # until the split is fixed); FA below changes the wire's split, so read it first
        full_upload = self.wire.full_upload()
        if (
            full_upload
            and FedFacParams.of(self.cfg).fa_split == "fa"
            and not self.fa_decides_nothing
        ):
            self.run_fa(server_round, replies)
        assert self.shared is not None
        if self.aggregation == "mean":
            weights = np.ones(len(replies))
        else:
            weights = np.array([float(r.num_examples) for r in replies])
        weights = weights / weights.sum()
        out = []
        for i, current in enumerate(self.global_arrays):
            layer = self.wire.layer_of.get(self.spec[i].name)
            if layer is None:
                parts = [r.arrays[i] for r in replies]
            else:
                mask = self.shared[layer]
                parts = [r.arrays[i][mask] if full_upload else r.arrays[i] for r in replies]
            mean = sum(w * p.astype(np.float64) for w, p in zip(weights, parts))
            if layer is None:
                out.append(mean.astype(current.dtype))
            else:
                new = current.copy()  # personal elements keep their global value
                new[self.shared[layer]] = mean.astype(current.dtype)
                out.append(new)
        self.set_global(out)
        total = sum(self.sizes.values())
        self.note(
            server_round,
            fa_shared_fraction=sum(int(m.sum()) for m in self.shared.values()) / total,
            fa_shared_mask={k: m.astype(int).tolist() for k, m in self.shared.items()},
        )


STRATEGIES = {"fedfac-static": FedFacStrategy, "fedfac-dynamic": FedFacStrategy}
