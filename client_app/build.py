"""Building a node's client for one message: every decision before the client is
made (its run config with the site's own columns, device, model, data, store,
weighting rule, what it may report), then one constructor call.

The ClientApp's message handling is client_app/app.py; it calls ``build_client``.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
from collections.abc import Callable
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import torch
from flwr.client import Client
from flwr.common import Context
from torch import nn

from client_app import timing
from client_app.attacks import Attacker, flip_labels
from client_app.base import ClientSetup, PFLClient
from client_app.codec import FastClient
from client_app.devices import pick_device
from client_app.errors import name_site
from client_app.method_client import build_method_client
from client_app.site_data import data_info_properties
from client_app.state import ContextStore, DiskStore, PersonalStore, RoundStore
from methods import disclosure_kinds, get_method, method_names, parse_run_config
from models.roles import reset_entries
from pflower.config.node import NodeConfig
from pflower.config.schema import RESUME_LATEST, ConfigError, RunConfig
from pflower.config.weighting import weighs_by_samples
from pflower.data import (
    check_site_data,
    class_fingerprint,
    data_info,
    decode_shared_data,
    load_client_data,
    run_class_names,
    site_class_names,
)
from pflower.data.sites import site_name as natural_site
from pflower.patches import hooks_left
from pflower.privacy.policy import PolicyError, SitePolicy
from pflower.store import PERSONAL_STATE_DIR, clients_that_train

log = logging.getLogger("flwr.pflower")

_TEMPLATE_LOCK = threading.Lock()


def _template(cfg: RunConfig, data_path: str, cache_dir: str) -> nn.Module:
    """The initial model, built once per process and copied per client. Locked: the
    build seeds torch's global generator, and clients built in threads at once (the
    server's class-list query) would otherwise interleave their draws."""
    with _TEMPLATE_LOCK:
        return _built_template(cfg, data_path, cache_dir)


@lru_cache(maxsize=4)
def _built_template(cfg: RunConfig, data_path: str, cache_dir: str) -> nn.Module:
    return get_method(cfg.method).build_model(cfg, data_info(cfg, data_path, cache_dir))


# A simulated client's model is its worker thread's resident copy of the template, put
# back to the template's values each message: a deep copy per message holds the GIL
# against the other worker's training (docs/results/client-cpu.md measured it).
# A method keeps its per-message state on its client, never on the model
# (docs/ADDING_A_METHOD.md); tests/test_scale.py checks every method trains the same
# numbers either way.
REUSE_MODELS = True
_resident = threading.local()
# resident copies whose thread has ended (Flower's round loop and the cohort start a
# thread pool each round): a new worker adopts one instead of a deep copy of its own
# (a large model's copy costs CPU every round: docs/results/client-cpu.md)
_orphans: list[tuple[threading.Thread, tuple[nn.Module, nn.Module, Any]]] = []
_orphans_lock = threading.Lock()
MOST_RESIDENT = 32  # resident copies kept for adoption (one a worker thread)


def _held() -> tuple[nn.Module, nn.Module, Any] | None:
    """This thread's resident (template, model, structure), or one a thread that has
    ended left behind."""
    held = getattr(_resident, "held", None)
    if held is not None:
        return held
    with _orphans_lock:
        for i, (owner, left) in enumerate(_orphans):
            if not owner.is_alive():
                del _orphans[i]
                _resident.held = left
                _orphans.append((threading.current_thread(), left))
                return left
    return None


def _structure(model: nn.Module) -> tuple[list[str], list[str]]:
    return [n for n, _ in model.named_parameters()], [n for n, _ in model.named_buffers()]


def client_model(
    template: nn.Module, reuse: bool, keep: frozenset[str] = frozenset()
) -> tuple[nn.Module, bool]:
    """The model a client trains, with the template's values, and whether it is the
    resident copy: a deep copy of the template, or (``reuse``) this thread's resident
    copy with the template's values, gradient flags and modes put back, but for the
    entries ``keep`` names (the client overwrites them before it reads them: its
    ``settle`` puts them back if it did not); a resident copy whose structure changed
    or that carries a hook is replaced by a fresh deep copy."""
    held = _held() if reuse else None
    if held is None or held[0] is not template or _structure(held[1]) != held[2]:
        return _fresh(template, reuse), False
    model = held[1]
    if hooks_left(model):
        return _fresh(template, reuse), False
    reset_entries(model, template, keep)
    with torch.no_grad():
        for mine, theirs in zip(model.parameters(), template.parameters(), strict=True):
            mine.requires_grad_(theirs.requires_grad)
            mine.grad = None
    for mine, theirs in zip(model.modules(), template.modules(), strict=True):
        mine.training = theirs.training
    return model, True


_received: dict[tuple[int, str], tuple[nn.Module, frozenset[str]]] = {}


def received_entries(template: nn.Module, cfg: RunConfig) -> frozenset[str]:
    """The entries a client of ``cfg``'s method overwrites with what it receives
    before it reads them (its shared tensors, on the base ``receive`` and wire; none
    for a method that receives otherwise): a resident model need not be put back to
    the template's values there first (a 45 MB copy a message on ResNet-18)."""
    key = (id(template), cfg.method)
    if _received.get(key, (None,))[0] is not template:
        from client_app.base import PFLClient
        from client_app.method_client import client_class
        from models.wire import Wire

        method = get_method(cfg.method)
        roles = method.roles(template, cfg)
        wire = method.build_wire(template, roles, cfg)
        plain = client_class(method).receive is PFLClient.receive
        plain = plain and type(wire).decode_down is Wire.decode_down
        if len(_received) >= 16:  # templates are few (_built_template keeps 4)
            _received.clear()
        _received[key] = (template, frozenset(roles.shared) if plain else frozenset())
    return _received[key][1]


def _fresh(template: nn.Module, reuse: bool) -> nn.Module:
    model = copy.deepcopy(template)
    if reuse:
        held = _resident.held = (template, model, _structure(template))
        with _orphans_lock:  # adopted by a later thread once this one has ended
            me = threading.current_thread()
            _orphans[:] = [(t, h) for t, h in _orphans if t is not me][-MOST_RESIDENT:]
            _orphans.append((me, held))
    return model


def experiment_id(cfg: RunConfig, model: nn.Module) -> str:
    """Names the on-disk personal state: a restarted client resumes its own. The
    run's name, or the method, the seed and a hash of the model's tensor names and
    shapes, so that two runs of different models never share a state file."""
    if cfg.run_name:
        return cfg.run_name
    shapes = ";".join(f"{k}:{tuple(v.shape)}" for k, v in model.state_dict().items())
    digest = hashlib.sha256(shapes.encode()).hexdigest()[:10]
    return f"{cfg.method}-seed{cfg.seed}-{digest}"


def data_cache_dir(node: Any) -> str:
    """Where a site keeps a copy of its decoded data: its state directory only when it
    asks (node config ``data-cache="disk"``, ``deploy.site --data-cache``; a cold
    ClientApp is a fresh process a message and would decode the data again), else
    nowhere ("")."""
    return NodeConfig.of(node).cache_dir


def build_client(context: Context, overrides: dict[str, Any] | None = None) -> Client:
    """Flower's Client of the node's NumPyClient: a method's client with the fewest
    copies (client_app/codec.py), another (the simulated attacker) as Flower wraps it."""
    client = build_numpy_client(context, overrides)
    return FastClient(client) if isinstance(client, PFLClient) else client.to_client()


def set_threads(node: NodeConfig, device: torch.device) -> None:
    """Torch's threads for this client: the node's ``torch-threads`` (the in-process
    engine: one client a thread); one for a simulated node without it (Ray actors
    share the machine's cores)."""
    if device.type == "cpu" and node.torch_threads > 0:
        torch.set_num_threads(node.torch_threads)
    elif device.type == "cpu" and torch.get_num_threads() > 1 and node.num_partitions is not None:
        torch.set_num_threads(1)


def build_numpy_client(context: Context, overrides: dict[str, Any] | None = None) -> Any:
    """The node's NumPyClient for one message: the method's client (a ``PFLClient``),
    or the simulated attacker around it."""
    node = NodeConfig.of(context.node_config)
    # the columns a site names for its own data replace the run's (client_app/site_data.py)
    run = {**context.run_config, **(overrides or {}), **node.site_data}
    cfg = parse_run_config({**run, **node.site_model})  # a site's own backbone over the run's
    timing.mark("config")
    partition_id = node.partition_id or 0
    num_partitions = node.num_partitions or 1
    data_path, cache_dir = node.data_path, node.cache_dir
    # a natural partition's client is named by its column's value (pflower/data/sites.py)
    site = node.site or natural_site(cfg, partition_id, data_path)
    name_site(site)
    device = pick_device(node.device)
    set_threads(node, device)
    method = get_method(cfg.method)
    simulated = not node.deployed_site and not node.state_dir
    reuse = REUSE_MODELS and simulated
    template = _template(cfg, data_path, cache_dir)
    if node.site_model:
        check_site_model(cfg, parse_run_config(run), template, data_path, cache_dir)
    keep = received_entries(template, cfg) if reuse else frozenset()
    model, resident = client_model(template, reuse, keep)
    timing.mark("model")
    if simulated and not data_path:  # clients of one shared set: decoded whole, once
        decode_shared_data(cfg)
    data = load_client_data(cfg, partition_id, num_partitions, data_path, cache_dir)
    check_site_data(cfg, data, f"site '{site}'" if node.deployed_site else site)
    timing.mark("data")
    # a site's on disk; a simulated client's chosen by the bytes its state will take
    store: PersonalStore | Callable[[int], PersonalStore] = (
        DiskStore(node.state_dir, experiment_id(cfg, model), site)
        if node.state_dir
        else partial(simulation_store, cfg, context, site, num_partitions=num_partitions)
    )
    attacker = cfg.attack != "none" and partition_id < cfg.attack_clients
    attacker = attacker and not node.deployed_site
    if attacker and cfg.attack == "label-flip":
        data = flip_labels(data, data_info(cfg, data_path, cache_dir).num_classes)
    own = None  # each site's own labels: the server compares the lists
    if not run_class_names(cfg):
        own = site_class_names(cfg, partition_id, num_partitions, data_path, cache_dir)
    setup = ClientSetup(
        weight_by_samples=weighs_by_samples(cfg, method.aggregation),
        class_fingerprint=class_fingerprint(own) if own is not None else "",
        # a deployed site answers the shape its data give (site_data.py)
        data_info=(
            data_info_properties(data_info(cfg, data_path, cache_dir)) if node.deployed_site else {}
        ),
        report_data_digest=not node.deployed_site,  # simulated, never a deployed site
        withhold_metrics=withholds_metrics(node, cfg.secure_aggregation),
        # a resident model: put back from the template unless received (settle)
        stale=(template, keep) if resident and keep else None,
    )
    client = build_method_client(method, model, data, cfg, store, device, site, setup)
    if attacker and cfg.attack != "label-flip":  # simulated hostile client (client_app/attacks.py)
        return Attacker(client, cfg.attack, cfg.attack_scale, cfg.seed + partition_id)
    return client


def shared_shapes(cfg: RunConfig, model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The shapes of ``model``'s shared entries under ``cfg``'s method, by name."""
    state = model.state_dict()
    return {n: tuple(state[n].shape) for n in get_method(cfg.method).roles(model, cfg).shared}


def check_site_model(
    cfg: RunConfig, run: RunConfig, template: nn.Module, data_path: str, cache_dir: str
) -> None:
    """A site's own backbone (node config ``model``, ``hidden-dim``) is taken only where
    the method's shared tensors keep the names and shapes of the run's backbone's: what
    every site sends must fold into one mean. Else a ConfigError naming the key."""
    mine = shared_shapes(cfg, template)
    theirs = shared_shapes(run, _template(run, data_path, cache_dir))
    if mine != theirs:
        odd = sorted(set(mine.items()) ^ set(theirs.items()))[0][0]
        raise ConfigError(
            f"node config 'model': this site's {cfg.model} shares '{odd}' as "
            f"{mine.get(odd, 'nothing')}, the run's {run.model} as {theirs.get(odd, 'nothing')}; "
            "only a method whose shared tensors do not depend on the backbone takes a "
            "site's own, one that shares class prototypes at the same feature width"
        )


def simulation_store(
    cfg: RunConfig, context: Context, client_key: str, nbytes: int, num_partitions: int
) -> PersonalStore:
    """Where a simulated client keeps its personal state: in its node's context (the
    engine holds the contexts of the nodes that hold state, in memory), or, when the
    state of every client the run can train (``clients_that_train``: at most rounds x
    the clients a round asks) would exceed ``personal-state-budget-mb``
    (``personal-state=budget``) or always (``disk``), on disk, one checked file per
    round, in the run's directory
    (``<output-dir>/<run-name>/personal-state/``) so memory stays bounded whatever
    the number of clients, and the run can resume from its checkpoint with it. A run
    resumed from a checkpoint whose personal state is on disk reads it from there."""
    resumed = resumed_personal_state(cfg)
    if resumed is None and cfg.personal_state != "disk":
        holders = clients_that_train(num_partitions, cfg.num_server_rounds, cfg.fraction_fit)
        total = holders * nbytes
        if cfg.personal_state == "memory" or total <= cfg.personal_state_budget_mb * 2**20:
            if cfg.resume_from and total:
                _warn_once(
                    f"resume-from {cfg.resume_from}: that run kept its clients' personal "
                    "state in memory, so the personal parts start afresh "
                    "(personal-state='disk' keeps them resumable)"
                )
            return ContextStore(context)
    output = Path(cfg.output_dir).expanduser().resolve()
    run_dir = output / cfg.run_name if cfg.run_name else output / f"run-{context.run_id}"
    return RoundStore(run_dir / PERSONAL_STATE_DIR, client_key, resumed)


def resumed_personal_state(cfg: RunConfig) -> Path | None:
    """The personal-state folder of the run ``resume-from`` names, if it kept one."""
    if not cfg.resume_from:
        return None
    if cfg.resume_from == RESUME_LATEST:  # the run's own folder (strategies/checkpoint.py)
        folder = Path(cfg.output_dir).expanduser().resolve() / cfg.run_name / PERSONAL_STATE_DIR
        return folder if cfg.run_name and folder.is_dir() else None
    folder = Path(cfg.resume_from).expanduser().resolve()
    folder = (folder if folder.is_dir() else folder.parent) / PERSONAL_STATE_DIR
    return folder if folder.is_dir() else None


@lru_cache(maxsize=8)
def _warn_once(message: str) -> None:
    log.warning("%s", message)


def withholds_metrics(node: NodeConfig, secure_aggregation: bool) -> bool:
    """Whether this site's policy sends its client key only beside a masked upload."""
    try:
        policy = SitePolicy.of_node(node, method_names(), disclosure_kinds())
    except PolicyError:
        return True  # a malformed policy refuses every message anyway
    return policy is not None and policy.withholds_metrics(secure_aggregation)
