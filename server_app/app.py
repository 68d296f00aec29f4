"""The ServerApp: validated config -> model -> method -> strategy -> results."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

from flwr.common import Context
from flwr.server import Grid, LegacyContext, ServerApp, ServerAppComponents, ServerConfig
from flwr.server.compat import start_grid
from flwr.server.workflow import DefaultWorkflow
from threadpoolctl import threadpool_limits

import pflower.patches
from methods import get_method, parse_run_config
from pflower.config.refusal import one_line_config_errors
from pflower.config.schema import ConfigError, check_against_data, data_source, describe_settings
from pflower.data import data_info
from pflower.privacy.secagg import SignedSecAggPlusWorkflow
from pflower.results import RunRecorder
from server_app import site_info
from server_app.grid import PollingGrid
from server_app.method_strategy import build_method_strategy
from server_app.nodes import run_simulated, simulated_grid
from strategies import checkpoint, outcome
from strategies.reply_log import ReplyLog

log = logging.getLogger("flwr.pflower")
pflower.patches.linkstate_index()  # simulation: the engine runs in this process (pflower.patches)
pflower.patches.engine_wakeups()  # after linkstate-index: it wraps what that stores
pflower.patches.object_retries()  # deployed: replies' parts asked for again soon
pflower.patches.npy_headers()  # each reply's tensors read without parsing their headers again
pflower.patches.ray_when_the_engine_starts()  # simulation: the ClientApp sent to actors once
one_line_config_errors()  # a bad config: its one line in Flower's log, not a traceback


class _NoEvaluateEachRound(logging.Filter):
    """With eval-in-fit, Flower's legacy loop says 'configure_evaluate: no clients
    selected, skipping evaluation' every round: by design here, so not shown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "configure_evaluate: no clients selected" not in record.getMessage()


def build_server(context: Context, overrides: dict[str, Any] | None = None) -> ServerAppComponents:
    raw = {**context.run_config, **(overrides or {})}
    cfg = parse_run_config(raw)
    resolved = checkpoint.latest(cfg)  # resume-from="latest": this run's own checkpoint
    if resolved:
        raw.update(resolved)
        cfg = parse_run_config(raw)
    if cfg.eval_in_fit and not any(
        isinstance(f, _NoEvaluateEachRound) for f in logging.getLogger("flwr").filters
    ):
        logging.getLogger("flwr").addFilter(_NoEvaluateEachRound())
    log.info("%s", describe_settings(cfg))
    method = get_method(cfg.method)
    info = data_info(cfg)
    check_against_data(cfg, info.num_classes)
    model = method.build_model(cfg, info)
    roles = method.roles(model, cfg)
    recorder = RunRecorder(cfg, extra={"auto_resolved": list(cfg.auto_resolved)})
    checkpoint.clear_stale_personal_state(recorder.dir, cfg.resume_from)
    on = data_source(cfg)  # a deployed server reads no data when the run declares the shape
    if cfg.input_shape:
        on = f"{on} (input shape {cfg.input_shape})"
    strategy = build_method_strategy(method, cfg, model, recorder)
    log.info(
        "%s on %s (%s): %d shared / %d personal tensors; aggregation %s; results -> %s",
        cfg.method,
        on,
        cfg.model,
        len(roles.shared),
        len(roles.personal),
        f"held: {strategy.held_reason}" if strategy.held_reason else "streamed",
        recorder.dir,
    )
    if cfg.reply_log:  # strategies/reply_log.py
        if strategy.held_reason:
            raise ConfigError(
                "config key 'reply-log': the log holds streamed rounds (a mean of the "
                "replies); this run's aggregation is held (SecAgg+, DP, a robust rule, or "
                "the method's own)"
            )
        strategy.reply_log = ReplyLog(recorder.dir, int(context.run_id))
    if cfg.resume_from:
        strategy.resume(cfg.resume_from)
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(
            num_rounds=cfg.num_server_rounds, round_timeout=cfg.round_timeout or None
        ),
    )


def make_server_app(overrides: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``overrides`` over Flower's run config
    (for ``flwr.simulation.run_simulation``, which takes no run config).

    Plain runs go through Flower's legacy round loop, exactly as a ``server_fn``
    ServerApp does; ``secure-aggregation=true`` runs the same strategy inside
    Flower's DefaultWorkflow with the SecAgg+ fit workflow, so the strategy gets
    the unmasked sum of the uploads in place of each client's own."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        pflower.patches.serverapp_after_ray()  # each simulation: Ray forks first, alone
        grid = PollingGrid(grid)  # one collector, polling faster than Flower's own (grid.py)
        # simulated, the clients train on this machine's cores while this process folds
        # their replies, and BLAS's idle threads would spin against them
        # (docs/notes/2026-11-28-blas-threads-and-one-client-per-thread.md measured it)
        simulated = not site_info.deployed(grid)
        with threadpool_limits(limits=1, user_api="blas") if simulated else nullcontext():
            _run(grid, context, overrides)

    return app


def _run(grid: Grid, context: Context, overrides: dict[str, Any] | None) -> None:
    """The run: its config (the sites' data where they declare it), then Flower's
    round loop, or SecAgg+'s workflow, with the run's strategy; judged at its end."""
    # deployed with no input shape: the sites' data give it (server_app/site_info.py)
    raw = {**context.run_config, **(overrides or {})}
    if parse_run_config(raw).local_training == "cohort":  # no ClientApp message to batch
        raise ConfigError(
            "config key 'local-training': 'cohort' runs in the in-process engine only "
            "(python -m benchmarks, pflower.engine.inprocess); a Flower simulation or a "
            "deployment trains each client in its own ClientApp ('per-client')"
        )
    if not site_info.deployed(grid):  # the sites its data define: before any message
        site_info.check_simulated_federation(grid, parse_run_config(raw))
    declared, answers = site_info.from_sites(grid, parse_run_config(raw))
    try:
        components = build_server(context, {**(overrides or {}), **declared})
    except checkpoint.RunComplete as done:  # started again after its last checkpoint
        log.info("resume-from latest: %s", done)
        return
    strategy = components.strategy
    if answers and not strategy.cfg.class_names.strip():  # their class lists came too
        strategy.class_lists.check(1, answers, before=True)
        strategy.class_lists.asked = True
    if site_info.deployed(grid) and strategy.recorder is not None:
        strategy.recorder.data_at_sites = True  # results.json names them, not 'synthetic'
    if declared and strategy.recorder is not None:
        strategy.recorder.extra["data_source"] = {"declared_by": "the sites", **declared}
    cfg = components.strategy.cfg  # the run config build_server validated
    if not cfg.secure_aggregation:
        if simulated_grid(grid):  # a federation of numbers, no proxy a node (server_app/nodes.py)
            run_simulated(grid, components.config, components.strategy)
        else:
            start_grid(grid=grid, config=components.config, strategy=components.strategy)
        outcome.judge(components.strategy)  # a failed run raises: finished:failed
        return
    legacy = LegacyContext(context, config=components.config, strategy=components.strategy)
    secagg = SignedSecAggPlusWorkflow(
        num_shares=_count(cfg.secagg_num_shares),
        reconstruction_threshold=_count(cfg.secagg_reconstruction_threshold),
        max_weight=cfg.secagg_max_weight,
        clipping_range=cfg.secagg_clipping_range,
        quantization_range=cfg.secagg_quantization_range,
    )
    log.info(
        "secure aggregation (SecAgg+, %s): the server sees only the sum of the uploads; "
        "values clipped to +-%g, %d quantization levels",
        pflower.patches.SECAGG_PROTOCOL,
        cfg.secagg_clipping_range,
        cfg.secagg_quantization_range,
    )
    DefaultWorkflow(fit_workflow=secagg)(grid, legacy)
    outcome.judge(components.strategy)


def _count(value: float) -> int | float:
    """Flower reads a share count > 1 as a number of clients, <= 1 as a fraction."""
    return int(value) if value > 1 else float(value)


app = make_server_app()
