"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang and Zhang, AAAI 2022, "FedProto:
Federated Prototype Learning across Heterogeneous Clients"; docs/fedproto.md): clients
share class prototypes, never model weights. A class's prototype is the mean of its
samples' embeddings (the backbone's features, the input of its head).

Split: the whole model (``features.*``, ``head.*``) stays home; two buffers travel,
``proto_sums`` (classes x feature dim: a class's sample count times its prototype)
and ``proto_counts`` (classes: the sample counts). Schedule: ``local-epochs`` on
cross-entropy plus ``fedproto.lambda`` times the MSE between each sample's embedding
and its class's global prototype (a class with none adds nothing); the local
prototypes are the means of the embeddings of the training batches. Aggregation: an
equal-weight mean of both buffers (``aggregation="mean"``); a client divides the mean
of the sums by the mean of the counts, which is the count-weighted mean prototype of
each class (a class whose mean count is 0 has no global prototype). Prediction: the
nearest global prototype (``fedproto.predict``).

Privacy: the mean is a sum divided by the number of replies, so SecAgg+ carries it
(the server sees only the round's sums of ``proto_sums`` and ``proto_counts``), with
``secagg-clipping-range`` above the largest count and sum a site sends (SecAgg+ clips
each value to it; the default 8 is below most class counts). DP
does not fit it as it stands: the DP path treats the upload as an update of the last
global buffers, clips ``upload - received`` over both buffers together and adds
noise to every value, counts included, so the client's division of a noisy sum by a
noisy (possibly near zero or negative) count is biased and unstable (docs/fedproto.md).
The robust bounds (``update-norm-bound``, the direction check) rescale or project an
upload around the last global buffers as well: ``update-norm-bound=0`` and
``direction-check-from=0`` give the exact count-weighted mean. Without SecAgg+ the
server reads each site's class prototypes and class counts: the card declares them
(``class-prototypes``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from methods.baselines import baseline_schedule
from pflower.config.params import MethodParams
from pflower.config.schema import RunConfig
from pflower.privacy.disclosure import Disclosure, DisclosureKind

SHARED = ("proto_sums", "proto_counts")


class FedProtoParams(MethodParams):
    namespace: ClassVar[str] = "fedproto"
    auto_keys: ClassVar[tuple[str, ...]] = ("lambda", "weighting")
    # PFLlib: -lam 1.0 (main.py:447); its server averages the clients' prototypes with
    # equal weights (serverproto.py:125-138), the paper by sample count
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {
        "pfllib": {"lambda": 1.0, "weighting": "clients"}
    }

    # the weight of the prototype regulariser (the paper's lambda; PFLlib's -lam)
    lam: float = Field(1.0, alias="lambda", ge=0)
    # 'samples': a class's global prototype weighs each client's by its sample count of
    # the class (the paper); 'clients': equally, over the clients holding it (PFLlib)
    weighting: Literal["samples", "clients"] = Field("samples", alias="weighting")
    # 'prototype': the nearest global prototype (the paper's and PFLlib's evaluation);
    # 'head': the client's own head
    predict: Literal["prototype", "head"] = Field("prototype", alias="predict")

    def check(self, cfg: RunConfig) -> None:
        # the global prototype is mean(sums) / mean(counts): only a plain mean of both
        if cfg.aggregation not in ("default", "mean"):
            raise ValueError(
                f"config key 'aggregation': FedProto's global prototypes are the mean of "
                f"the prototype sums over the mean of the counts, got '{cfg.aggregation}' "
                "(a weighted or robust rule breaks that ratio): use 'default' or 'mean'"
            )


CLASS_PROTOTYPES = DisclosureKind(
    "class-prototypes",
    "the site's class prototypes (the mean embedding of each class's training samples "
    "under its own model) and its number of training samples in each class, sent as "
    "proto_sums and proto_counts in place of model weights",
)


def fedproto_disclosures(cfg: RunConfig) -> tuple[Disclosure, ...]:
    """The local prototypes and class counts; under SecAgg+ only the round's sums."""
    return (
        Disclosure(
            CLASS_PROTOTYPES,
            SHARED,
            "method='fedproto'",
            audited=not cfg.secure_aggregation,
        ),
    )


METHODS = (
    Method(
        "fedproto",
        aggregation="mean",  # mean(sums) / mean(counts): the count-weighted prototype
        params=FedProtoParams,
        pfllib="FedProto",
        schedule=baseline_schedule,
        disclosures=fedproto_disclosures,
        disclosure_kinds=(CLASS_PROTOTYPES,),
        bounds_updates=False,  # sums and counts, not a model: no norm bound or direction check
    ),
)
