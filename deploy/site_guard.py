"""What a site's own process enforces on every ClientApp, whatever app a run ships.

The site's SuperExec (deploy/warm_superexec.py) installs these checks into Flower's
ClientApp runner (``flwr.supernode.runtime.run_clientapp``, by pflower.patches'
``clientapp-site-checks``) before it starts any task, so they run in site-installed
code, before the run's FAB is unpacked or imported, and a submitted app cannot skip
them:

- **Approved apps.** The run's FAB (its bytes, as the SuperNode received them) must
  hash to one of the builds the site approved (``--approved-apps sha256:...``, or
  the node config key ``approved-apps``); by default the one build the site has
  installed (``python -m deploy.site --print-app-hash``). Anything else is refused
  with one line naming the hash: an error reply to the server, a line in the site's
  log and ledger, nothing unpacked, nothing run.
- **The ledger.** Every reply the site sends (and every refusal) appends one JSON
  line to ``<state-dir>/ledger.jsonl``: run, app hash, method, round, message type,
  each array's key, tensor name (the method's wire order), shape, dtype and bytes, every scalar's key, the declared
  disclosure kinds, whether it was refused, the size and digest of what the
  server had sent in, the digest of what left, and what the site's personal-state
  store restored and saved (each state's sha256, its parent's and its generation: a
  chain). A reply the ledger cannot record (a full disk) is not sent: an error
  reply says why. ``python -m deploy.site --ledger
  --state-dir DIR`` prints it as a table.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pflower.config.node import NodeConfig
from pflower.config.schema import ConfigError

log = logging.getLogger("flwr")

APPROVED_KEY = NodeConfig.key("approved_apps")  # comma-separated sha256:<hex> builds
LEDGER_FILE = "ledger.jsonl"
ANY_APP = "any"  # --approved-apps any: no check (development only; the ledger says so)
REFUSED = (
    "refuses this run by its policy"  # as pflower.privacy.policy.REFUSED (the server reads it)
)


class AppNotApproved(PermissionError):
    """The run's app is not a build this site approved."""


def fab_hash(content: bytes) -> str:
    """``sha256:<hex>`` of a FAB's bytes (Flower's FAB hash, with its algorithm)."""
    return "sha256:" + hashlib.sha256(content).hexdigest()


def installed_app_hash(project: Path | None = None) -> str:
    """The FAB hash of the project this site has installed: Flower's own build of the
    tree (``flwr build``'s bytes, which ``flwr run`` submits), fixed timestamps."""
    from flwr.cli.build import build_fab_from_disk

    root = project or Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise FileNotFoundError(
            f"{root} holds no pyproject.toml: give the approved builds with --approved-apps"
        )
    return fab_hash(build_fab_from_disk(root))


def parse_approved(text: str) -> frozenset[str] | None:
    """``sha256:<hex>,...`` -> the set; None for ``any``. ValueError naming a bad item."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == [ANY_APP]:
        return None
    for item in items:
        algo, _, digest = item.partition(":")
        if (
            algo != "sha256"
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            raise ValueError(f"approved app {item!r} is not sha256:<64 lower-case hex digits>")
    return frozenset(items)


class SiteGuard:
    """The checks one site's SuperExec applies to every ClientApp task."""

    def __init__(self, approved: frozenset[str] | None) -> None:
        self.approved = approved  # None: any app (--approved-apps any)
        self.task: dict[str, Any] = {}  # the current task's run, context and app hash

    def allowed(self, node_config: Mapping[str, Any] | NodeConfig) -> frozenset[str] | None:
        """The builds this site approves: its SuperExec's list and its node config's
        (ConfigError for a node config that does not parse; ValueError for a list
        that does not)."""
        extra = NodeConfig.of(node_config).approved_apps
        from_node = parse_approved(extra) if extra.strip() else frozenset()
        if self.approved is None or from_node is None:
            return None
        return self.approved | from_node

    def refusal(self, content: bytes) -> str | None:
        """Why this site refuses the FAB ``content``, or None."""
        digest = fab_hash(content)
        self.task["app"] = digest
        try:
            allowed = self.allowed(self.task.get("node_config", {}))
        except ConfigError as err:  # the node config itself, naming its bad key
            return f"{err}: every app is refused"
        except ValueError as err:
            return f"site policy '{APPROVED_KEY}' is malformed ({err}): every app is refused"
        if allowed is None or digest in allowed:
            return None
        return (
            f"site policy '{APPROVED_KEY}' does not include this run's app {digest} "
            f"(approved: {', '.join(sorted(allowed)) or 'none'})"
        )

    # ---- the hooks Flower's ClientApp runner calls (pflower.patches) ------------------

    def install(self) -> None:
        """Put this site's checks into Flower's ClientApp runner: the app check before
        its install step, the ledger before its push (in this process and every child
        forked from it; pflower.patches' ``clientapp-site-checks``)."""
        from pflower.patches import clientapp_site_checks

        clientapp_site_checks(self.pulled, self.installing, self.replying)

    def pulled(self, message: Any, context: Any) -> None:
        """A task's input, as Flower pulled it: this task's record starts here."""
        state_events().clear()  # this task's, from here on
        self.task = {
            "node_config": dict(context.node_config),
            "run_config": dict(context.run_config),
            "run_id": int(context.run_id),
            "received": message,
        }

    def installing(self, content: bytes) -> None:
        """Raise ``AppNotApproved`` for a FAB this site refuses (before a byte of it
        is unpacked)."""
        why = self.refusal(content)
        if why is not None:
            line = f"site {self.site()!r} {REFUSED}: {why}"
            log.error("%s", line)
            self.task["refused"] = line
            raise AppNotApproved(line)

    def replying(self, reply: Any) -> Any:
        """The reply to push: ``reply``, recorded in the ledger; if it cannot be
        recorded, an error in its place."""
        try:
            self.record(reply)
        except Exception as err:  # noqa: BLE001 - a reply the ledger lacks is not sent
            return self.unrecorded(reply, err)
        return reply

    def site(self) -> str:
        """The task's site name for a log line: its node config's ``site``, "?" where
        it names none (or does not parse: the line still goes out)."""
        try:
            site = NodeConfig.of(self.task.get("node_config", {})).site
        except ConfigError:
            site = None
        return "?" if site is None else site

    def unrecorded(self, reply: Any, err: BaseException) -> Any:
        """What goes out in place of a reply the ledger could not record (a full disk):
        an error naming why, so the site sends nothing its ledger does not list."""
        from flwr.common import Error, Message
        from flwr.common.constant import ErrorCode

        line = f"site {self.site()!r} could not record its reply in its ledger ({err}): not sent"
        log.error("site ledger: %s", line)
        received = self.task.get("received")
        if received is None:  # nothing to answer (not expected: every task pulls one)
            raise err
        return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, line[:300]), reply_to=received)

    def record(self, reply: Any) -> None:
        """Append the ledger line of one reply (the site's state-dir; none without)."""
        node = NodeConfig.of(self.task.get("node_config", {}))
        state_dir = node.state_dir
        if not state_dir:
            return
        received = self.task.get("received")
        line = ledger_line(
            reply,
            received,
            self.task.get("run_config", {}),
            app=self.task.get("app", ""),
            approved_any=self.approved is None,
            refused=self.task.get("refused", ""),
        )
        line["state"] = list(state_events())  # what its personal-state store did
        line["run"] = self.task.get("run_id")
        line["run_name"] = str(self.task.get("run_config", {}).get("run-name", "") or "")
        names = upload_names(self.task.get("run_config", {}), node, len(line["arrays"]))
        for entry, name in zip(line["arrays"], names):
            entry["tensor"] = name
        append(Path(state_dir) / LEDGER_FILE, line)


def state_events() -> Any:
    """pflower.store's record of what the personal-state store did in this process's
    task (the module the ClientApp imported: a worker imports the app after the
    SuperExec has imported ``pflower``, so both name the same one)."""
    from pflower.store import STATE_EVENTS

    return STATE_EVENTS


def _shape_and_dtype(array: Any) -> tuple[list[int], str]:
    """An Array's shape and dtype; a legacy (NumPyClient) tensor travels as .npy bytes
    with neither set, so they are read from its header (no decode of the values)."""
    if array.dtype or array.shape:
        return list(array.shape), str(array.dtype)
    try:
        stream = io.BytesIO(array.data)
        version = np.lib.format.read_magic(stream)
        read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
            version, np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(stream)
        return list(shape), str(dtype)
    except ValueError:
        return [], "?"


def _arrays(record_dict: Any) -> list[dict[str, Any]]:
    out = []
    for name, record in record_dict.array_records.items():
        for key, array in record.items():
            shape, dtype = _shape_and_dtype(array)
            out.append(
                {"name": f"{name}.{key}", "shape": shape, "dtype": dtype, "bytes": len(array.data)}
            )
    return out


def _unpacked(content: Any) -> Any:
    """The records as packed; a header that does not match its bytes is logged, and
    the packed bytes listed as one uint8 array, as they left (the ledger lists what
    left, whatever it is)."""
    from flwr.common import Array, ArrayRecord, RecordDict

    from pflower.packing import PACKED, packed_body, unpack

    try:
        return unpack(content)
    except ValueError as err:
        log.error("site ledger: a packed message's header does not match (%s)", err)
        body = packed_body(content)
        return RecordDict({PACKED: ArrayRecord({"body": Array("uint8", (len(body),), "", body)})})


def _scalars(records: dict[str, Any]) -> dict[str, Any]:
    """Every scalar a reply carries, by record and name, with its value (bytes by
    their size: no value of ours travels as bytes)."""
    out: dict[str, Any] = {}
    for name, record in records.items():
        for key, value in record.items():
            if isinstance(value, bytes):
                value = f"<{len(value)} bytes>"
            elif isinstance(value, list):
                value = f"<list of {len(value)}>"
            out[f"{name}.{key}"] = value
    return dict(sorted(out.items()))


def upload_names(run_config: dict[str, Any], node_config: NodeConfig, count: int) -> list[str]:
    """The names of the ``count`` arrays a fit sends, in the method's wire order (the
    approved app's registry, its model as the ClientApp built it); [] if unknown."""
    if not count:  # a refusal, an evaluation, a query: nothing to name (and no model built)
        return []
    try:
        from client_app.app import _template
        from methods import get_method, parse_run_config

        cfg = parse_run_config(dict(run_config))
        model = _template(cfg, node_config.data_path, node_config.cache_dir)
        method = get_method(cfg.method)
        names = [s.name for s in method.build_wire(model, method.roles(model, cfg), cfg).up_spec()]
        return names if len(names) == count else []
    except Exception:  # noqa: BLE001 - a refused or foreign app: positions only
        return []


def declared_disclosures(run_config: dict[str, Any]) -> list[str]:
    """The disclosure kinds the run's method declares for this config (the approved
    app's registry), or ``["?"]`` if it cannot be read."""
    try:
        from methods import get_method, parse_run_config

        cfg = parse_run_config(dict(run_config))
        return sorted({d.kind for d in get_method(cfg.method).disclosures(cfg)})
    except Exception:  # noqa: BLE001 - a refused or foreign app: nothing to ask
        return ["?"]


def ledger_line(
    reply: Any,
    received: Any,
    run_config: dict[str, Any],
    app: str,
    approved_any: bool = False,
    refused: str = "",
) -> dict[str, Any]:
    """One ledger entry: what this reply carried off the site."""
    meta = reply.metadata
    # a packed reply (pflower/packing.py) is listed array by array, as it was packed
    content = None if reply.has_error() else _unpacked(reply.content)
    arrays = [] if content is None else _arrays(content)
    # every scalar the reply carries (the legacy API keeps a fit's metrics in a config
    # record and its sample count in a metric record)
    metrics = (
        {} if content is None else _scalars({**content.metric_records, **content.config_records})
    )
    error = reply.error.reason if reply.has_error() else ""
    # what arrived packed is digested as unpacked: the same arrays, whether or not the
    # ClientApp's packing_mod has unpacked the message in place by now
    incoming = (
        []
        if received is None or not received.has_content()
        else [a for r in _unpacked(received.content).array_records.values() for a in r.values()]
    )
    sent = (
        [] if content is None else [a for r in content.array_records.values() for a in r.values()]
    )
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "app": app + (" (any app: not checked)" if approved_any else ""),
        "method": str(run_config.get("method", "?")),
        "round": str(getattr(received.metadata, "group_id", "") if received else meta.group_id),
        "type": str(meta.message_type),
        "arrays": arrays,
        "bytes": sum(a["bytes"] for a in arrays),
        # a digest of the arrays' bytes as they left, in order (what a server's reply log
        # can be matched against: the same bytes arrive as the fit's tensors)
        "sha256": hashlib.sha256(b"".join(a.data for a in sent)).hexdigest() if sent else "",
        "metrics": metrics,
        # what the server sent in: its size and a digest (which payload this site got)
        "received": {
            "bytes": sum(len(a.data) for a in incoming),
            "sha256": hashlib.sha256(b"".join(a.data for a in incoming)).hexdigest(),
        },
        "disclosures": [] if refused else declared_disclosures(run_config),
        "refused": bool(refused) or REFUSED in error,
        "error": (refused or error)[:300],
    }


def append(path: Path, line: dict[str, Any]) -> None:
    """Append one JSON line, whole or not at all (pflower.store.append_line)."""
    from pflower.store import append_line

    path.parent.mkdir(parents=True, exist_ok=True)
    append_line(path, (json.dumps(line, sort_keys=True) + "\n").encode())


def read_ledger(state_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(state_dir) / LEDGER_FILE
    if not path.exists():
        return []
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def what_left(entry: dict[str, Any]) -> str:
    """One entry in a few words: the tensors, the scalars with their values, an error."""
    if entry["refused"]:
        return f"refusal: {entry['error'][:100]}"
    if entry["error"]:
        return f"error: {entry['error'][:100]}"
    parts = [f"{len(entry['arrays'])} tensors"] if entry["arrays"] else []
    # Flower's reply status fields left out: every reply has them
    values = {k.split(".")[-1]: v for k, v in _metrics(entry).items() if ".status." not in k}
    shown = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()]
    parts += [", ".join(shown[:6]) + (f", +{len(shown) - 6} more" if len(shown) > 6 else "")]
    return "; ".join(p for p in parts if p) or "nothing"


def _metrics(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry's scalars (older ledgers list their names only)."""
    metrics = entry["metrics"]
    return metrics if isinstance(metrics, dict) else dict.fromkeys(metrics, "?")


def ledger_table(lines: Iterable[dict[str, Any]]) -> str:
    """The ledger as a table a security officer reads: one row a message answered,
    what left (tensors, values, an error), its bytes, the disclosures declared."""
    head = ["time", "run", "round", "type", "method", "bytes", "disclosed", "what left"]
    rows = [head]
    for e in lines:
        run = e.get("run_name") or str(e.get("run"))
        sent = e["bytes"] + (len(e["error"].encode()) if e["error"] else 0)
        disclosed = ",".join(e["disclosures"]) or "none"
        rows.append(
            [e["time"], run, e["round"] or "-", e["type"], e["method"], str(sent), disclosed]
            + [what_left(e)]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
