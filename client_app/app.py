"""The ClientApp: the mods each message passes (packing, errors, the site's policy,
dropout, SecAgg+), then the node's client, built by client_app/build.py.

The node config (``flower-supernode --node-config``, ``deploy.site``) is
pflower/config/node.py's ``NodeConfig``: who the node is, its data, device and
state directory, and the site's policy (pflower/privacy/policy.py), checked before
any work.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Mapping
from typing import Any

from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Context, Message, MessageType
from flwr.common.constant import MessageTypeLegacy
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

import pflower.patches
from client_app import timing
from client_app.build import (  # noqa: F401 - named here by their callers
    REUSE_MODELS,
    _template,
    _warn_once,
    build_client,
    build_numpy_client,
    client_model,
    data_cache_dir,
    experiment_id,
    simulation_store,
    withholds_metrics,
)
from client_app.devices import before_ray_starts, pick_device  # noqa: F401
from client_app.errors import PublicError, errors_mod, site_name
from methods import disclosure_kinds, get_method, method_names, parse_run_config
from models.roles import DP_PARTICIPANTS
from pflower.config.node import NodeConfig
from pflower.config.schema import ConfigError, RunConfig
from pflower.packing import is_packed, pack, unpack
from pflower.privacy.policy import (
    DEFAULT_MIN_SECAGG_SITES,
    REFUSED,
    PolicyError,
    SitePolicy,
    roster_refusal,
)
from pflower.privacy.secagg import ROSTER_KEY, sign_setup_reply, stage_refusal

log = logging.getLogger("flwr.pflower")
before_ray_starts()  # Ray's GPU variables as Ray will set them (client_app/devices.py)
if "flwr.server.superlink.fleet.vce.vce_api" in sys.modules:  # Flower's simulation engine:
    # it loads the ClientApp before it starts (the ServerApp's import may come later)
    pflower.patches.ray_when_the_engine_starts()
    pflower.patches.sparse_node_stores()  # its stores so far turned sparse when it starts


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
    node: Mapping[str, Any] | NodeConfig, cfg: RunConfig, message_type: str, masked: bool
) -> str | None:
    """Why this site refuses this message of this run, or None (a node config that
    does not parse: the site refuses every message, naming the key)."""
    site = site_name(node)
    try:
        node = NodeConfig.of(node)
    except ConfigError as err:
        return f"site {site!r} {REFUSED}: {err}"
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


def secagg_min_sites(node: NodeConfig) -> int | None:
    """How many distinct roster sites this site wants among its SecAgg+ neighbours;
    None when it has no roster of its own to check them against (logged once for a
    site that requires SecAgg+)."""
    try:
        policy = SitePolicy.of_node(node, method_names(), disclosure_kinds())
    except PolicyError:
        policy = None  # a malformed policy refuses every message anyway
    if not node.secagg_roster:
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


def dropout_name(node: NodeConfig) -> str:
    """The name that seeds a node's dropouts: its site, else its partition number."""
    return node.site or str(node.partition_id or 0)


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
            site = dropout_name(NodeConfig.of(context.node_config))
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
        why = policy_refusal(context.node_config, cfg, msg.metadata.message_type, masked)
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
            node = NodeConfig.of(context.node_config)  # policy_mod parsed it already
            why = stage_refusal(msg, node, secagg_min_sites(node))
            if why is None and raw.get("dp-mode") == "distributed":
                why = dp_share_refusal(msg.content, context.state)
            if why is not None:
                site = node.site if node.deployed_site else node.partition_id
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
