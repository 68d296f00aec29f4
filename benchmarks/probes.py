"""Probes: numbers computed from a finished run's results.json and what the run's
config implies (never by reaching into a strategy). Each returns a flat dict that
the runner stores as ``results["probe"]`` and the report can tabulate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def fedfac_recovery(results: dict[str, Any], clients: int) -> dict[str, float]:
    """FedFac's simulation study (paper Sec. 4.3): the share of hidden neurons whose
    final shared/personal label equals the generating teacher's."""
    from methods import parse_run_config
    from pflower.data import simulation_study

    masks = results["rounds"][-1].get("fa_shared_mask") or {}
    if len(masks) != 1:
        raise ValueError(f"the recovery probe needs one split layer, got {list(masks)}")
    (mask,) = masks.values()
    truth = simulation_study(parse_run_config(results["config"]), clients).shared_neurons
    return {"index_recovery": float((np.asarray(mask, bool) == truth).mean())}


def linear_probe(results: dict[str, Any], clients: int) -> dict[str, float]:
    """How much a linear head can read from the final shared encoder: per client, a
    fresh linear head on z = features(x) (frozen, eval mode) trained on the client's
    training data (20 epochs, SGD lr 0.1, momentum 0.9, batch 64), scored on its test
    data; the mean over clients. For DualFed: what h_s could reach (docs/dualfed.md)."""
    import torch

    from client_app.train import evaluate, train_epochs
    from methods import get_method, parse_run_config
    from pflower.data import data_info, load_client_data
    from strategies.checkpoint import SERVER_STATE, load_server_state

    cfg = parse_run_config(results["config"])
    info = data_info(cfg)
    model = get_method(cfg.method).build_model(cfg, info)
    _, arrays = load_server_state(Path(cfg.output_dir) / cfg.run_name / SERVER_STATE, cfg.method)
    encoder = {
        k.removeprefix("global/"): torch.from_numpy(v)
        for k, v in arrays.items()
        if k.startswith("global/features.")
    }
    model.load_state_dict({**model.state_dict(), **encoder})
    model.eval()
    probe_cfg = cfg.model_copy(
        update={
            "lr": 0.1,
            "momentum": 0.9,
            "weight_decay": 0.0,
            "batch_size": 64,
            "optimizer": "sgd",
        }
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    accuracies = []
    for pid in range(clients):
        data = load_client_data(cfg, pid, clients)
        with torch.no_grad():
            z, z_test = model.features(data.x_train), model.features(data.x_test)
        head = torch.nn.Linear(z.shape[1], info.num_classes)
        train_epochs(head, list(head.parameters()), z, data.y_train, 20, probe_cfg, generator)
        accuracies.append(evaluate(head, z_test, data.y_test)[1])
    return {"linear_probe_accuracy": float(np.mean(accuracies))}


PROBES: dict[str, Callable[[dict[str, Any], int], dict[str, float]]] = {
    "fedfac-recovery": fedfac_recovery,
    "linear-probe": linear_probe,
}
