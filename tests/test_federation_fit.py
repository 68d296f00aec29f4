"""A bad config is refused once, at the start, in one line (#95): a federation that does
not fit the sites the data define (a natural partition's column), refused by ``check``,
by ``run`` before Flower starts and by the ServerApp before its first message (a bare
``flwr run .`` gets Flower's own federation of 2); what a simulated client still
refuses ends the run at its first refusal, in one line naming the key, exit 2; the
sites are named by the column's values."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import Message, Metadata, RecordDict
from flwr.common import Context

from client_app.errors import SiteError, errors_mod, name_site
from methods import parse_run_config
from pflower.config.refusal import (
    ClientConfigError,
    OneLineConfigErrors,
    refusal_in,
    stop_at_refusal,
)
from pflower.config.schema import ConfigError
from pflower.data.sites import _names, federation_fit_problem, site_name
from tests.helpers import bare_flwr_env
from tests.test_cli import dev_sh
from tests.test_flwr_run import _stop_local_superlink

ROOT = Path(__file__).resolve().parents[1]
SITES = ["cleveland", "hungary", "switzerland", "va-long-beach"]


def hospitals(path: Path, sites: list[str] = SITES, rows: int = 200, only_train: str = "") -> Path:
    """A CSV of ``rows`` records, a ``site`` column naming the hospital of each; with
    ``only_train`` a declared ``part`` column marks that site's rows all 'train'."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 2))
    site = [sites[i % len(sites)] for i in range(rows)]
    # a site's every fourth record is a test record (none at ``only_train``)
    nth = [i // len(sites) for i in range(rows)]
    part = ["train" if s == only_train or j % 4 else "test" for j, s in zip(nth, site)]
    label = (x[:, 0] + 0.5 * rng.normal(size=rows) > 0).astype(int)
    frame = {"site": site, "age": x[:, 0], "chol": x[:, 1], "part": part, "label": label}
    pd.DataFrame(frame).to_csv(path, index=False)
    return path


def natural(path: Path, *extra: str) -> str:
    keys = [f"dataset='{path}'", "partitioner='natural'", "partition-by='site'"]
    return " ".join([*keys, "method='fedavg'", "model='logreg'", *extra])


# ---------------------------------------------------------------- check and run, at once


def test_check_refuses_a_federation_that_does_not_fit_the_sites(tmp_path: Path, capsys) -> None:
    """The four hospitals under the project's default federation (100 SuperNodes) and
    under Flower's own default (2, what a bare `flwr run .` gets): exit 2, one line
    naming num-supernodes and the setting that fits; with 4 the sites are listed by name."""
    from pflower.cli.__main__ import check

    config = natural(hospitals(tmp_path / "h.csv"))
    proc = dev_sh("check", "--run-config", config, timeout=120)  # as a user types it
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("config error: num-supernodes=100,"), lines
    assert "(cleveland, hungary, switzerland, va-long-beach)" in lines[0]
    assert "96 SuperNodes would have no data" in lines[0]
    assert '--federation-config "num-supernodes=4"' in lines[0]
    assert check(["--run-config", config, "--federation-config", "num-supernodes=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "num-supernodes=2," in err and "2 of them would not train" in err, err
    assert check(["--run-config", config, "--federation-config", "num-supernodes=4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].strip() for ln in out[1:]] == [f"site {s}" for s in SITES]


def test_run_under_the_default_federation_stops_at_once_in_one_line(tmp_path: Path) -> None:
    """`bash scripts/dev.sh run` on the same CSV: exit 2 in seconds, before Flower
    starts (once 54,095 lines, 677 tracebacks, after 54 s)."""
    started = time.monotonic()
    proc = dev_sh(
        "run", "--run-config", natural(hospitals(tmp_path / "h.csv")), home=tmp_path / "home"
    )
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert took < 60 and len(out.splitlines()) <= 40 and "Traceback" not in out, out
    assert "num-supernodes=100" in proc.stderr and "SuperLink" not in out


# ------------------------------------------------------------------------ site names


def test_a_natural_partitions_sites_are_named_by_their_values() -> None:
    assert _names(("cleveland", "va long/beach"), "site") == ("cleveland", "va-long-beach")
    assert _names((0, 3), "centre") == ("centre-0", "centre-3")  # numbers name the column
    assert _names(("a b", "a/b"), "site") == ("client-0", "client-1")  # would collide
    cfg = parse_run_config({"dataset": "synthetic", "partitioner": "natural"})
    assert site_name(cfg, 3) == "client-3"  # the generator's clients have no column
    assert federation_fit_problem(cfg, 7) is None  # any count fits


def test_an_inprocess_run_names_each_client_by_its_site(tmp_path: Path) -> None:
    from pflower.engine.inprocess import run_inprocess

    raw = dict(x.split("=", 1) for x in natural(hospitals(tmp_path / "h.csv")).split())
    config = {k: v.strip("'") for k, v in raw.items()}
    config |= {"num-server-rounds": 1, "output-dir": str(tmp_path), "run-name": "r"}
    res = run_inprocess(config, 4)
    assert sorted(res["rounds"][-1]["per_client_accuracy"]) == SITES


# --------------------------------------------------------------- a client's refusal


def _message() -> Message:
    return Message(RecordDict(), metadata=Metadata(1, "", 1, 0, "", "3", 0.0, 60.0, "train"))


def _refusing(m: Message, c: Context) -> Message:
    name_site("va-long-beach")
    raise ConfigError("config key 'split-column': column 'part' lacks test rows")


def test_a_simulated_clients_config_error_is_its_one_line_reply_not_a_raise() -> None:
    simulated = Context(1, 1, {"partition-id": 3, "num-partitions": 4}, RecordDict(), {})
    reply = errors_mod(_message(), simulated, _refusing)
    assert reply.has_error()
    assert refusal_in(reply.error.reason) == (
        "site 'va-long-beach': config key 'split-column': column 'part' lacks test rows"
    )
    # a deployed site's error stays in its own log: the class of error only is sent
    deployed = Context(1, 1, {"site": "hospital-a"}, RecordDict(), {})
    with pytest.raises(SiteError, match="failed in train: ConfigError; the details stay"):
        errors_mod(_message(), deployed, _refusing)


def test_the_server_stops_at_the_first_refusal_whatever_flower_wrapped_around_it() -> None:
    line = "config error at site 'va': config key 'split-column': no test rows"
    flower = ValueError(
        f"Message contains an Error (reason: {line}). It originated during client-side "
        "execution of a message."
    )
    inprocess = RuntimeError(f"node 4: {line}")
    other = RuntimeError("node 2: site 'b' failed in train: OSError; the details stay")
    stop_at_refusal([other], "round 1")  # a crash is not a config refusal
    for failure in (flower, inprocess):
        with pytest.raises(ClientConfigError) as stopped:
            stop_at_refusal([other, failure], "round 2")
        assert str(stopped.value).startswith(
            "site 'va': config key 'split-column': no test rows (round 2;"
        )


def test_a_servers_config_error_is_logged_as_its_line_not_a_traceback() -> None:
    try:
        try:
            raise ConfigError("invalid run config: config key 'alpha': must be > 0")
        except ConfigError as err:
            raise RuntimeError("An error was encountered. Ending simulation.") from err
    except RuntimeError as err:
        record = logging.LogRecord("flwr", 40, "", 0, "%s raised", ("Simulation",), None)
        record.exc_info = (type(err), err, err.__traceback__)
    assert OneLineConfigErrors().filter(record)
    assert record.getMessage() == "config error: config key 'alpha': must be > 0"
    assert record.exc_info is None
    plain = logging.LogRecord("flwr", 40, "", 0, "boom", (), (None, None, None))
    OneLineConfigErrors().filter(plain)
    assert plain.getMessage() == "boom"


@pytest.mark.slow
def test_a_refusal_only_a_client_finds_ends_the_run_in_one_line_exit_2(tmp_path: Path) -> None:
    """66 hospitals (more than the pre-flight reads one by one), the last without a
    test row in its declared split column: the run stops at that client's refusal,
    exit 2, its last line naming the site and the key; no traceback, no flood."""
    sites = [f"s{i:02d}" for i in range(66)]
    path = hospitals(tmp_path / "h.csv", sites, rows=4 * 66, only_train="s65")
    config = natural(path, "split-column='part'", f"output-dir='{tmp_path}'", "run-name='r'")
    home = tmp_path / "home"
    try:
        proc = dev_sh(
            "run", "--run-config", config, "--federation-config", "num-supernodes=66", home=home
        )
    finally:
        _stop_local_superlink(home)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert len(out.splitlines()) <= 40 and "Traceback" not in out, out
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: site 's65': config key 'split-column'"), last
    assert "before round 1" in last  # the class-list query, before anything trained


@pytest.mark.slow
def test_with_a_supernode_a_site_the_run_completes_named_by_the_sites(tmp_path: Path) -> None:
    """...and `num-supernodes=4`: the run completes, its per-client results named by
    the sites' values; Flower's and Ray's notes are not printed (#95)."""
    path = hospitals(tmp_path / "h.csv")
    config = natural(path, "num-server-rounds=2", f"output-dir='{tmp_path}'", "run-name='r'")
    home = tmp_path / "home"
    try:
        proc = dev_sh(
            "run", "--run-config", config, "--federation-config", "num-supernodes=4", home=home
        )
    finally:
        _stop_local_superlink(home)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert sorted(res["rounds"][-1]["per_client_accuracy"]) == SITES
    assert res["outcome"]["participants"]["2"] == SITES
    assert "federation: 4 simulated SuperNodes (--federation-config)" in out
    assert "WARNING" not in out and "Warning" not in out, out


@pytest.mark.slow
@pytest.mark.flower142
def test_a_bare_flwr_run_on_flowers_default_federation_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """`flwr run .` with no federation config gets Flower's own default federation (2
    SuperNodes, both Flower lines): the ServerApp refuses it before any message,
    naming num-supernodes, where it trained 2 of the 4 hospitals and exited 0."""
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or shutil.which("flwr")
    home = tmp_path / "home"
    env = bare_flwr_env(home)
    config = natural(hospitals(tmp_path / "h.csv"), f"output-dir='{tmp_path}'")
    cmd = [flwr, "run", ".", "--stream", "--run-config", config]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        _stop_local_superlink(home)
    out = proc.stdout + proc.stderr
    refused = [ln for ln in out.splitlines() if "config error: num-supernodes=2" in ln]
    assert len(refused) == 1, out[-3000:]
    assert '--federation-config "num-supernodes=4"' in refused[0]
    assert "Traceback" not in out and "configure_fit" not in out and len(out.splitlines()) <= 40
    # Ray's GPU-variable FutureWarning is gone at its cause (client_app/devices.py);
    # Flower's note on its own default is dropped where it is logged, before any of the
    # app loads (pflower/flower_notes.py)
    assert "FutureWarning" not in out
    warned = [ln for ln in out.splitlines() if "warn" in ln.lower()]
    assert not warned, warned


class _Grid:
    """Flower's simulated grid as the ServerApp sees it: the nodes registered so far."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))


def test_the_serverapp_checks_the_federation_before_its_first_message(tmp_path, caplog) -> None:
    """What the pre-flight checks, for a bare `flwr run .` (no pre-flight): the sites'
    count, the keys that need clients; and, where any count works, which federation
    runs when it is not the project's (scripts/federation.toml)."""
    from server_app.site_info import check_simulated_federation

    path = hospitals(tmp_path / "h.csv")
    cfg = parse_run_config(
        {"dataset": str(path), "partitioner": "natural", "partition-by": "site", "model": "logreg"}
    )
    with pytest.raises(ConfigError, match=r"num-supernodes=2, but partition-by='site' gives 4"):
        check_simulated_federation(_Grid(2), cfg)
    check_simulated_federation(_Grid(4), cfg)
    embedded = parse_run_config({"method": "fedfac-static", "min-available-clients": 3})
    with pytest.raises(ConfigError, match="config key 'min-available-clients': 3"):
        check_simulated_federation(_Grid(2), embedded)
    caplog.set_level(logging.INFO, logger="flwr.pflower")
    check_simulated_federation(_Grid(2), parse_run_config({"method": "fedfac-static"}))
    assert "federation: 2 simulated SuperNodes; the project's default federation has 100" in (
        caplog.text
    )
