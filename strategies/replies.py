"""Reply validation: what a fit or evaluate reply must be before anything learns from it.

A fit reply is decoded, its bytes dropped, checked against the wire spec (count,
shape, dtype, finite, ``max-abs-value``), its client key bound to the node that sent
it, and its metrics checked for finite values; a reply that fails any of these is
rejected with a logged reason and nothing of it is used. The sites' class lists
are compared before anything is aggregated.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import (
    FitRes,
    GetPropertiesIns,
    GetPropertiesRes,
    NDArrays,
    Parameters,
    Scalar,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from models.roles import CLASSES_KEY, CLIENT_KEY, TensorSpec
from pflower.config.refusal import stop_at_refusal
from pflower.patches import read_only_arrays
from pflower.privacy.policy import REFUSED
from strategies.outcome import error_line, failed_node

log = logging.getLogger("flwr.pflower")


class RunRefused(RuntimeError):
    """Every client asked refused the run by its site's policy: it stops here."""


class ClassListMismatch(RuntimeError):
    """Sites label their data through different class lists: training would mix labels."""


@dataclass
class Reply:
    """One accepted fit reply."""

    client_key: str
    arrays: NDArrays
    num_examples: int
    metrics: dict[str, Scalar]


@dataclass
class Evaluation:
    """One client's evaluation of a round's personalised model."""

    client_key: Any
    loss: float
    num_examples: int
    metrics: dict[str, Scalar]

    def problem(self) -> str | None:
        acc = self.metrics.get("accuracy")
        if not isinstance(self.client_key, str) or not self.client_key:
            return "no client key"
        if not isinstance(acc, (int, float)) or not 0.0 <= float(acc) <= 1.0:
            return f"accuracy {acc!r}"
        if self.num_examples <= 0:
            return f"num_examples {self.num_examples}"
        return None


def payload_bytes(parameters: Parameters) -> int:
    """Bytes of a serialized payload (what travels)."""
    return sum(len(t) for t in parameters.tensors)


def failure_reason(failure: object) -> str:
    """One line of a failure, with its node where Flower says it."""
    node = failed_node(failure)
    return f"node {node}: {error_line(failure)}" if node is not None else error_line(failure)


def take_arrays(arrays: dict[str, np.ndarray], prefix: str, spec: list[TensorSpec]) -> NDArrays:
    """``arrays[prefix + name]`` for each spec entry, checked against it."""
    out = []
    for s in spec:
        a = arrays.get(prefix + s.name)
        if a is None:
            raise ValueError(f"no tensor '{prefix}{s.name}'")
        problem = s.matches(a)
        if problem:
            raise ValueError(problem)
        out.append(a)
    return out


def value_range(array: np.ndarray) -> tuple[bool, float]:
    """(all finite, the largest absolute value) of a float array, compiled for float32
    and float64 (strategies/kernels.py), numpy's two passes for another dtype."""
    from strategies import kernels

    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype in kernels.COMPILED_DTYPES:
        return kernels.value_range()(flat)
    if not np.isfinite(flat).all():
        return False, float("inf")
    return True, float(np.abs(flat).max())


def check_arrays(
    spec: list[TensorSpec],
    arrays: NDArrays,
    num_examples: int,
    max_abs_value: float,
    values: bool = True,
) -> str | None:
    """None if ``arrays`` fit ``spec`` and stay within ``max_abs_value``, else why not
    (``values=False``: their values are not read; a caller that reads them in a pass
    of its own, the streamed fold, checks them there)."""
    if len(arrays) != len(spec):
        return f"{len(arrays)} tensors, expected {len(spec)}"
    for s, a in zip(spec, arrays):
        problem = s.matches(a, values=False)
        if problem:
            return problem
        if values and a.dtype.kind == "f" and a.size:
            finite, largest = value_range(a)  # one pass, no temporary
            if not finite:
                return f"'{s.name}' has non-finite values"
            if largest > max_abs_value:
                return f"'{s.name}' has |value| {largest:.3g} > max-abs-value"
    if num_examples <= 0:
        return f"num_examples is {num_examples}"
    return None


class ClientKeys:
    """Which stable client key each node presents, and the rule that binds them.

    With a roster (a deployment's sites and their authenticated node ids,
    strategies/roster.py) a key is bound only to the node the roster gives for it.
    Without one (simulation) a key stays with the first node whose reply was
    accepted while that node is connected."""

    def __init__(self, roster: dict[str, int] | None = None) -> None:
        self.roster = roster
        self.node_keys: dict[int, str] = {}  # transient node id -> stable client key
        self.key_owner: dict[str, int] = {}  # client key -> the node bound to it
        self.manager: ClientManager | None = None  # for who is still connected
        if roster is not None:  # every site's node is known before it replies
            self.key_owner = dict(roster)
            self.node_keys = {node: key for key, node in roster.items()}

    def key_of(self, proxy: ClientProxy) -> str | None:
        return self.node_keys.get(proxy.node_id)

    def bind(self, node_id: int, key: str) -> str | None:
        """Tie a client key to the node that presents it: None if it may, else why
        not. With a roster: only the roster's node for that key. Without: a key
        stays with its first node while that node is connected (another node
        presenting it is an impostor, and never gets its payload); it moves only
        when that node is gone (a site restarted without node authentication,
        which gives it a new node id). A node keeps the key it first presented."""
        if self.roster is not None:
            expected = self.roster.get(key)
            if expected is None:
                return f"client key {key!r} is not in the roster"
            if expected != node_id:
                return f"client key {key!r} belongs to node {expected} (roster), not this node"
            return None
        owner = self.key_owner.get(key)
        if owner is not None and owner != node_id:
            connected = {p.node_id for p in self.manager.all().values()} if self.manager else set()
            if owner in connected:
                return f"client key {key!r} belongs to node {owner}, still connected"
            log.warning("client key %r moves from node %d (gone) to node %d", key, owner, node_id)
        current = self.node_keys.get(node_id)
        if current is not None and current != key:
            return f"node {node_id} presented client key {current!r} before"
        self.key_owner[key] = node_id
        self.node_keys[node_id] = key
        return None


def accept_fit_replies(
    server_round: int,
    results: list[tuple[ClientProxy, FitRes]],
    decode: Callable[[NDArrays], NDArrays],
    check: Callable[[str, NDArrays, int], str | None],
    keys: ClientKeys,
    views: bool = False,
) -> tuple[list[Reply], list[str], int]:
    """(accepted replies, rejection reasons, bytes received). ``decode`` turns the
    received arrays into what ``check`` judges (SecAgg+'s sum back to the spec's
    dtypes); every rejection is logged with its reason. ``views``: the arrays are
    read-only views on the received bytes, not copies (for a caller that only reads
    them: the streamed fold)."""
    accepted: list[Reply] = []
    rejected: list[str] = []
    received = 0
    for proxy, res in results:
        key = res.metrics.get(CLIENT_KEY)
        received += payload_bytes(res.parameters)
        who = f"client {key!r} (node {proxy.node_id})"
        if not isinstance(key, str) or not key:
            reason: str | None = "no client-key in its metrics"
        else:
            try:
                if views:
                    arrays = read_only_arrays(res.parameters.tensors)
                else:
                    arrays = parameters_to_ndarrays(res.parameters)
                # the decoded arrays are what is kept (views keep their bytes): drop this
                # reply's reference to the bytes (Flower's round loop holds every reply
                # until the round ends); not in place: SecAgg+ hands every reply one
                # shared object
                res.parameters = Parameters(tensors=[], tensor_type=res.parameters.tensor_type)
                arrays = decode(arrays)
                reason = check(key, arrays, res.num_examples)
            except Exception as err:  # noqa: BLE001 - undecodable bytes
                reason = f"undecodable payload ({type(err).__name__}: {err})"
        if reason is None:
            bad = [
                k for k, v in res.metrics.items() if isinstance(v, float) and not math.isfinite(v)
            ]
            if bad:
                reason = f"non-finite metrics {bad}"
        if reason is None:  # last: a reply rejected for any reason binds no key
            reason = keys.bind(proxy.node_id, key)
        if reason is not None:
            log.warning("round %d: rejected reply from %s: %s", server_round, who, reason)
            rejected.append(f"{key}: {reason}")
            continue
        accepted.append(Reply(key, arrays, int(res.num_examples), dict(res.metrics)))
    return accepted, rejected, received


def ask_properties(
    proxies: list[ClientProxy],
    config: dict[str, Scalar],
    timeout: float | None,
    group_id: int,
    workers: int,
) -> list[tuple[ClientProxy, GetPropertiesRes | Exception]]:
    """Every node's answer to a properties query (or why it gave none), asked
    ``workers`` at a time, in the order of ``proxies``."""

    def one(proxy: ClientProxy) -> tuple[ClientProxy, GetPropertiesRes | Exception]:
        try:
            return proxy, proxy.get_properties(GetPropertiesIns(dict(config)), timeout, group_id)
        except Exception as err:  # noqa: BLE001 - the caller says what a silent node means
            return proxy, err

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(proxies)))) as pool:
        return list(pool.map(one, proxies))


class ClassLists:
    """Each site's class-list digest; a run whose sites disagree stops before it
    aggregates anything (each site's label ids come from its own list)."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}  # client key -> digest of its class list
        self.asked = False  # the sites were asked before round 1

    workers = 32  # queries at once (the in-process engine asks one client at a time)

    def ask(self, proxies: list[ClientProxy], timeout: float | None, server_round: int) -> None:
        """Before a run's first fit: ask each site for its class-list digest (a
        properties query, answered from its data alone) and stop the run, naming the
        sites, before any of them trains. A site that cannot answer is logged and
        checked on its first fit reply instead."""
        if self.asked:  # answered already, before the model was built (site_info.py)
            return
        self.asked = True
        replies = []
        asked = ask_properties(proxies, {}, timeout, server_round, self.workers)
        errors = [res for _, res in asked if isinstance(res, Exception)]
        stop_at_refusal(errors, f"before round {server_round}")  # a client's config error
        for proxy, res in asked:
            if isinstance(res, Exception):  # a refusal, a crash: its fit will say
                log.info("node %d: no class list before round %d (%s)", proxy.node_id,
                         server_round, str(res)[:120])  # fmt: skip
                continue
            key = res.properties.get(CLIENT_KEY)
            replies.append(Reply(str(key or proxy.node_id), [], 0, dict(res.properties)))
        self.check(server_round, replies, before=True)

    def check(self, server_round: int, replies: list[Reply], before: bool = False) -> None:
        for r in replies:
            fingerprint = r.metrics.get(CLASSES_KEY)
            if isinstance(fingerprint, str) and fingerprint:
                self.digests[r.client_key] = fingerprint
        groups: dict[str, list[str]] = {}
        for key, fingerprint in sorted(self.digests.items()):
            groups.setdefault(fingerprint, []).append(key)
        if len(groups) > 1:
            sides = "; ".join(", ".join(keys) for keys in groups.values())
            when = f"before round {server_round}" if before else f"round {server_round}"
            done = "nothing was trained" if before else "nothing was aggregated"
            raise ClassListMismatch(
                f"{when}: the sites' class lists differ ({sides} each have one "
                f"of their own), so the same label id means different classes: {done}. Give the run config key 'class-names' (every class, in order) "
                "and each site maps its labels by name"
            )


def accept_evaluations(
    server_round: int, results: list[tuple[ClientProxy, Any]], keys: ClientKeys
) -> list[Evaluation]:
    """The evaluate replies whose metrics make sense and whose key fits its node."""
    evals = []
    for proxy, res in results:
        e = Evaluation(res.metrics.get(CLIENT_KEY), res.loss, res.num_examples, res.metrics)
        problem = e.problem() or keys.bind(proxy.node_id, str(e.client_key))
        if problem is not None:
            log.warning(
                "round %d: rejected evaluation from node %d (%s): metrics %r",
                server_round,
                proxy.node_id,
                problem,
                dict(res.metrics),
            )
            continue
        evals.append(e)
    return evals


def check_failures(server_round: int, accepted: list[Reply], failures: list[Any]) -> None:
    """Log each failed client; stop the run (RunRefused) when every client asked
    refused it by its site's policy and none replied."""
    stop_at_refusal(failures, f"round {server_round}")  # a simulated client's config error
    for failure in failures:
        log.warning("round %d: a client failed: %s", server_round, failure_reason(failure))
    refusals = [r for r in map(failure_reason, failures) if REFUSED in r]
    if not accepted and refusals and len(refusals) == len(failures):
        raise RunRefused(
            f"round {server_round}: every site asked refused this run by its policy, "
            f"nothing was sent; first: {refusals[0]}"
        )


def enough_replies(server_round: int, accepted: int, min_replies: int) -> bool:
    """Whether a round has ``min-replies`` acceptable replies; if not, it is skipped."""
    if accepted >= min_replies:
        return True
    log.error(
        "round %d: %d acceptable replies, fewer than min-replies=%d: the round is "
        "skipped and the global state kept",
        server_round,
        accepted,
        min_replies,
    )
    return False
