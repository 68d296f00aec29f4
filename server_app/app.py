"""The ServerApp: validated config -> model -> method -> strategy -> results."""

from __future__ import annotations

import logging
from typing import Any

from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from methods import get_method
from pfl_data import data_info
from run_config.schema import (
    auto_resolved,
    check_against_data,
    describe_settings,
    parse_run_config,
)
from run_results import RunRecorder

log = logging.getLogger("flwr.pflower")


def build_server(context: Context, overrides: dict[str, Any] | None = None) -> ServerAppComponents:
    raw = {**context.run_config, **(overrides or {})}
    cfg = parse_run_config(raw)
    auto = auto_resolved(raw)
    log.info("%s", describe_settings(cfg, auto))
    method = get_method(cfg.method)
    info = data_info(cfg)
    check_against_data(cfg, info.num_classes)
    model = method.build_model(cfg, info)
    roles = method.roles(model)
    recorder = RunRecorder(cfg, extra={"auto_resolved": auto})
    log.info(
        "%s on %s (%s): %d shared / %d personal tensors; results -> %s",
        cfg.method,
        cfg.dataset,
        cfg.model,
        len(roles.shared),
        len(roles.personal),
        recorder.dir,
    )
    strategy = method.build_strategy(cfg, model, recorder)
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
    (for ``flwr.simulation.run_simulation``, which takes no run config)."""

    def server_fn(context: Context) -> ServerAppComponents:
        return build_server(context, overrides)

    return ServerApp(server_fn=server_fn)


app = make_server_app()
