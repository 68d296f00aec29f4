"""Which device a client trains on: the one it asks for, else CUDA when it has one.

A simulated client's GPU is Ray's to give. Ray 2.x hides the GPUs from an actor it
gave none (``CUDA_VISIBLE_DEVICES=""``) and warns, with a FutureWarning on every run,
that it will stop doing so. The client does not lean on the variable: in a Ray
worker it takes CUDA only when Ray gave it a GPU (``ray.get_gpu_ids()``), and Ray is
told to behave as it will (``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0``, set before the
simulation starts Ray: the ClientApp is loaded first), which ends the warning at its
cause. A value the user sets is kept.
"""

from __future__ import annotations

import os
import sys

import torch

RAY_OVERRIDE_ON_ZERO = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"


def before_ray_starts() -> None:
    """Ray's coming behaviour now: no GPU variable set for an actor given no GPU."""
    os.environ.setdefault(RAY_OVERRIDE_ON_ZERO, "0")


def ray_gave_no_gpu() -> bool:
    """Whether this process is a Ray worker that Ray gave no GPU."""
    ray = sys.modules.get("ray")  # never imported here: a deployed client has no Ray
    if ray is None or not ray.is_initialized():
        return False
    if ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
        return False  # the driver (the simulation's own process)
    return not ray.get_gpu_ids()


def pick_device(requested: str = "") -> torch.device:
    """The node's device: ``requested`` if given, else CUDA when available (in a Ray
    actor: when Ray gave it a GPU)."""
    if requested:
        return torch.device(requested)
    cuda = torch.cuda.is_available() and not ray_gave_no_gpu()
    return torch.device("cuda" if cuda else "cpu")
