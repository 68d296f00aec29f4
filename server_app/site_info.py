"""The data a deployed run trains on, as its sites declare it.

A deployed server holds no data. When the run config gives no ``input-shape``, the
ServerApp asks every connected site (a properties query, ``data-info``) for the
input shape and class count its own data give (client_app/site_data.py), builds
the model from their answer, and refuses, before round 1 and naming the sites,
sites whose data disagree. In simulation (an in-memory grid) nothing is asked:
the server reads ``dataset`` as before.
"""

from __future__ import annotations

import logging
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.server.compat.grid_client_proxy import GridClientProxy

from client_app.site_data import ASK_DATA_INFO, CLASSES_COUNT_KEY, SHAPE_KEY
from models.roles import CLIENT_KEY
from pflower.config.schema import ConfigError, RunConfig
from pflower.data.sites import data_sites, federation_fit_problem, size_problem
from strategies.replies import ClassLists, Reply, ask_properties

if TYPE_CHECKING:
    from server_app.grid import PollingGrid

log = logging.getLogger("flwr.pflower")
# the project's default federation (in the app: flwr run ships scripts/ with it)
PROJECT_FEDERATION = Path(__file__).resolve().parents[1] / "scripts" / "federation.toml"


def deployed(grid: PollingGrid) -> bool:
    """Whether ``grid`` talks to a SuperLink, not to an in-memory engine."""
    return grid.deployed()


def wait_for_sites(grid: Any, count: int, timeout: float) -> list[int]:
    """The connected nodes once ``count`` are (or whatever is there at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1.0)


def ask_sites(grid: Any, cfg: RunConfig) -> tuple[dict[str, tuple[str, int]], list[Reply]]:
    """Each answering site's (input shape, class count) by client key, and its whole
    answer (with its class-list digest: the run's class-list check needs no query of
    its own)."""
    timeout = float(cfg.round_timeout or 600)
    nodes = wait_for_sites(grid, cfg.min_available_clients, timeout)
    answers: dict[str, tuple[str, int]] = {}
    replies: list[Reply] = []
    proxies = [GridClientProxy(node, grid, grid.run.run_id) for node in nodes]
    asked = ask_properties(proxies, {ASK_DATA_INFO: True}, timeout, 0, ClassLists.workers)
    for proxy, res in asked:
        if isinstance(res, Exception):  # a refusal, a crash: its first fit will say
            log.warning("node %d: no data info before round 1 (%s)", proxy.node_id, str(res)[:200])
            continue
        shape, classes = res.properties.get(SHAPE_KEY), res.properties.get(CLASSES_COUNT_KEY)
        key = str(res.properties.get(CLIENT_KEY) or proxy.node_id)
        replies.append(Reply(key, [], 0, dict(res.properties)))
        if shape:
            answers[key] = (str(shape), int(classes or 0))
    return answers, replies


def from_sites(grid: Any, cfg: RunConfig) -> tuple[dict[str, Any], list[Reply]]:
    """Run-config values the sites' data give (``input-shape``, and ``num-classes``
    unless the run names its classes), or {} when the run declares its shape, runs
    in memory, or no site answers; and the sites' answers (for the class-list check).
    ConfigError naming the sites when they disagree (each site builds its model from
    its own data: they must all agree)."""
    if cfg.input_shape or not deployed(grid):
        return {}, []
    answers, replies = ask_sites(grid, cfg)
    if not answers:
        return {}, replies
    # each site's ClientApp builds its model from its own data: every site must agree
    found: dict[tuple[str, int], list[str]] = {}
    for key, answer in sorted(answers.items()):
        found.setdefault(answer, []).append(key)
    if len(found) > 1:
        sides = "; ".join(
            f"{', '.join(keys)}: input shape {shape}, {classes} classes"
            for (shape, classes), keys in found.items()
        )
        raise ConfigError(
            "config key 'input-shape' is not given and the sites' data disagree "
            f"({sides}); nothing was trained. Give each site the same columns (its own "
            "--label-column, --feature-columns, --categorical-columns)"
        )
    ((shape, classes),) = found
    values: dict[str, Any] = {"input-shape": shape}
    if not cfg.class_names.strip() and not cfg.num_classes:
        values["num-classes"] = classes
    log.info(
        "the sites' own data (%s): input shape %s, %d classes", ", ".join(answers), shape, classes
    )
    return values, replies


def simulated_nodes(grid: Any, settle: float = 0.2, limit: float = 10.0) -> int:
    """How many SuperNodes the simulation has: Flower starts the ServerApp while it
    registers them, so the count is read once it stops growing."""
    deadline, count = time.monotonic() + limit, -1
    while True:
        now = len(grid.get_node_ids())
        if (now and now == count) or time.monotonic() > deadline:
            return now
        count = now
        time.sleep(settle)


def check_simulated_federation(grid: Any, cfg: RunConfig) -> None:
    """Before the first message of a simulation, what the pre-flight of ``bash
    scripts/dev.sh run`` checks: ConfigError naming the key when the federation's size
    does not fit the run's keys (``min-available-clients``, a method's own), or naming
    ``num-supernodes`` when it does not fit the sites the data define (a natural
    partition's column, ``client-data-paths``: pflower/data/sites.py). Else, when it is
    not the project's default federation (a bare ``flwr run .`` gets Flower's own, of
    2), one line saying which it is and how to ask for the project's."""
    nodes = simulated_nodes(grid)
    problem = size_problem(cfg, nodes) or federation_fit_problem(cfg, nodes)
    if problem:
        raise ConfigError(problem)
    if data_sites(cfg) is not None:
        return  # the data define the sites, and the federation fits them
    try:
        wanted = tomllib.loads(PROJECT_FEDERATION.read_text())["num-supernodes"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return  # installed without the project's scripts/
    if nodes != wanted:
        log.info(
            "federation: %d simulated SuperNodes; the project's default federation has %d "
            '(scripts/federation.toml): flwr run . --federation-config "num-supernodes=%d", '
            "or bash scripts/dev.sh run",
            nodes,
            wanted,
            wanted,
        )
