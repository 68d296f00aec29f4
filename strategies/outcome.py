"""A run's outcome: whether it did what it was asked, judged at its end.

A run fails (Flower marks it ``finished:failed``, our CLI exits 1) when a round
aggregated no reply, when it recorded no round, or when a site it asked to train
never contributed and its failures were errors. A site that refused by its own
policy, or a simulated dropout (``dropout-rate``), is named in the summary but does
not fail the run: it is the site's decision, or the experiment's.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flwr.common import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    ReconnectIns,
)
from flwr.server.client_proxy import ClientProxy

from pflower.privacy.policy import REFUSED

if TYPE_CHECKING:
    from strategies.base import PFLStrategy

log = logging.getLogger("flwr.pflower")
DROPPED_OUT = "dropped out (dropout-rate="  # client_app.app.InjectedDropout's text
SITE_NAMED = re.compile(r"site '([^']+)' ")  # client_app/errors.py's error replies
FLOWER_ERROR = re.compile(r"<class '[\w.]+'>:<'(.*)'>", re.S)


class RunFailed(RuntimeError):
    """The run ended without doing what it was asked (the reasons are its lines)."""


class NodeFailed(RuntimeError):
    """A client's fit raised (an error reply, a timeout): Flower hands the strategy
    the bare exception, so this carries the node it came from."""

    def __init__(self, node_id: int, reason: str) -> None:
        super().__init__(f"node {node_id}: {reason}")
        self.node_id, self.reason = node_id, reason


def error_line(failure: object) -> str:
    """One line of a failure (Flower wraps client errors in long tracebacks)."""
    if isinstance(failure, NodeFailed):
        return failure.reason
    if isinstance(failure, tuple):
        _, res = failure
        return f"status {res.status.code.name} {res.status.message}"[:300]
    text = str(failure)
    raised = FLOWER_ERROR.search(text)  # "<class 'X'>:<'text'>", Flower's error reason
    if raised:
        text = raised.group(1)
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1]
    return text.split("\\n")[0].split("\n")[0].strip("'>) ")[:300]


def failed_node(failure: object) -> int | None:
    if isinstance(failure, NodeFailed):
        return failure.node_id
    if isinstance(failure, tuple):
        return int(failure[0].node_id)
    return None


@dataclass
class Participation:
    """Which nodes each round asked to train, which replied, the client keys it
    accepted, and each node's first failure."""

    asked: dict[int, list[int]] = field(default_factory=dict)
    replied: set[int] = field(default_factory=set)
    contributed: dict[int, list[str]] = field(default_factory=dict)
    first_error: dict[int, str] = field(default_factory=dict)
    erred: dict[int, bool] = field(default_factory=dict)  # a failure neither refusal nor dropout
    # failures Flower gives without their node (SecAgg+'s stages): (line, excused)
    unattributed: list[tuple[str, bool]] = field(default_factory=list)

    def add(
        self, server_round: int, keys: list[str], nodes: list[int], failures: list[Any]
    ) -> None:
        """A round's accepted client keys, the nodes that replied, its failures."""
        self.contributed[server_round] = sorted(set(keys))
        self.replied.update(nodes)
        for failure in failures:
            node, line = failed_node(failure), error_line(failure)
            excused = REFUSED in line or DROPPED_OUT in line
            if node is None:
                self.unattributed.append((line, excused))
                continue
            self.first_error.setdefault(node, line)
            self.erred[node] = self.erred.get(node, False) or not excused

    def silent_sites(self, key_of: dict[int, str]) -> list[tuple[str, str, bool]]:
        """(who, why, whether it fails the run) for each node asked that never
        replied: named by its client key where known (a roster's, or the site name
        its error reply gives), else by node id."""
        out = []
        for node in sorted({n for nodes in self.asked.values() for n in nodes} - self.replied):
            why = self.first_error.get(node) or self.unattributed_reason()
            named = SITE_NAMED.match(why)
            name = key_of.get(node) or (named.group(1) if named else None)
            asked = sum(node in nodes for nodes in self.asked.values())
            who = f"site {name!r}" if name else f"node {node}"
            silence = not self.unattributed or any(not ok for _, ok in self.unattributed)
            fails = self.erred.get(node, silence)
            rounds = f"{asked} round" + ("s" if asked != 1 else "")
            out.append((f"{who} (asked in {rounds})", why, fails))
        return out

    def unattributed_reason(self) -> str:
        """Why a node with no failure of its own may have been silent."""
        if not self.unattributed:
            return "never replied"
        return f"never replied; a failure without its node: {self.unattributed[0][0]}"

    def outcome(self, skipped: list[int], recorded: int, key_of: dict[int, str]) -> dict[str, Any]:
        """The run's outcome for results.json: status, problems, sites never heard."""
        problems = [f"round {r}: no reply was aggregated" for r in skipped]
        if not recorded:
            problems.append("no round was recorded (no results)")
        silent = self.silent_sites(key_of)
        problems += [f"{label} never contributed: {why}" for label, why, fails in silent if fails]
        notes = [f"{label} never contributed: {why}" for label, why, fails in silent if not fails]
        return {
            "status": "failed" if problems else "completed",
            "problems": problems,
            "notes": notes,
            "participants": {str(r): sorted(ks) for r, ks in sorted(self.contributed.items())},
        }


def judge(strategy: PFLStrategy) -> dict[str, Any]:
    """Record the run's outcome in results.json and log its summary; raise RunFailed
    (after writing) when it failed, so Flower ends the run ``finished:failed``."""
    part: Participation = strategy.rounds.participation
    recorder = strategy.recorder
    recorded = len(recorder.rounds) - recorder.round_offset if recorder is not None else 0
    skipped = [
        r
        for r in range(1, strategy.rounds.num_rounds + 1)  # max-minutes may end it early
        if "aggregate" not in strategy.rounds.of(r).marks
    ]
    result = part.outcome(skipped, recorded, dict(strategy.clients.node_keys))
    if recorder is not None:
        recorder.extra["outcome"] = result
        recorder.write()
    for line in result["notes"]:
        log.warning("run summary: %s", line)
    if not result["problems"]:
        return result
    for line in result["problems"]:
        log.error("run FAILED: %s", line)
    raise RunFailed("; ".join(result["problems"][:5]))


class NodeProxy(ClientProxy):
    """A sampled client whose failures name its node (``NodeFailed``)."""

    def __init__(self, inner: ClientProxy) -> None:
        super().__init__(inner.cid)
        self.inner, self.node_id, self.properties = inner, inner.node_id, inner.properties

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        try:
            return self.inner.fit(ins, timeout, group_id)
        except Exception as err:
            raise NodeFailed(self.node_id, error_line(err)) from err

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        return self.inner.evaluate(ins, timeout, group_id)

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        return self.inner.get_properties(ins, timeout, group_id)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        return self.inner.get_parameters(ins, timeout, group_id)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        return self.inner.reconnect(ins, timeout, group_id)
