"""Pre-flight: the run config Flower will build, validated, then what the run will
do first, done once: load the data and the first client's share, build the model
and its strategy, pass a batch through the model, load the checkpoint to resume.

A bad key fails before any of that, in about a second (nothing heavy is imported
until the keys are valid); every failure is one line naming the key (ConfigError).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from methods import foreign_keys, parse_run_config
from pflower.config.schema import RESUME_LATEST, ConfigError, RunConfig, check_against_data

MAX_CHECKED_SITES = 64  # a natural partition's sites the pre-flight reads one by one


def flwr_run_config(project_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """The run config ``flwr run`` would send: the app's defaults fused with the
    ``--run-config`` overrides, by Flower's own functions."""
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    try:
        parsed = parse_config_args(overrides or None)
    except Exception as err:  # noqa: BLE001 - click's exception carries the message
        message = override_problem(overrides) or getattr(err, "message", None) or str(err)
        raise ConfigError(f"--run-config: {message}") from None
    try:
        return get_fused_config_from_dir(project_dir, parsed)
    except ValueError as err:  # a key the app does not define
        from methods import registry
        from pflower.config.schema import known_keys, unknown_key

        key = str(err).split("'")[1] if "'" in str(err) else str(err)
        raise ConfigError(unknown_key(key, known_keys(registry()))) from None


def user_keys(overrides: list[str]) -> list[str]:
    """The keys the ``--run-config`` overrides set (a TOML file's or strings')."""
    from flwr.common.config import parse_config_args

    return list(parse_config_args(overrides or None)) if overrides else []


def override_problem(overrides: list[str]) -> str | None:
    """What Flower's "invalid format" means, naming the key: a key given twice in
    one --run-config, or a value that is not a TOML value (an unquoted string)."""
    import re
    import tomllib

    pair = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")  # Flower's own pattern
    for line in overrides:
        seen: set[str] = set()
        for key, value in pair.findall(line):
            if key in seen:
                return f"config key '{key}' is given twice in one --run-config: give it once"
            seen.add(key)
            try:
                tomllib.loads(f"{key} = {value}")
            except tomllib.TOMLDecodeError:
                return (
                    f"config key '{key}': {value} is not a number, true/false or a quoted "
                    f"string: quote it, {key}='{value}'"
                )
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:240] if text else type(err).__name__


def _as_config_error(err: Exception, key: str) -> ConfigError:
    """The failure as one line naming a key (its own key if its message names one)."""
    message = _first_line(err)
    if "config key '" in message:
        return ConfigError(message.split("invalid run config: ")[-1])
    return ConfigError(f"config key '{key}': {type(err).__name__}: {message}")


def federation_checks(cfg: RunConfig, clients: int | None) -> None:
    """Keys that must fit the federation's size (``num-supernodes``), when known."""
    from pflower.data.sites import size_problem

    problem = size_problem(cfg, clients) if clients is not None else None
    if problem:
        raise ConfigError(problem)


def resume_checks(cfg: RunConfig) -> str:
    """``resume-from`` names a checkpoint of this method (the strategy later checks
    that it fits the model), ``latest`` this run-name's own if it has one; the round the
    run will start at, in words ("" when it does not resume)."""
    if not cfg.resume_from:
        return ""
    from strategies.checkpoint import (
        RunComplete,
        checkpoint_path,
        latest,
        load_server_state,
    )

    if cfg.resume_from.strip() == RESUME_LATEST:
        try:
            concrete = latest(cfg)
        except RunComplete as done:
            raise ConfigError(f"config key 'resume-from': latest: {done}") from None
        if not concrete.get("resume-from"):
            return "resume-from latest: no checkpoint yet, so the run starts at round 1"
        done, _ = load_server_state(checkpoint_path(concrete["resume-from"]), cfg.method)
        return f"resuming at round {done + 1} of {cfg.num_server_rounds} (resume-from latest)"
    done, _ = load_server_state(checkpoint_path(cfg.resume_from), cfg.method)
    return (
        f"resuming at round {done + 1}: {cfg.num_server_rounds} more rounds, to round "
        f"{done + cfg.num_server_rounds} (resume-from a run directory counts the rounds left)"
    )


def roster_checks(cfg: RunConfig) -> None:
    """``roster`` names a readable roster with a node id for every site."""
    if cfg.roster:
        from strategies.roster import load_roster

        load_roster(cfg.roster)


def pretrained_checks(cfg: RunConfig) -> None:
    """``pretrained-weights='imagenet'`` needs torchvision's weights: cached, or a
    reachable download. Without them the run would train from random init."""
    if cfg.pretrained_weights != "imagenet":
        return
    from models.backbones import imagenet_weights_problem

    problem = imagenet_weights_problem()
    if problem:
        raise ConfigError(f"config key 'pretrained-weights': {problem}")


def data_checks(cfg: RunConfig, clients: int | None) -> tuple[str, Any]:
    """Load what the run will load: the data set's shape and classes, and the first
    client's share as the first client will (its partition, its labels), so that a
    missing or foreign file, an empty folder, a hub name offline, a partitioner the
    data cannot serve or data that do not fit the declared ``input-shape`` /
    ``num-classes`` are config errors naming the key. Returns a short description of
    the data and that client's data."""
    import datasets

    from pflower.data import check_site_data, data_info, declared_info, load_client_data
    from pflower.data.sites import data_sites, federation_fit_problem

    datasets.disable_progress_bars()  # the pre-flight prints one line
    declared = declared_info(cfg)
    if clients is None:  # a deployment: the data are at the sites, not here
        where = "checked by each site (python -m deploy.site --check)"
        if declared is not None:
            shape = "x".join(map(str, declared.input_shape))
            return f"declared ({declared.num_classes} classes, {shape}), {where}", (declared, None)
        return (
            f"at the sites, each its own --data-path (a site without one reads "
            f"dataset={cfg.dataset!r} by its partition-id); the server asks them their input "
            f"shape and classes before round 1; {where}"
        ), (None, None)
    paths = [p.strip() for p in cfg.client_data_paths.split(",") if p.strip()]
    key = "client-data-paths" if paths else "dataset"
    try:
        for path in paths:  # each site's own data
            Path(path).expanduser().resolve(strict=True)
        info = data_info(cfg)
        problem = federation_fit_problem(cfg, clients) if clients is not None else None
        if problem:  # the sites the data define against the federation's size
            raise ConfigError(problem)
        sites = data_sites(cfg)
        n = clients or (len(sites[1]) if sites else 1)
        data = load_client_data(cfg, 0, n)
        check_site_data(cfg, data, "the first client")
        site_lines = every_site(cfg, sites[1], n, data) if sites and len(sites[1]) > 1 else []
    except ConfigError:
        raise
    except MemoryError as err:  # the generated study's teachers, or a decoded data set
        which = "hidden-dim" if cfg.dataset == "synthetic" and not paths else key
        raise ConfigError(
            f"config key '{which}': the data do not fit in memory ({_first_line(err)})"
        ) from None
    except (FileNotFoundError, OSError, ValueError, RuntimeError, KeyError, IndexError) as err:
        raise _as_config_error(err, key) from None
    source = ", ".join(paths) if paths else cfg.dataset
    shape = "x".join(map(str, info.input_shape))
    sites = "".join(f"\n  {line}" for line in site_lines)
    return f"{source} ({info.num_classes} classes, {shape}){sites}", (info, data)


def every_site(cfg: RunConfig, sites: tuple[str, ...], clients: int, first: Any) -> list[str]:
    """Every site (a path of ``client-data-paths``, or a natural partition's site, by
    name) loaded as its client will (in parallel threads) and checked against the run,
    then the sites' class names compared (pflower.data.compare_site_classes). Each site
    is read whole, as its client reads it: a sample would pass a site whose other files
    fail. One line per site: its sample counts and class name -> label id (a class it
    lacks is listed as such). ``first``: site 0's data, already loaded and checked by
    the caller. A natural partition of more than MAX_CHECKED_SITES sites (a writer a
    site) is checked at its first site only: its clients check their own."""
    from concurrent.futures import ThreadPoolExecutor

    from pflower.data import (
        check_site_data,
        class_ids,
        compare_site_classes,
        load_client_data,
        run_class_names,
        site_class_names,
    )

    if not cfg.client_data_paths.strip() and len(sites) > MAX_CHECKED_SITES:
        return [f"{len(sites)} sites ({', '.join(sites[:3])}, ...): the first checked"]
    paths = cfg.client_data_paths.strip()
    key = "client-data-paths" if paths else "dataset"

    def one(i: int) -> tuple[str, Any, tuple[str, ...]]:
        where = f"site {i} ({Path(sites[i]).name})" if paths else f"site {sites[i]}"
        try:
            data = first if i == 0 else load_client_data(cfg, i, clients)
            check_site_data(cfg, data, where)
            return where, data, site_class_names(cfg, i, clients)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        except (FileNotFoundError, OSError, ValueError, RuntimeError, KeyError) as err:
            raise ConfigError(f"{where}: {_as_config_error(err, key)}") from None

    with ThreadPoolExecutor(max_workers=min(4, len(sites))) as pool:
        loaded = list(pool.map(one, range(len(sites))))
    compare_site_classes(cfg, [(where, names) for where, _, names in loaded])
    lines = []
    for where, data, names in loaded:
        ids = " ".join(f"{n}->{i}" for n, i in class_ids(cfg, names).items())
        lacks = [n for n in run_class_names(cfg) if n not in names]
        missing = f" (lacks {', '.join(lacks)})" if lacks else ""
        counts = f"{data.num_train} train / {len(data.y_test)} test"
        lines.append(f"{where}: {counts}; classes {ids or 'integer labels'}{missing}")
    return lines


def model_checks(cfg: RunConfig, info: Any, data: Any) -> None:
    """Build the method's model and its strategy as the run will, pass a batch of the
    first client's data through the model, and load ``resume-from`` into the
    strategy: a model that cannot take the data (an image model on the generated
    vectors, images too small for it, a layer too large to allocate) or a checkpoint
    that does not fit is a config error naming the key. Imports torch (a few seconds),
    after every key has been checked."""
    import torch

    from methods import get_method

    method = get_method(cfg.method)
    try:
        model = method.build_model(cfg, info)
        model.eval()
        has_data = data is not None and len(data.x_train)
        batch = data.x_train[:2] if has_data else torch.zeros((2, *info.input_shape))
        with torch.no_grad():
            model(batch)
    except ConfigError:
        raise  # a method's own check (FedFac's fedfac.fa-layers) names its key
    except Exception as err:  # noqa: BLE001 - any failure here is the run's first crash
        message = _first_line(err)
        if isinstance(err, MemoryError) or "allocat" in message.lower():
            raise ConfigError(
                f"config key 'hidden-dim': model '{cfg.model}' with hidden-dim "
                f"{cfg.hidden_dim} does not fit in memory ({type(err).__name__})"
            ) from None
        shape = info.input_shape
        kind = "vectors of" if len(shape) == 1 else "inputs of shape"
        raise ConfigError(
            f"config key 'model': '{cfg.model}' cannot take the data's {kind} "
            f"{shape if len(shape) > 1 else shape[0]} (dataset={cfg.dataset!r}): "
            f"{type(err).__name__}: {message[:160]}"
        ) from None
    if cfg.resume_from:
        from server_app.method_strategy import build_method_strategy
        from strategies.checkpoint import latest

        # 'latest': this run-name's checkpoint, where it has one (resume_checks)
        where = latest(cfg).get("resume-from", cfg.resume_from)
        if where:
            build_method_strategy(method, cfg, model).resume(where)


def preflight(
    project_dir: Path, overrides: list[str], clients: int | None = None
) -> tuple[RunConfig, dict[str, Any], str]:
    """(validated config, raw config, data description) for a federation of
    ``clients`` (None: unknown, a deployment); ConfigError on a bad one, or on a
    Flower or torch version the project's patches were not checked against."""
    import pflower.patches

    try:
        pflower.patches.check()
    except pflower.patches.UntestedVersion as err:
        raise ConfigError(str(err)) from None
    raw = flwr_run_config(project_dir, overrides)
    cfg = parse_run_config(raw)
    # flwr run sends every method's keys with their defaults: judge the ones the user set
    problems = foreign_keys([cfg.method], user_keys(overrides))
    if problems:
        raise ConfigError(problems[0])
    if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "config key 'tensorboard': true needs the tensorboard package "
            "(pip install -e '.[tensorboard]')"
        )
    federation_checks(cfg, clients)
    resuming = resume_checks(cfg)
    roster_checks(cfg)
    pretrained_checks(cfg)
    described, (info, data) = data_checks(cfg, clients)
    described = f"{described}; {resuming}" if resuming else described
    if info is not None:  # else a deployment's sites give the shape (server_app/site_info.py)
        check_against_data(cfg, info.num_classes)
        model_checks(cfg, info, data)
    return cfg, raw, described
