"""Test helpers: build a method's client and strategy without Flower's runtime."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import (
    Code,
    Context,
    FitRes,
    Parameters,
    RecordDict,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_proxy import ClientProxy

from client_app.app import pick_device
from client_app.base import PFLClient
from client_app.method_client import build_method_client
from client_app.state import ContextStore
from methods import get_method, parse_run_config
from pflower.config.schema import RunConfig
from pflower.data import data_info, load_client_data
from pflower.results import RunRecorder
from server_app.method_strategy import build_method_strategy
from strategies.base import PFLStrategy

SMALL = {"sim-samples": 120, "hidden-dim": 32, "sim-dim": 20}


class MemoryStore:
    """A PersonalStore in a dict, for clients built without Flower's runtime."""

    def __init__(self) -> None:
        self.state: dict[str, np.ndarray] | None = None

    def load(self, upto: int | None = None) -> dict[str, np.ndarray] | None:
        return self.state

    def save(
        self,
        arrays: dict[str, np.ndarray],
        server_round: int | None = None,
        checkpointed: int | None = None,
        writing: int | None = None,
    ) -> None:
        self.state = {k: v.copy() for k, v in arrays.items()}

    def set_aside(self, why: str) -> None:
        self.state = None


def local_superlink_env(home: Path) -> dict[str, str]:
    """The environment for a test's ``flwr run`` on the local simulation: its own
    FLWR_HOME, and free ports for the local SuperLink flwr starts (Flower reads them
    from these variables), not Flower's fixed 39091 / 39093, where the user's own may
    be running (the README's ``run`` leaves it up), or another test's."""
    from harness.loopback import free_ports

    http, control = free_ports(2)
    return {
        "FLWR_HOME": str(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
    }


def bare_flwr_env(home: Path) -> dict[str, str]:
    """This process's environment for a bare ``flwr run .`` as a user types it: the
    local SuperLink of ``local_superlink_env``, no per-run dependency install (offline),
    and this interpreter's bin/ first on PATH (flwr starts ``flower-superlink`` by name)."""
    return {
        **os.environ,
        **local_superlink_env(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def image_folder(
    root: Path, classes: Sequence[str] = ("a", "b"), per_class: int = 4, side: int = 16
) -> Path:
    """An image folder (one sub-folder a class, RGB PNGs of ``side`` pixels); each
    class its own mean brightness plus noise, so a model can learn them."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        level = 40 + 160 * k / max(1, len(classes) - 1)
        for i in range(per_class):
            pixels = np.clip(rng.normal(level, 30, (side, side, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


# the generator's paper-study setting (its defaults before the main job's): the tests
# of FedFac's split recovery were written for half the neurons shared
PAPER_STUDY = {"sim-samples": 400, "sim-shared-neurons": 0.5, "sim-shared-covariates": 0.4}


def raw_config(**overrides: Any) -> dict[str, Any]:
    """A raw run config: keyword names are common keys (``_`` for ``-``) or the
    method's own keys by field name (namespaced here: ``rank`` of Factorized-FL is
    ``factorized-fl.rank``); names with a dot are taken as they are."""
    params = get_method(str(overrides.get("method", "fedavg"))).params
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        field = params.model_fields.get(name)
        if "." in key:
            out[key] = value
        elif field is not None:
            out[f"{params.namespace}.{field.alias or name}"] = value
        else:
            out[key.replace("_", "-")] = value
    return out


def config(**overrides: Any) -> RunConfig:
    return parse_run_config({**SMALL, **raw_config(**overrides)})


def make_client(
    cfg: RunConfig, partition_id: int = 0, num_partitions: int = 4, context: Context | None = None
) -> tuple[PFLClient, Context]:
    method = get_method(cfg.method)
    model = method.build_model(cfg, data_info(cfg))
    context = context or Context(0, partition_id, {}, RecordDict(), {})
    data = load_client_data(cfg, partition_id, num_partitions)
    client = build_method_client(
        method,
        model,
        data,
        cfg,
        ContextStore(context),
        pick_device("cpu"),
        f"client-{partition_id}",
    )
    return client, context


def make_strategy(cfg: RunConfig, recorder: RunRecorder | None = None) -> PFLStrategy:
    method = get_method(cfg.method)
    return build_method_strategy(method, cfg, method.build_model(cfg, data_info(cfg)), recorder)


class FakeProxy(ClientProxy):
    """A client proxy that is never called (the strategy only reads node_id)."""

    def __init__(self, node_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id

    def get_properties(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def get_parameters(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def fit(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def evaluate(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def reconnect(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def fit_res(
    arrays: list[np.ndarray] | Parameters,
    key: str,
    num_examples: int = 10,
    metrics: dict[str, Any] | None = None,
) -> FitRes:
    params = arrays if isinstance(arrays, Parameters) else ndarrays_to_parameters(arrays)
    return FitRes(Status(Code.OK, ""), params, num_examples, {"client-key": key, **(metrics or {})})


def short_federation(method: str, out: Path, clients: int = 3) -> dict[str, Any]:
    """Two in-process rounds of ``method`` on the small generated study; asserts that
    both rounds ran and scored every client, and returns the results."""
    from pflower.engine.inprocess import run_inprocess

    raw = {"method": method, "num-server-rounds": 2, "sim-samples": 60, "hidden-dim": 16}
    res = run_inprocess({**raw, "output-dir": str(out), "run-name": method}, clients)
    assert [r["round"] for r in res["rounds"]] == [1, 2]
    everyone = [f"client-{i}" for i in range(clients)]
    assert sorted(res["rounds"][-1]["per_client_accuracy"]) == everyone
    return res


def update_norm(upload: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """L2 norm of ``upload - reference`` over the float tensors whose shapes match, in
    float64 (numpy's, a reference for the server's compiled norms)."""
    total = 0.0
    for u, r in zip(upload, reference):
        if u.dtype.kind == "f" and u.shape == r.shape:
            total += float(np.sum((u.astype(np.float64) - r) ** 2))
    return float(np.sqrt(total))


def assert_only_the_global_copy_travels(cfg: RunConfig) -> tuple[Any, set[str]]:
    """A method that keeps a global copy beside personal parts (APFL, pFedMe): only
    ``global_model.*`` is in the strategy's spec, and a client's fit uploads that copy
    exactly, which the strategy accepts. The client and its personal entries."""
    client, _ = make_client(cfg)
    strategy = make_strategy(cfg)
    assert all(s.name.startswith("global_model.") for s in strategy.spec)
    payload = parameters_to_ndarrays(strategy.global_payload())
    upload, n, _ = client.fit(payload, {"server-round": 1})
    glob = client.model.global_model.state_dict()
    assert len(upload) == len(glob) == len(client.roles.shared)
    for sent, mine in zip(upload, glob.values()):
        np.testing.assert_array_equal(sent, mine.numpy())
    assert strategy.check_reply(client.client_key, upload, n) is None
    return client, set(client.roles.personal)
