"""The command line a researcher scripts: pre-flight, exit status, the
project's Flower config (scripts/dev.sh check|run, pflower.cli)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflower.cli.__main__ import (
    federation_config,
    federation_values,
    foreign_superlink,
    results_status,
    split_args,
)
from pflower.engine.inprocess import run_inprocess
from tests.helpers import local_superlink_env
from tests.test_flwr_run import _stop_local_superlink

ROOT = Path(__file__).resolve().parents[1]


def dev_sh(
    *args: str, home: Path | None = None, timeout: int = 400, **extra_env: str
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "VENV": str(Path(sys.executable).parent.parent),
        "PFLOWER_SKIP_SETUP": "1",
    }
    if home is not None:
        env.update(local_superlink_env(home))
    env.update(extra_env)  # over those: a test may name the port itself
    return subprocess.run(
        ["bash", "scripts/dev.sh", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("command", "run_config", "key"),
    [
        ("check", "alpha=-1", "'alpha'"),
        ("check", "num-server-rounds='x'", "'num-server-rounds'"),
        ("check", "no-such-key=1", "'no-such-key'"),
        # #62: the closest key reaches the CLI (Flower's fused config refuses it first)
        ("check", "method='fedcp' mmd-lambda=5", "did you mean 'fedcp.mmd-lambda'"),
        ("check", "local-epoch=5", "did you mean 'local-epochs'"),
        ("run", "method='fedcp' mmd-lambda=5", "did you mean 'fedcp.mmd-lambda'"),
        ("check", "{probe}/typo.toml", "did you mean 'local-epochs'"),  # a TOML file
        # #46: accepted before, and it did nothing (flwr sends every method's defaults:
        # only the keys the user sets are judged)
        ("check", "method='fedavg' fedcp.mmd-lambda=5", "'fedcp.mmd-lambda' belongs to fedcp"),
        ("check", "dataset='../no/such.parquet'", "'dataset'"),
        ("check", "method='feddecomp' local-epochs=1", "'local-epochs'"),
        ("check", "method='fedfac-static' fedfac.fa-layers='features.0'", "'fedfac.fa-layers'"),
        # the model on one dummy batch of the data's shape (#36: these passed, then crashed)
        ("check", "method='feddecomp' model='resnet8'", "'model'"),  # vectors, image model
        ("check", "model='cnn4' dataset='sklearn-digits'", "'model'"),  # 8x8: too small
        ("check", "method='fedcp' model='cnn4'", "'model'"),
        ("run", "alpha=-1", "'alpha'"),  # run stops before anything of Flower starts
        # #36: each of these passed check, then crashed or misbehaved at run time
        ("check", "dataset='mydata/cifar10'", "'dataset'"),  # a missing path, not a hub name
        ("check", "dataset='{probe}/data.csv'", "'dataset'"),
        ("check", "dataset='{probe}/empty'", "'dataset'"),
        ("check", "model='cnn4' dataset='{probe}/tiny4'", "'dataset'"),  # 6 images, 10 clients
        (
            "check",
            "dataset='sklearn-digits' partitioner='natural' partition-by='writer'",
            "'partition-by'",
        ),
        ("check", "resume-from='/nope'", "'resume-from'"),
        ("check", "min-available-clients=150", "'min-available-clients'"),
        (
            "check",
            "model='resnet18' pretrained-weights='imagenet' dataset='sklearn-digits'",
            "'pretrained-weights'",
        ),
        ("check", "hidden-dim=1000000000", "'hidden-dim'"),
        ("check", "method='fedfac-static' model='resnet18'", "'model'"),
        ("check", "input-shape='3,32,32' num-classes=2", "'input-shape'"),  # the data are vectors
        ("check", "num-classes=3 class-names='a,b'", "'num-classes'"),
        ("check", "method='fedfac-static' fedfac.new-clients=100", "'fedfac.new-clients'"),
    ],
)
def test_a_bad_config_fails_fast_with_one_line_and_exit_2(
    command, run_config, key, bad_data: Path
) -> None:
    proc = dev_sh(command, "--run-config", run_config.replace("{probe}", str(bad_data)), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("config error:") and key in lines[0], lines
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "SuperLink" not in proc.stdout  # fast: Flower was never started


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CSV, an empty folder and an image folder of six 4x4 images."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("bad-data")
    (root / "data.csv").write_text("x,label\n1,0\n")
    (root / "typo.toml").write_text("local-epoch = 5\n")
    (root / "empty").mkdir()
    for name in ("a", "b"):
        (root / "tiny4" / name).mkdir(parents=True)
        for i in range(3):
            pixels = np.full((4, 4, 3), 40 * i, dtype=np.uint8)
            Image.fromarray(pixels).save(root / "tiny4" / name / f"{i}.png")
    return root


@pytest.mark.parametrize(
    ("federation", "message"),
    [("num-supernodes=0", "num-supernodes"), ("num-supernode=3", "num_supernode")],
)
def test_check_validates_the_federation_config(federation: str, message: str) -> None:
    proc = dev_sh("check", "--federation-config", federation, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stderr.startswith("config error: --federation-config")
    # and the federation's size is what the run-config keys are checked against
    proc = dev_sh(
        "check",
        "--run-config",
        "min-available-clients=20",
        "--federation-config",
        "num-supernodes=20",
    )
    assert proc.returncode == 0, proc.stderr


def test_the_flower_line_switch_names_the_supported_lines() -> None:
    """``PFLOWER_FLOWER`` picks the Flower line; a line the project does not support
    stops dev.sh before any set-up, naming the two that are."""
    proc = dev_sh("check", PFLOWER_FLOWER="1.41", timeout=30)
    assert proc.returncode == 2
    assert "PFLOWER_FLOWER=1.41 is not a supported Flower line (1.39, 1.42)" in proc.stderr
    assert dev_sh("check", PFLOWER_FLOWER="1.39", timeout=60).returncode == 0


def test_the_test_command_stops_in_one_line_when_the_shared_data_are_missing(tmp_path) -> None:
    """A clone whose shared data are not found (not beside ../shared, no
    PFLOWER_DATA_DIR) stops before anything runs, naming both missing paths and the
    switch."""
    proc = dev_sh("test", PFLOWER_DATA_DIR=str(tmp_path), timeout=120)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("dev.sh test: the shared data are missing: ")
    assert str(tmp_path / "cifar10-dev-12k.parquet") in line and "PFLOWER_DATA_DIR" in line
    assert str(tmp_path / "fed-heart-disease") in line
    assert proc.stdout == ""  # first: no lint, no pytest, whatever the tree's state


def test_the_shared_data_check_passes_silently_when_the_data_are_there() -> None:
    """The step dev.sh test runs first, its line as dev.sh has it: exit 0 and nothing
    printed where the data are found (as in this checkout), so the tests go on."""
    (line,) = [
        s for s in (ROOT / "scripts" / "dev.sh").read_text().splitlines() if "shared_data" in s
    ]
    venv = str(Path(sys.executable).parent.parent)
    proc = subprocess.run(
        ["bash", "-euc", line],
        cwd=ROOT,
        env={**os.environ, "VENV": venv},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_check_passes_a_model_that_takes_the_data() -> None:
    proc = dev_sh(
        "check", "--run-config", "method='feddecomp' model='resnet8' dataset='sklearn-digits'"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: feddecomp settings")


def test_check_accepts_every_method_alone_and_prints_its_settings() -> None:
    proc = dev_sh("check", "--run-config", "method='feddecomp'")
    assert proc.returncode == 0, proc.stderr
    assert "local-epochs=5" in proc.stdout and "feddecomp.lora-epochs=2" in proc.stdout


def test_args_are_split_as_flwr_reads_them() -> None:
    run_cfg, fed_cfg, rest = split_args(
        ["--run-config", "a=1", "-c", "b=2", "--run-config=c=3", "--federation-config", "x=1", "."]
    )
    assert run_cfg == ["a=1", "b=2", "c=3"] and fed_cfg == ["x=1"] and rest == ["."]


def test_federation_config_is_the_projects_with_user_values_on_top() -> None:
    value = federation_config(federation_values(["num-supernodes=20"]))
    assert "num-supernodes=20" in value and "client-resources-num-cpus=1" in value
    assert "num-supernodes=10" not in value


def test_results_status_says_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    started = time.time() - 5
    assert "no results" in results_status(path, started, 2)
    path.write_text(json.dumps({"rounds": [{"round": 1}]}))
    assert results_status(path, started, 2) == f"1 of 2 rounds in {path}"
    path.write_text(json.dumps({"rounds": [{"round": 1}, {"round": 2}]}))
    assert results_status(path, started, 2) is None
    assert "not written by this run" in results_status(path, time.time() + 60, 2)
    # a resumed run: rounds before the checkpoint count
    path.write_text(json.dumps({"resumed_from": {"round": 2}, "rounds": [{"round": 3}]}))
    assert results_status(path, started, 1) is None
    assert results_status(path, started, 2) == f"3 of 4 rounds in {path}"
    # resume-from='latest': the rounds count the whole run, the resumed ones included
    assert results_status(path, started, 3, whole=True) is None
    assert results_status(path, started, 4, whole=True) == f"3 of 4 rounds in {path}"


def test_check_takes_resume_from_latest_and_says_where_the_run_starts(
    tmp_path: Path, capsys
) -> None:
    """``resume-from='latest'`` through ``check`` (and so ``dev.sh run``) as through
    ``flwr run``: the run's own checkpoint, the round it will start at printed; a run
    whose checkpoint is of its last round is refused naming the key."""
    from pflower.cli.__main__ import check

    base = f"method='fedavg' output-dir='{tmp_path}' run-name='r' resume-from='latest' num-server-rounds=4"
    assert check(["--run-config", base]) == 0
    assert "no checkpoint yet, so the run starts at round 1" in capsys.readouterr().out
    run_inprocess(
        {"method": "fedavg", "output-dir": str(tmp_path), "run-name": "r", "num-server-rounds": 2},
        2,
    )
    assert check(["--run-config", base]) == 0
    assert "resuming at round 3 of 4 (resume-from latest)" in capsys.readouterr().out
    assert check(["--run-config", base.replace("=4", "=2")]) == 2
    assert "'resume-from': latest: " in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_that_fails_in_the_server_app_exits_non_zero(tmp_path: Path) -> None:
    """Passes the pre-flight (which does not create the output folder), then fails
    in the ServerApp, whose output folder would be under a file: `flwr run --stream`
    itself exits 0 here, the run command must not."""
    home = tmp_path / "flwr-home"
    (tmp_path / "a-file").write_text("")
    cfg = f"num-server-rounds=1 output-dir='{tmp_path}/a-file/out'"
    try:
        proc = dev_sh("run", "--run-config", cfg, home=home)
    finally:
        _stop_local_superlink(home)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "run FAILED: no results" in proc.stderr


# A stand-in for a SuperLink another checkout started: a listener whose command line
# names flower-superlink and a database and log under that checkout's Flower home.
LISTENER = (
    "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); time.sleep(120)"
)


def _foreign_listener(home: Path) -> tuple[subprocess.Popen, int]:
    args = ["--database", f"{home}/state.db", "--log-file", f"{home}/superlink.log"]
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER, "flower-superlink", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, int(proc.stdout.readline())


def test_a_local_superlink_from_another_flower_home_is_named(tmp_path: Path) -> None:
    other = tmp_path / "other-checkout" / ".flwr"
    proc, port = _foreign_listener(other)
    try:
        problem = foreign_superlink(tmp_path / "mine", port)
        assert problem and f"pid {proc.pid}" in problem and f"kill {proc.pid}" in problem
        assert str(other / "state.db") in problem
        assert foreign_superlink(other, port) is None  # its own home: the run goes to it
    finally:
        proc.kill()
        proc.wait()
    assert foreign_superlink(tmp_path / "mine", port) is None  # nothing listens now


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_of_the_run_command_stops_the_run(signum: int, code: int, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) or SIGTERM of ``dev.sh run`` stops the run it submitted at the
    SuperLink (Flower's status says so), in one line saying how to go on, with no
    traceback, exit 128 + the signal."""
    home = tmp_path / "flwr-home"
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
    env.update(PFLOWER_SKIP_SETUP="1", **local_superlink_env(home))
    cfg = f"method='fedavg' num-server-rounds=200 run-name='long' output-dir='{tmp_path}'"
    proc = subprocess.Popen(
        ["bash", "scripts/dev.sh", "run", "--run-config", cfg],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        for line in proc.stdout:  # until the run is submitted and training
            seen += line
            if "configure_fit" in line or "[ROUND 2]" in line:
                break
        run_id = re.search(r"Successfully started run (\d+)", seen)
        assert run_id, seen[-3000:]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == code, seen[-2000:] + out[-2000:] + err[-3000:]
        assert f"stopped run {run_id.group(1)} ({signal.Signals(signum).name})" in err
        assert "resume-from='latest'" in err and "Traceback" not in out + err
        listed = subprocess.run(
            [str(Path(sys.executable).parent / "flwr"), "ls", "--run-id", run_id.group(1)]
            + ["--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        status = json.loads(listed.stdout[listed.stdout.find("{") :])["runs"][0]["status"]
        assert status.startswith("finished:stopped"), status
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _stop_local_superlink(home)


def test_a_run_is_refused_before_flwr_when_another_checkouts_superlink_listens(
    tmp_path: Path,
) -> None:
    """Such a SuperLink would take the run with the code it was started from (one from a
    deleted checkout hangs it): the run command names its pid and exits 1."""
    proc, port = _foreign_listener(tmp_path / "gone" / ".flwr")
    try:
        run = dev_sh(
            "run",
            "--run-config",
            "num-server-rounds=1",
            home=tmp_path / "flwr-home",
            timeout=120,
            FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
        )
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"run REFUSED: a local SuperLink from another Flower home (pid {proc.pid}" in run.stderr


def test_run_gives_flwr_the_checkpoint_the_preflight_read(tmp_path: Path, monkeypatch) -> None:
    """A relative resume-from is read by the pre-flight from the working directory;
    the apps run elsewhere (Ray workers, flwr's copy of the app): flwr gets it whole."""
    from pflower.cli import __main__ as cli
    from pflower.engine.inprocess import run_inprocess

    small = {"method": "fedavg", "sim-samples": 60, "hidden-dim": 16}
    run_inprocess(
        {**small, "num-server-rounds": 1, "output-dir": str(tmp_path / "runs"), "run-name": "a"}, 2
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    calls: list[list[str]] = []
    monkeypatch.setattr(cli, "run_flwr", lambda cmd: (calls.append(cmd) or 0, None, None))
    given = " ".join(f"{k}={json.dumps(v)}" for k, v in small.items())
    cli.run(["--run-config", f"{given} resume-from='runs/a' output-dir='{tmp_path / 'out'}'"])
    (cmd,) = calls
    assert any(f'resume-from="{tmp_path / "runs" / "a"}"' in arg for arg in cmd)
    # 'latest' stays 'latest': the ServerApp finds the run's checkpoint by run-name
    calls.clear()
    latest = f"resume-from='latest' run-name='a' output-dir='{tmp_path / 'runs'}'"
    cli.run(["--run-config", f"{given} {latest} num-server-rounds=3"])
    (cmd,) = calls
    assert not any('resume-from="' in arg for arg in cmd)  # nothing pinned in its place
    assert any("resume-from='latest'" in arg for arg in cmd)


@pytest.mark.parametrize("command", ["check", "run"])
def test_help_shows_the_usage_and_runs_nothing(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pflower.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "usage: bash scripts/dev.sh check|run" in out.stdout
    assert "num-supernodes" in out.stdout and "pre-flight" not in out.stderr


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("method=fedavg", "config key 'method': fedavg is not .* quote it, method='fedavg'"),
        ("lr=0.1 seed=1 lr=0.2", "config key 'lr' is given twice"),
    ],
)
def test_a_malformed_run_config_string_names_the_key_and_the_fix(override: str, says: str) -> None:
    from pflower.cli.preflight import flwr_run_config
    from pflower.config.schema import ConfigError

    with pytest.raises(ConfigError, match=says):
        flwr_run_config(Path(__file__).resolve().parents[1], [override])


@pytest.mark.parametrize(
    ("outcome", "status", "says"),
    [
        ({"status": "completed", "problems": []}, "finished:completed", None),
        (
            {"status": "failed", "problems": ["site 'b' (asked in 1 round) never contributed: x"]},
            "finished:failed",
            "run FAILED: site 'b' (asked in 1 round) never contributed: x (run 42;",
        ),
        ({"status": "completed", "problems": []}, "finished:failed", "Flower says finished:failed"),
    ],
)
def test_run_exits_1_when_the_server_app_judged_the_run_failed_or_flower_says_so(
    tmp_path: Path, monkeypatch, capsys, outcome: dict, status: str, says: str | None
) -> None:
    """``flwr run --stream`` exits 0 whatever the run's end: the CLI reads the run's
    outcome in results.json and asks Flower for the run's status."""
    from pflower.cli import __main__ as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"

    def flwr_run(cmd: list[str]) -> tuple[int, int, None]:
        (out / "r").mkdir(parents=True)
        rounds = [{"round": 1}]
        (out / "r" / "results.json").write_text(json.dumps({"rounds": rounds, "outcome": outcome}))
        return 0, 42, None

    asked: list[int] = []
    monkeypatch.setattr(cli, "run_flwr", flwr_run)
    monkeypatch.setattr(cli, "run_status", lambda rest, run_id: asked.append(run_id) or status)
    code = cli.run(["--run-config", f"num-server-rounds=1 run-name='r' output-dir='{out}'"])
    err = capsys.readouterr().err
    assert asked == [42]
    if says is None:
        assert code == 0 and "FAILED" not in err
    else:
        assert code == 1 and says in err and "flwr log 42" in err


def test_run_flwr_drops_flowers_notes_and_catches_a_config_error(capsys) -> None:
    """What `flwr run --stream` prints passes through, less Flower's notes on its own
    default federation and its actors' shutdown; the run id and the first config error
    the run logged (Flower colours its levels) are caught."""
    from pflower.cli.__main__ import run_flwr

    lines = [
        "Successfully started run 42",
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (4 simulated SuperNodes)",
        "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:",
        "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> ...",
        "(ClientAppActor pid=1) WARNING :   Manually terminating ClientAppActor",
        "\x1b[91mERROR \x1b[0m:     config error: site 'va': config key 'split-column': x",
        "\x1b[91mERROR \x1b[0m:     config error: a second one",
    ]
    code = "import sys; sys.stdout.write(sys.argv[1])"
    assert run_flwr([sys.executable, "-c", code, "\n".join(lines) + "\n"]) == (
        0,
        42,
        "site 'va': config key 'split-column': x",
    )
    out = capsys.readouterr().out
    assert "Federation `@none/default` (4 simulated SuperNodes)" in out
    assert "10 to 2" not in out and "simulation-config" not in out and "Manually" not in out


def test_a_run_a_client_refused_exits_2_with_its_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from pflower.cli import __main__ as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    line = "site 'va': config key 'split-column': x (round 1; the run stops at a client's refusal)"
    monkeypatch.setattr(cli, "run_flwr", lambda cmd: (0, 42, line))
    monkeypatch.setattr(cli, "run_status", lambda rest, run_id: "finished:failed")
    code = cli.run(["--run-config", f"num-server-rounds=1 output-dir='{tmp_path}'"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"config error: {line}"


def test_a_deployments_preflight_says_the_data_are_at_the_sites(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`check . pflower` with no input-shape: the sites hold their own data and the
    server asks them its shape, so the pre-flight says so, and neither describes nor
    checks the model against the embedded synthetic set it will not use (an image
    model was refused as unable to take its vectors)."""
    from pflower.cli.__main__ import check

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))  # no connection named pflower
    for model in ("logreg", "cnn4"):
        run_config = f"method='fedavg' model='{model}' class-names='benign,malignant'"
        assert check([".", "pflower", "--run-config", run_config]) == 0
        out = capsys.readouterr().out
        assert "data: at the sites, each its own --data-path" in out, out
        assert "synthetic (2 classes" not in out
