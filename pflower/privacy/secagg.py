"""SecAgg+ that a deviating server cannot undo: a versioned protocol, signed keys.

Flower's SecAgg+ (1.39) trusts the server to forward each site's public keys
faithfully. A server that makes up a site's "neighbours" itself holds their private
keys, removes every mask and reads the site's upload. Here:

- the set-up stage carries ``SECAGG_PROTOCOL`` (masks from a cryptographic PRF,
  ``pflower.patches.secagg_masks``); a site refuses a round in another protocol, and
  the server leaves out a reply that does not echo it;
- each site signs its two SecAgg+ public keys, the run, the round and its node id
  with its identity key (its SuperNode's authentication key, node config
  ``identity-key``); the server forwards the signatures with the keys;
- a site with its own copy of the deployment's roster (node config
  ``secagg-roster``) checks every neighbour's signature against the roster's
  public keys and node ids, and refuses the round, before it sends any share or
  masked vector, when a neighbour is not a roster site or the round has fewer
  distinct roster sites than its policy's ``min-secagg-sites``.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.common import ConfigRecord, Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server import Grid
from flwr.server.workflow import SecAggPlusWorkflow

from pflower.config.node import NodeConfig
from pflower.patches import SECAGG_PROTOCOL, secagg_masks
from pflower.privacy.policy import ROSTER_KEY  # noqa: F401 - the node config key, named here too

log = logging.getLogger("flwr.pflower")

PROTOCOL_KEY = "pflower-protocol"  # in the set-up config, and echoed in each reply
SIGNATURE_KEY = "pflower-signature"  # in a site's set-up reply
SIGNATURES_RECORD = "pflower.secagg-signatures"  # beside the share-keys stage's keys
IDENTITY_KEY = "identity-key"  # node config: the site's private key (OpenSSH)


def key_statement(run_id: int, round_id: str, node_id: int, pk1: bytes, pk2: bytes) -> bytes:
    """What a site signs: the protocol, run, round, its node id and both public keys
    (length-prefixed, so no two statements read alike)."""
    parts = [SECAGG_PROTOCOL.encode(), str(run_id).encode(), round_id.encode()]
    parts += [str(node_id).encode(), pk1, pk2]
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _private_key(path: str) -> Any:
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    try:
        return load_ssh_private_key(Path(path).expanduser().read_bytes(), None)
    except (OSError, ValueError) as err:
        raise ValueError(f"node config '{IDENTITY_KEY}': cannot load {path!r} ({err})") from err


def sign(private_key_path: str, statement: bytes) -> bytes:
    """The site's signature (ECDSA P-256/384 with SHA-256, or Ed25519) on ``statement``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = _private_key(private_key_path)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(statement, ec.ECDSA(hashes.SHA256()))
    return key.sign(statement)


def _verifies(public_key: Any, signature: bytes, statement: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, statement, ec.ECDSA(hashes.SHA256()))
        else:
            public_key.verify(signature, statement)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class RosterSite:
    name: str
    node_id: int | None
    public_key: Any


def load_site_roster(path: str) -> list[RosterSite]:
    """The roster's sites with their public keys (a path relative to the roster, or
    the OpenSSH key text) and node ids where registered; ValueError naming the key."""
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    file = Path(path).expanduser()
    try:
        sites = tomllib.loads(file.read_text()).get("sites")
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"node config '{ROSTER_KEY}': cannot read {path!r} ({err})") from err
    if not isinstance(sites, dict) or not sites:
        raise ValueError(f"node config '{ROSTER_KEY}': {path!r} has no [sites.<name>] table")
    out = []
    for name, entry in sites.items():
        value = str(entry.get("public-key", "")) if isinstance(entry, dict) else ""
        try:
            if value.startswith(("ecdsa-", "ssh-")):
                text = value.encode()
            else:
                key_path = Path(value).expanduser()
                text = (key_path if key_path.is_absolute() else file.parent / key_path).read_bytes()
            public_key = load_ssh_public_key(text.strip())
        except (OSError, ValueError) as err:
            raise ValueError(
                f"node config '{ROSTER_KEY}': site {name!r} has no usable public-key ({err})"
            ) from err
        node = entry.get("node-id")
        out.append(RosterSite(name, node if isinstance(node, int) else None, public_key))
    return out


def neighbour_refusal(
    roster: list[RosterSite],
    keys: dict[int, tuple[bytes, bytes]],
    signatures: dict[str, Any],
    run_id: int,
    round_id: str,
    min_sites: int,
) -> str | None:
    """Why a site refuses this round's neighbours (``keys``: node id -> its two
    SecAgg+ public keys, this site's own among them), or None."""
    signers: dict[int, str] = {}
    for node_id, (pk1, pk2) in sorted(keys.items()):
        signature = signatures.get(str(node_id))
        if not isinstance(signature, bytes):
            return f"SecAgg+ neighbour node {node_id} sent no signature on its keys"
        statement = key_statement(run_id, round_id, node_id, pk1, pk2)
        site = next(
            (
                s.name
                for s in roster
                if s.node_id in (None, node_id) and _verifies(s.public_key, signature, statement)
            ),
            None,
        )
        if site is None:
            return (
                f"SecAgg+ neighbour node {node_id}'s keys are not signed by a site on this "
                "site's roster (a server can play a site's neighbours only with keys of its own)"
            )
        signers[node_id] = site
    distinct = len(set(signers.values()))
    if distinct < min_sites:
        return (
            f"this SecAgg+ round has {distinct} distinct roster site(s) among its neighbours, "
            f"below the site's min-secagg-sites={min_sites}"
        )
    return None


# ---- the client's side ---------------------------------------------------------------------


def stage_refusal(msg: Message, node: NodeConfig, min_sites: int | None) -> str | None:
    """Why this site refuses an incoming SecAgg+ stage, or None. ``min_sites`` None:
    the site checks no neighbours (it has no roster)."""
    secagg_masks()  # every process that masks: a cold ClientApp is new per message
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    stage = configs.get(Key.STAGE)
    if stage == Stage.SETUP and configs.get(PROTOCOL_KEY) != SECAGG_PROTOCOL:
        got = configs.get(PROTOCOL_KEY) or "Flower's own (no protocol version)"
        return f"the server's SecAgg+ set-up speaks {got}; this site speaks {SECAGG_PROTOCOL}"
    if stage not in (Stage.SETUP, Stage.SHARE_KEYS) or min_sites is None:
        return None
    try:
        roster = load_site_roster(node.secagg_roster)
    except ValueError as err:
        return str(err)
    if stage == Stage.SETUP:  # the size that sizes each distributed-DP noise share
        sample = configs.get(Key.SAMPLE_NUMBER)
        if not isinstance(sample, int) or sample > len(roster):
            return (
                f"the SecAgg+ round claims {sample} participants, more than the "
                f"{len(roster)} sites on this site's roster"
            )
        return None
    keys = {int(k): (v[0], v[1]) for k, v in configs.items() if k != Key.STAGE}
    record = msg.content.config_records.get(SIGNATURES_RECORD, {})
    return neighbour_refusal(
        roster, keys, dict(record), msg.metadata.run_id, msg.metadata.group_id, min_sites
    )


def sign_setup_reply(msg: Message, reply: Message, node: NodeConfig) -> None:
    """Echo the protocol in a set-up reply, and sign its keys with the site's identity
    key (when the site has one)."""
    configs = reply.content.config_records[RECORD_KEY_CONFIGS]
    configs[PROTOCOL_KEY] = SECAGG_PROTOCOL
    if node.identity_key:
        pk1, pk2 = configs[Key.PUBLIC_KEY_1], configs[Key.PUBLIC_KEY_2]
        statement = key_statement(
            msg.metadata.run_id, msg.metadata.group_id, msg.metadata.dst_node_id, pk1, pk2
        )
        configs[SIGNATURE_KEY] = sign(node.identity_key, statement)


# ---- the server's side ---------------------------------------------------------------------


class _StageGrid:
    """A Grid whose ``send_and_receive`` edits each message out and reads each reply."""

    def __init__(
        self,
        grid: Grid,
        outgoing: Callable[[Message], None],
        incoming: Callable[[Message], None] = lambda _: None,
    ) -> None:
        self._grid, self._outgoing, self._incoming = grid, outgoing, incoming

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        messages = list(messages)
        for message in messages:
            self._outgoing(message)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        for reply in replies:
            self._incoming(reply)
        return replies


class SignedSecAggPlusWorkflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow with the protocol version in its set-up and each
    site's key signature forwarded beside its keys; replies in another protocol are
    left out of the round (logged). Masks from ``pflower.patches.secagg_masks``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        secagg_masks()
        self._signatures: dict[int, bytes] = {}
        self._protocol_ok: set[int] = set()

    def setup_stage(self, grid: Grid, context: Any, state: Any) -> bool:
        self._signatures, self._protocol_ok = {}, set()

        def outgoing(message: Message) -> None:
            message.content.config_records[RECORD_KEY_CONFIGS][PROTOCOL_KEY] = SECAGG_PROTOCOL

        def incoming(reply: Message) -> None:
            if reply.has_error():
                return
            configs = reply.content.config_records.get(RECORD_KEY_CONFIGS, {})
            node = reply.metadata.src_node_id
            if configs.get(PROTOCOL_KEY) == SECAGG_PROTOCOL:
                self._protocol_ok.add(node)
            if isinstance(configs.get(SIGNATURE_KEY), bytes):
                self._signatures[node] = configs[SIGNATURE_KEY]

        going_on = super().setup_stage(_StageGrid(grid, outgoing, incoming), context, state)
        for node in sorted(state.active_node_ids - self._protocol_ok):
            log.warning(
                "SecAgg+: node %d does not speak %s (Flower's own masks, or another version); "
                "its upload is left out of the round",
                node,
                SECAGG_PROTOCOL,
            )
        state.active_node_ids &= self._protocol_ok
        return going_on and self._check_threshold(state)

    def share_keys_stage(self, grid: Grid, context: Any, state: Any) -> bool:
        def outgoing(message: Message) -> None:
            configs = message.content.config_records[RECORD_KEY_CONFIGS]
            nodes = [int(k) for k in configs if k != Key.STAGE]
            message.content.config_records[SIGNATURES_RECORD] = ConfigRecord(
                {str(n): self._signatures[n] for n in nodes if n in self._signatures}
            )

        going_on = super().share_keys_stage(_StageGrid(grid, outgoing), context, state)
        # Flower 1.39 counts a node that dropped before sharing its keys as "dead" at
        # the unmask stage and asks its neighbours for shares they never got (a
        # KeyError at every site: the round is lost). Only nodes whose shares went
        # out can be dead; the others are in no one's masks.
        shared = set(state.active_node_ids)
        state.sampled_node_ids = shared
        for node in shared:
            state.nid_to_neighbours[node] &= shared
        return going_on
