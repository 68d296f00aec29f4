"""pfl-research (Apple's ``pfl``) running the workload of one benchmark cell, in its
own virtual environment (``pfl_python`` below makes it): ``.venv-pfl/bin/python -m
benchmarks.pfl_peer CELL_DIR``.

The cell's process wrote ``pfl-input.npz`` (every client's train and test arrays, as
our data loader partitions them), ``pfl-init.pt`` (the model's initial weights, as our
engines build them) and ``pfl-spec.json`` (model, rounds, cohort, local schedule).
This script trains FedAvg with pfl's simulated backend on exactly that, then scores
the final model on every client's test split with a plain loop (outside pfl's
timing), and writes ``results.json`` in the shape of a run's, so the report tables
it beside our engines. Nothing of the product runs here but the backbone's class.

The environment (``.venv-pfl``, beside ``.venv``): pfl's pins differ from ours, so it
is its own, made on first use. It sees the product's environment underneath (a
``.pth`` file): pfl and its own dependencies are installed into ``.venv-pfl`` and win;
torch and numpy come from ours, so both frameworks run the very same torch build.
``pip`` needs the package index once (offline: a clear error, and the rows of
pfl-research are marked failed).
"""

from __future__ import annotations

import argparse
import json
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PFL_VERSION = "0.6.0"
# this module also runs inside pfl's environment, so it imports nothing of ours here
VENV = Path(__file__).resolve().parents[1] / ".venv-pfl"


def pfl_python() -> Path:
    """The environment's interpreter, made (venv, ``.pth``, ``pip install``) if missing."""
    return peer_python(VENV, [f"pfl[pytorch]=={PFL_VERSION}"], f"pfl-research {PFL_VERSION}")


def peer_python(venv: Path, packages: list[str], what: str) -> Path:
    """A peer framework's interpreter in ``venv``, made if missing: a venv that sees
    ours underneath (a ``.pth``: the same torch and numpy), ``packages`` installed into
    it (they win); ``what`` names the peer in the error when the package index is out
    of reach (benchmarks/pfllib_peer.py makes PFLlib's the same way)."""
    python = venv / "bin" / "python"
    ready = venv / ".installed"
    if ready.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    target = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(target) / "_product_venv.pth").write_text(site.getsitepackages()[0] + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", *packages]
    done = subprocess.run(pip, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"installing {what} into {venv} failed (it needs the package index once): "
            f"{done.stderr.strip()[-400:]}"
        )
    ready.touch()
    return python


def main(cell_dir: Path) -> None:
    import torch
    import torch.nn.functional as F
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Weighted
    from pfl.model.pytorch import PyTorchModel

    from models.backbones import build_backbone

    spec = json.loads((cell_dir / "pfl-spec.json").read_text())
    arrays = np.load(cell_dir / "pfl-input.npz")
    n = spec["clients"]
    train = {str(i): [arrays[f"x_train_{i}"], arrays[f"y_train_{i}"]] for i in range(n)}
    test = {str(i): [arrays[f"x_test_{i}"], arrays[f"y_test_{i}"]] for i in range(n)}

    class Classifier(torch.nn.Module):
        """The same backbone, with the ``loss`` and ``metrics`` pfl asks of a model."""

        def __init__(self) -> None:
            super().__init__()
            self.net = build_backbone(
                spec["model"], tuple(spec["input_shape"]), spec["num_classes"], spec["hidden_dim"]
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
            self.eval() if eval else self.train()
            return F.cross_entropy(self(x), y.long())

        @torch.no_grad()
        def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> dict:
            self.eval() if eval else self.train()
            out = self(x)
            n = len(y)
            loss = float(F.cross_entropy(out, y.long(), reduction="sum"))
            correct = float((out.argmax(1) == y.long()).sum())
            return {"loss": Weighted(loss, n), "accuracy": Weighted(correct, n)}

    torch.manual_seed(spec["seed"])
    module = Classifier()
    module.net.load_state_dict(torch.load(cell_dir / "pfl-init.pt"))
    model = PyTorchModel(
        model=module,
        local_optimizer_create=lambda params, lr: torch.optim.SGD(
            params, lr=lr, momentum=spec["momentum"]
        ),
        central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0),  # FedAvg
    )

    def federated(data: dict[str, list[np.ndarray]]) -> FederatedDataset:
        return FederatedDataset.from_slices(data, get_user_sampler("minimize_reuse", sorted(data)))

    backend = SimulatedBackend(
        training_data=federated(train),
        val_data=federated(test),
        postprocessors=[WeightByDatapoints()],  # as Flower's FedAvg: weighted by samples
    )

    class Timer(TrainingProcessCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_train_begin(self, *, model: Any) -> Any:
            self.marks.append(time.perf_counter())
            return super().on_train_begin(model=model)

        def after_central_iteration(
            self, aggregate_metrics: Any, model: Any, *, central_iteration: int
        ) -> Any:
            self.marks.append(time.perf_counter())
            # a round's mark, as our runs write one (benchmarks/machine.py watches it);
            # the last round's results.json below replaces it
            done = {"rounds": [{} for _ in self.marks[1:]]}
            (cell_dir / "results.json").write_text(json.dumps(done))
            return False, type(aggregate_metrics)()

    timer = Timer()
    rounds, cohort = spec["rounds"], spec["cohort"]
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds,
            # pfl scores its first cohort before and after training (iteration 0, in
            # round 1, which the report leaves out); no evaluation after that
            evaluation_frequency=rounds + 1,
            train_cohort_size=cohort,
            val_cohort_size=None,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=spec["local_epochs"],
            local_learning_rate=spec["lr"],
            local_batch_size=spec["batch_size"],
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=256),
        callbacks=[timer],
    )
    t_eval = time.perf_counter()
    accs, correct, total = {}, 0.0, 0
    module.eval()
    with torch.no_grad():
        for key, (x, y) in test.items():
            right = float((module(torch.as_tensor(x)).argmax(1) == torch.as_tensor(y)).sum())
            accs[f"client-{key}"] = right / len(y)
            correct, total = correct + right, total + len(y)
    closing = time.perf_counter() - t_eval
    seconds = list(np.diff(timer.marks))
    final = float(np.mean(list(accs.values())))
    records = [
        {"round": r + 1, "accuracy_mean": float("nan"), "accuracy_pooled": float("nan")}
        for r in range(rounds)
    ]
    for record, s in zip(records, seconds):
        record.update(seconds=float(s), replies=cohort, bytes_up=0, bytes_down=0)
    records[-1].update(
        accuracy_mean=final, accuracy_pooled=correct / total, per_client_accuracy=accs
    )
    res = {
        "method": "fedavg",
        "engine": "pfl-research " + spec["pfl_version"],
        "config": spec["config"],
        "rounds": records,
        "best_accuracy_mean": final,
        "final_accuracy_mean": final,
        "best_accuracy_pooled": correct / total,
        "final_accuracy_pooled": correct / total,
        "closing_evaluation_seconds": closing,
        "federation_size": n,
        "total_bytes_up": 0,
        "total_bytes_down": 0,
        "total_seconds": float(timer.marks[-1] - timer.marks[0]),
    }
    (cell_dir / "results.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pfl_peer", description=__doc__)
    parser.add_argument("cell_dir", type=Path, help="the cell's folder (the runner's)")
    main(parser.parse_args().cell_dir)
