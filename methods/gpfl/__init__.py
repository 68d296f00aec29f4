"""GPFL (Zhang, Hua, Wang, Song, Xue, Ma, Cao and Guan, ICCV 2023, "GPFL:
Simultaneously Learning Global and Personalized Feature Information for Personalized
Federated Learning"; docs/gpfl.md): after the feature extractor, a Conditional Valve
(CoV) turns each feature f into a global feature f_G = relu((gamma + 1) f + beta) and a
personalised one f_P = relu((gamma_i + 1) f + beta_i), its (gamma, beta) generated from
a global conditional input g and (gamma_i, beta_i) from a personalised one p_i. A
Global Category Embedding layer (GCE, one embedding per class) guides f_G; the
personal head classifies f_P.

Split: the head and the two conditional inputs stay home; the extractor, the CoV and
the GCE travel. Schedule: each batch, cross-entropy of head(f_P) + the angle-level
loss (softmax over the cosines of f_G to the GCE's embeddings) + ``gpfl.lambda`` x the
magnitude-level loss ||f_G - C^[y]||_2 (C^ the received GCE, frozen) + ``gpfl.mu`` x
the L2 penalty on the CoV and the GCE (SGD's weight decay). Aggregation: FedAvg's
sample-weighted mean of the shared parts. Evaluation: head(f_P).

``gpfl.variant='pfllib'`` runs PFLlib's reading (docs/gpfl.md lists where it differs).
The schedule is the paper's: batch 10, one local epoch, SGD at lr 0.005 (0.1 on
ResNet-18).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from methods import Method
from pflower.config.defaults import PFLLIB_SCHEDULE
from pflower.config.params import MethodParams, check_proximal_pull
from pflower.config.schema import RunConfig

# the authors' run_me.sh (TsingZ0/GPFL, system/run_me.sh:1-2): lambda, mu per backbone
CNN_LAMBDA, CNN_MU = 0.01, 0.1  # 4-layer CNN and 3-layer MLP
RESNET_LAMBDA, RESNET_MU = 1e-4, 0.0  # ResNet-18 and fastText


def is_resnet18(raw: dict[str, Any]) -> bool:
    """The paper's large backbone; the smaller ResNets take its CNN's values."""
    return raw.get("model") == "resnet18"


class GpflParams(MethodParams):
    namespace: ClassVar[str] = "gpfl"
    auto_keys: ClassVar[tuple[str, ...]] = ("lambda", "mu", "variant")
    # PFLlib: -lam 1.0 (main.py:447), -mu 0.0 (main.py:449) and its reading (docs/gpfl.md)
    profile_keys: ClassVar[dict[str, dict[str, Any]]] = {
        "pfllib": {"lambda": 1.0, "mu": 0.0, "variant": "pfllib"}
    }

    # the magnitude-level loss's weight; auto: the authors' per backbone (0.01; 1e-4 ResNet-18)
    lam: float = Field(CNN_LAMBDA, alias="lambda", ge=0)
    # the L2 penalty on the CoV and the GCE; auto: the authors' (0.1; 0 on ResNet-18)
    mu: float = Field(CNN_MU, alias="mu", ge=0)
    # 'paper': ||f_G - C^[y]||_2 per sample, averaged; g and p_i from the received GCE.
    # 'pfllib': the norm over the whole batch; g and p_i from the client's own GCE after
    # its training (zeros before its first)
    variant: Literal["paper", "pfllib"] = Field("paper", alias="variant")

    @classmethod
    def auto(cls, raw: dict[str, Any]) -> dict[str, Any]:
        resnet = is_resnet18(raw)
        return {
            "lambda": RESNET_LAMBDA if resnet else CNN_LAMBDA,
            "mu": RESNET_MU if resnet else CNN_MU,
        }

    def check(self, cfg: RunConfig) -> None:
        # mu/2 ||theta||^2 on the CoV and the GCE is a quadratic of curvature mu
        check_proximal_pull("gpfl.mu", self.mu, cfg)


def paper_schedule(raw: dict[str, Any]) -> dict[str, Any]:
    """The paper's (Sec. 4.1): batch 10, one local epoch, lr 0.005 for the 4-layer CNN
    and the MLP, 0.1 for ResNet-18 (PFLlib's defaults otherwise: its authors wrote it)."""
    return {**PFLLIB_SCHEDULE, "lr": 0.1 if is_resnet18(raw) else PFLLIB_SCHEDULE["lr"]}


METHODS = (
    Method(
        "gpfl",
        params=GpflParams,
        schedule=paper_schedule,
        pfllib="GPFL",
    ),
)
