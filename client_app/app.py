"""The ClientApp: config -> data -> model -> the method's NumPyClient.

Node config keys (deployment, ``flower-supernode --node-config``):
``partition-id``/``num-partitions`` (simulation sets these), ``site`` (the stable
client identity), ``data-path`` (the site's own data), ``device`` (e.g. cuda:0),
``state-dir`` (persist personal state on disk; enables restart safety), and the
site's policy (``accept-disclosures``, ``require-secure-aggregation``,
``allowed-methods``: pflower/privacy/policy.py), checked before any work.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import random
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Context, Message, MessageType
from flwr.common.constant import MessageTypeLegacy
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from torch import nn

import pflower.patches
from client_app import timing
from client_app.attacks import Attacker, flip_labels
from client_app.base import PFLClient, personal_nbytes
from client_app.codec import FastClient
from client_app.devices import before_ray_starts, pick_device
from client_app.errors import PublicError, errors_mod, name_site, site_name
from client_app.method_client import build_method_client
from client_app.site_data import data_info_properties, site_declared
from client_app.state import ContextStore, DiskStore, PersonalStore, RoundStore
from methods import disclosure_kinds, get_method, method_names, parse_run_config
from models.roles import DP_PARTICIPANTS, reset_entries
from pflower.config.schema import RESUME_LATEST, RunConfig
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
from pflower.packing import is_packed, pack, unpack
from pflower.privacy.policy import (
    DEFAULT_MIN_SECAGG_SITES,
    REFUSED,
    PolicyError,
    SitePolicy,
    roster_refusal,
)
from pflower.privacy.secagg import ROSTER_KEY, sign_setup_reply, stage_refusal
from pflower.store import PERSONAL_STATE_DIR, clients_that_train

log = logging.getLogger("flwr.pflower")
before_ray_starts()  # Ray's GPU variables as Ray will set them (client_app/devices.py)
if "flwr.server.superlink.fleet.vce.vce_api" in sys.modules:  # Flower's simulation engine:
    # it loads the ClientApp before it starts (the ServerApp's import may come later)
    pflower.patches.ray_when_the_engine_starts()
    pflower.patches.sparse_node_stores()  # its stores so far turned sparse when it starts


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
# back to the template's values each message: a deep copy per message held the GIL
# for 2 ms of a 40 ms client-round (measured), against the other worker's training.
# A method keeps its per-message state on its client, never on the model
# (docs/ADDING_A_METHOD.md); tests/test_scale.py checks every method trains the same
# numbers either way.
REUSE_MODELS = True
_resident = threading.local()
# resident copies whose thread has ended (Flower's round loop and the cohort start a
# thread pool each round): a new worker adopts one instead of a deep copy of its own
# (0.4 s of CPU each on ResNet-18, two a round; docs/results/client-cpu.md)
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


def _hooked(model: nn.Module) -> bool:
    """Whether a hook is left on the model (a method that registers one removes it)."""
    hook_lists = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
    return any(getattr(p, "_backward_hooks", None) for p in model.parameters()) or any(
        getattr(m, name, None) for m in model.modules() for name in hook_lists
    )


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
    if _hooked(model):
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
        roles = method.roles(template)
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


def data_cache_dir(node: dict[str, Any] | Any) -> str:
    """Where a site keeps a copy of its decoded data: its state directory only when it
    asks (node config ``data-cache="disk"``, ``deploy.site --data-cache``; a cold
    ClientApp is a fresh process a message and would decode the data again), else
    nowhere ("")."""
    asked = str(node.get("data-cache", "")).lower() == "disk"
    return str(node.get("state-dir", "")) if asked else ""


def build_client(context: Context, overrides: dict[str, Any] | None = None) -> Client:
    """Flower's Client of the node's NumPyClient: a method's client with the fewest
    copies (client_app/codec.py), another (the simulated attacker) as Flower wraps it."""
    client = build_numpy_client(context, overrides)
    return FastClient(client) if isinstance(client, PFLClient) else client.to_client()


def build_numpy_client(context: Context, overrides: dict[str, Any] | None = None) -> Any:
    """The node's NumPyClient for one message: the method's client (a ``PFLClient``),
    or the simulated attacker around it."""
    node = context.node_config
    # the columns a site names for its own data replace the run's (client_app/site_data.py)
    cfg = parse_run_config({**context.run_config, **(overrides or {}), **site_declared(node)})
    timing.mark("config")
    partition_id = int(node.get("partition-id", 0))
    num_partitions = int(node.get("num-partitions", 1))
    data_path = str(node.get("data-path", ""))
    # a natural partition's client is named by its column's value (pflower/data/sites.py)
    site = str(node.get("site", "") or natural_site(cfg, partition_id, data_path))
    name_site(site)
    device = pick_device(str(node.get("device", "")))
    threads = int(node.get("torch-threads", 0))  # the in-process engine: one client at a time
    if device.type == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    elif device.type == "cpu" and torch.get_num_threads() > 1 and "num-partitions" in node:
        torch.set_num_threads(1)  # simulated clients (Ray actors) share the machine's cores
    method = get_method(cfg.method)
    state_dir = str(node.get("state-dir", ""))
    cache_dir = data_cache_dir(node)
    simulated = "site" not in node and not state_dir
    reuse = REUSE_MODELS and simulated
    template = _template(cfg, data_path, cache_dir)
    keep = received_entries(template, cfg) if reuse else frozenset()
    model, resident = client_model(template, reuse, keep)
    timing.mark("model")
    if simulated and not data_path:  # clients of one shared set: decoded whole, once
        decode_shared_data(cfg)
    data = load_client_data(cfg, partition_id, num_partitions, data_path, cache_dir)
    check_site_data(cfg, data, f"site '{site}'" if "site" in node else site)
    timing.mark("data")
    store: PersonalStore = (
        DiskStore(state_dir, experiment_id(cfg, model), site)
        if state_dir
        else ContextStore(context)
    )
    attacker = cfg.attack != "none" and partition_id < cfg.attack_clients and "site" not in node
    if attacker and cfg.attack == "label-flip":
        data = flip_labels(data, data_info(cfg, data_path, cache_dir).num_classes)
    client = build_method_client(method, model, data, cfg, store, device, site)
    if resident and keep:  # put back from the template unless received (PFLClient.settle)
        client.stale = (template, keep)
    client.report_data_digest = "site" not in node  # simulated, never a deployed site
    if "site" in node:  # a deployed site answers the shape its data give (site_data.py)
        client.data_info = data_info_properties(data_info(cfg, data_path, cache_dir))
    client.withhold_metrics = withholds_metrics(dict(node), cfg.secure_aggregation)
    if not state_dir:  # simulation: in memory, or on disk past the budget
        client.store = simulation_store(cfg, context, client, num_partitions)
    if not run_class_names(cfg):  # each site's own labels: the server compares the lists
        own = site_class_names(cfg, partition_id, num_partitions, data_path, cache_dir)
        client.class_fingerprint = class_fingerprint(own)
    aggregation = method.aggregation if cfg.aggregation == "default" else cfg.aggregation
    equal = aggregation == "mean" or cfg.dp_mode != "off"  # DP averages with equal weights
    client.weight_by_samples = not (cfg.secure_aggregation and equal)
    if attacker and cfg.attack != "label-flip":  # simulated hostile client (client_app/attacks.py)
        return Attacker(client, cfg.attack, cfg.attack_scale, cfg.seed + partition_id)
    return client


def simulation_store(
    cfg: RunConfig, context: Context, client: Any, num_partitions: int
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
        total = holders * personal_nbytes(client)
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
    return RoundStore(run_dir / PERSONAL_STATE_DIR, client.client_key, resumed)


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


# what a site that requires SecAgg+ answers at all: not a legacy get_parameters, whose
# reply is its shared tensors in the clear (the properties query carries scalars only)
ANSWERED = (
    MessageType.TRAIN,
    MessageType.EVALUATE,
    MessageType.QUERY,
    MessageTypeLegacy.GET_PROPERTIES,
)


class PolicyRefusal(PublicError):
    """The site refuses a run (its own policy, or SecAgg+ asked for and not used)."""


def policy_refusal(
    node: dict[str, Any], cfg: RunConfig, message_type: str, masked: bool
) -> str | None:
    """Why this site refuses this message of this run, or None."""
    site = site_name(node)
    try:
        policy = SitePolicy.of_node(node, method_names(), disclosure_kinds())
    except PolicyError as err:
        return f"site {site!r} {REFUSED}: {err}"
    why = None
    if policy is not None:
        disclosures = get_method(cfg.method).disclosures(cfg)
        why = policy.refusal(cfg.method, cfg.secure_aggregation, disclosures)
        # no roster: a server could play its SecAgg+ neighbours (pflower/privacy/policy.py)
        why = why or roster_refusal(node)
        if why is None and policy.require_secure_aggregation and message_type not in ANSWERED:
            why = f"site policy 'require-secure-aggregation' answers no '{message_type}' message"
        if why is None and policy.require_secure_aggregation:
            if message_type == MessageType.TRAIN and not masked:
                why = "site policy 'require-secure-aggregation' refuses an unmasked fit"
        if (
            why is None
            and policy.require_secure_aggregation
            and policy.withholds_metrics(True)
            and message_type == MessageType.EVALUATE
        ):
            why = (
                "site policy 'require-secure-aggregation' sends no per-site score unless "
                "'accept-disclosures' includes 'metrics' (an evaluate reply is its accuracy)"
            )
    if why is None and cfg.secure_aggregation and message_type == MessageType.TRAIN and not masked:
        why = "run key secure-aggregation=true, but this fit is unmasked (no SecAgg+ stage)"
    return None if why is None else f"site {site!r} {REFUSED}: {why}"


def withholds_metrics(node: dict[str, Any], secure_aggregation: bool) -> bool:
    """Whether this site's policy sends its client key only beside a masked upload."""
    try:
        policy = SitePolicy.of_node(node, method_names(), disclosure_kinds())
    except PolicyError:
        return True  # a malformed policy refuses every message anyway
    return policy is not None and policy.withholds_metrics(secure_aggregation)


def secagg_min_sites(node: dict[str, Any]) -> int | None:
    """How many distinct roster sites this site wants among its SecAgg+ neighbours;
    None when it has no roster of its own to check them against (logged once for a
    site that requires SecAgg+)."""
    try:
        policy = SitePolicy.of_node(node, method_names(), disclosure_kinds())
    except PolicyError:
        policy = None  # a malformed policy refuses every message anyway
    if not node.get(ROSTER_KEY):
        if policy is not None and policy.require_secure_aggregation:
            _warn_once(
                f"this site requires SecAgg+ but has no roster (node config '{ROSTER_KEY}'): "
                "its neighbours' keys go unchecked, and a server could play them"
            )
        return None
    return policy.min_secagg_sites if policy is not None else DEFAULT_MIN_SECAGG_SITES


def strip_plaintext_weight(reply: Message) -> None:
    """Under SecAgg+ the sample count travels inside the mask (Flower's mod scales the
    upload by it); the plaintext copy beside the masked vector becomes 1."""
    record = reply.content.metric_records.get("fitres.num_examples")
    if record is not None:
        record["num_examples"] = 1


def dp_share_refusal(content: Any, state: Any) -> str | None:
    """Distributed DP sizes each client's noise share by ``dp-participants``, which the
    server sends: a server that inflates it shrinks every share. Before its masked
    upload (SecAgg+'s collect stage) a client compares it with the round's own
    SecAgg+ sample size (set up in an earlier stage) and refuses a mismatch."""
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_STATE,
        Key,
        Stage,
    )

    configs = content.config_records.get(RECORD_KEY_CONFIGS, {})
    if configs.get(Key.STAGE) != Stage.COLLECT_MASKED_VECTORS:
        return None
    asked = content.config_records.get("fitins.config", {}).get(DP_PARTICIPANTS)
    sample = state.config_records.get(RECORD_KEY_STATE, {}).get(Key.SAMPLE_NUMBER)
    if asked is None or sample is None or int(asked) != int(sample):
        return (
            f"run key dp-mode='distributed': the fit says {DP_PARTICIPANTS}={asked}, the "
            f"SecAgg+ round has {sample} participants; its noise share would not add up"
        )
    return None


class InjectedDropout(PublicError):
    """A fault injected by ``dropout-rate`` (simulation of a vanishing client)."""


def dropped_out(rate: float, seed: int, server_round: str, site: str) -> bool:
    """Whether this client drops out of this round: seeded, so reproducible."""
    if rate <= 0:
        return False
    return random.Random(f"{seed}/{server_round}/{site}").random() < rate


def packing_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A deployed server sends a message's whole content in one part (pflower/packing.py):
    the other mods and the client see its records, and the reply goes back packed. A
    ClientApp composed of ``build_client`` puts this mod first."""
    if not (msg.has_content() and is_packed(msg.content)):
        return call_next(msg, context)
    msg.content = unpack(msg.content)
    reply = call_next(msg, context)
    if reply.has_content():
        reply.content = pack(reply.content)
    return reply


def make_client_app(overrides: dict[str, Any] | None = None) -> ClientApp:
    """A ClientApp whose run config is ``overrides`` over Flower's run config."""

    def dropout_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        # Raising here sends Flower's own error reply: the server sees a failure,
        # exactly as for a crashed client, and the client's state is untouched.
        if msg.metadata.message_type == MessageType.TRAIN:
            cfg = parse_run_config({**context.run_config, **(overrides or {})})
            site = str(
                context.node_config.get("site", "") or context.node_config.get("partition-id", 0)
            )
            if dropped_out(cfg.dropout_rate, cfg.seed, msg.metadata.group_id, site):
                raise InjectedDropout(
                    f"client {site} dropped out (dropout-rate={cfg.dropout_rate})"
                )
        return call_next(msg, context)

    def policy_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        # before anything of the run is loaded or trained: raising sends Flower's error
        # reply, so the server learns why, and no tensor leaves
        cfg = parse_run_config({**context.run_config, **(overrides or {})})
        masked = RECORD_KEY_CONFIGS in msg.content.config_records
        why = policy_refusal(dict(context.node_config), cfg, msg.metadata.message_type, masked)
        if why is not None:
            log.error("%s", why)
            raise PolicyRefusal(why)
        return call_next(msg, context)

    def secure_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        # SecAgg+ messages (secure-aggregation=true) go through Flower's secaggplus_mod:
        # the upload leaves masked, and only the sum of all uploads can be unmasked
        if msg.metadata.message_type == MessageType.TRAIN and (
            RECORD_KEY_CONFIGS in msg.content.config_records
        ):
            raw = {**context.run_config, **(overrides or {})}  # policy_mod parsed it already
            node = dict(context.node_config)
            why = stage_refusal(msg, node, secagg_min_sites(node))
            if why is None and raw.get("dp-mode") == "distributed":
                why = dp_share_refusal(msg.content, context.state)
            if why is not None:
                site = node.get("site", node.get("partition-id"))
                line = f"site {str(site)!r} {REFUSED}: {why}"
                log.error("%s", line)
                raise PolicyRefusal(line)
            stage = msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE)
            reply = secaggplus_mod(msg, context, call_next)
            if stage == Stage.SETUP and not reply.has_error():
                sign_setup_reply(msg, reply, node)
            elif stage == Stage.COLLECT_MASKED_VECTORS and not reply.has_error():
                strip_plaintext_weight(reply)
            return reply
        return call_next(msg, context)

    def phases_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        timing.begin(msg.metadata.created_at)
        reply = call_next(msg, context)
        if {**context.run_config, **(overrides or {})}.get("log-phases", False):
            timing.mark("reply")
            log.info(timing.line())
        return reply

    def client_fn(context: Context) -> Client:
        return build_client(context, overrides)

    return ClientApp(
        client_fn=client_fn,
        mods=[packing_mod, errors_mod, phases_mod, policy_mod, dropout_mod, secure_mod],
    )


app = make_client_app()
timing.APP_IMPORTED = time.time()
