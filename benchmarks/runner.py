"""One runner: every cell of a preset in its own process, resumable, with progress.

Engines (what one cell runs; the first three through the real Strategy and ClientApp):
* ``inprocess``: pflower/engine/inprocess.py (Flower's round loop, real Messages, no Ray);
* ``simulation``: ``flwr``'s Ray simulation (pflower/engine/simulate.py);
* ``flwr-run``: the same through ``bash scripts/dev.sh run`` (``flwr run``, its local
  SuperLink and ``flwr-simulation`` process: ``run_flwr`` below);
* ``deployment``: a loopback SuperLink + one SuperNode per client (harness/loopback.py),
  the run submitted with ``flwr run``; the wire bytes counted by a TCP relay;
* ``plain``: the same clients' local training and evaluation in a plain PyTorch loop,
  one after another in one thread, no Flower (a Local run without the framework: the
  overhead preset's floor);
* ``floor``: FedAvg's local training on every core and nothing else, one process and
  one torch thread a core (benchmarks/floor.py): the least a round can cost here;
* ``pfl``: FedAvg on the same clients' data and initial weights in pfl-research, in
  its own environment (benchmarks/pfl_peer.py);
* ``pfllib``: the cell's method and seed as PFLlib runs them, on PFLlib's partition that
  the cell's ``client-data-paths`` name, in PFLlib's environment (benchmarks/pfllib_peer.py).
A cell is complete when its results.json holds every round for the same config. A
preset's ``probe`` (below: FedFac's index recovery, DualFed's linear probe) adds numbers
computed from the finished run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.machine import RoundCpuWatcher, process_tree, reference_ms
from benchmarks.presets import REPO, Cell, Preset, is_complete, load_results, same_experiment
from pflower.store import PERSONAL_STATE_DIR

# ----------------------------------------------------------------------------- resume


def resume_point(cell: Cell) -> int:
    """The round an interrupted cell goes on from: that of its own server checkpoint,
    when its results so far are of the same experiment and its clients' personal
    state is on disk beside it (``personal-state=disk``, the cells' default); else 0
    (the cell starts again at round 1)."""
    from strategies.checkpoint import SERVER_STATE, load_server_state

    res = load_results(cell)
    if res is None or not (cell.dir / PERSONAL_STATE_DIR).is_dir():
        return 0
    if not same_experiment(cell, res.get("config", {})):
        return 0
    try:
        done, _ = load_server_state(cell.dir / SERVER_STATE, cell.config["method"])
    except ValueError:  # missing, corrupt, another method's (ConfigError)
        return 0
    return done if 0 < done < cell.rounds else 0


# ----------------------------------------------------------------------------- one cell


def cell_spec(cell: Cell) -> str:
    return json.dumps({k: getattr(cell, k) for k in Cell.__dataclass_fields__})


def run_cell_here(spec_json: str) -> None:
    """Inside the cell's process: validate the config, run the engine, then the probe."""
    from methods import parse_run_config

    cell = Cell(**json.loads(spec_json))
    parse_run_config(cell.config)  # a bad preset fails before any training
    if cell.engine == "inprocess":
        from pflower.engine.inprocess import run_inprocess

        run_inprocess(cell.config, cell.clients)
    elif cell.engine == "simulation":
        from pflower.engine.simulate import simulate

        simulate(cell.config, cell.clients, num_cpus=cell.num_cpus, num_gpus=cell.num_gpus)
    elif cell.engine == "flwr-run":
        run_flwr(cell)
    elif cell.engine.startswith("deployment"):
        _deployment(cell, warm=cell.engine == "deployment-warm")
    elif cell.engine == "pfl":
        _pfl_research(cell)
    elif cell.engine == "pfllib":
        from benchmarks.pfllib_peer import run_preset_cell

        run_preset_cell(cell.config, cell.rounds, cell.dir)
    elif cell.engine == "floor":
        from benchmarks.floor import run_floor

        run_floor(cell.config, cell.clients, cell.dir)
    else:
        _plain_loop(cell)
    failed_run(cell.dir / "results.json")
    if cell.probe:
        res = json.loads((cell.dir / "results.json").read_text())
        res["probe"] = PROBES[cell.probe](res, cell.clients)
        (cell.dir / "results.json").write_text(json.dumps(res, indent=1))


def failed_run(results: Path) -> None:
    """RunFailed if the run's own outcome (strategies/outcome.py) says it failed: a
    simulated run's ServerApp fails inside Flower, which does not raise here."""
    from strategies.outcome import RunFailed

    outcome = json.loads(results.read_text()).get("outcome", {}) if results.exists() else {}
    if outcome.get("status") == "failed":
        raise RunFailed("; ".join(outcome.get("problems", [])[:5]))


def _plain_loop(cell: Cell) -> None:
    """Local training of every client, one after another, in one thread: the floor a
    round of the framework is measured against. Writes a results.json like a run's."""
    import torch

    from client_app.train import evaluate, train_epochs
    from methods import get_method, parse_run_config
    from pflower.data import data_info, load_client_data

    torch.set_num_threads(1)  # as each simulated client
    cfg = parse_run_config(cell.config)
    method = get_method(cfg.method)
    info = data_info(cfg)
    data = [load_client_data(cfg, i, cell.clients) for i in range(cell.clients)]
    models = []
    for _ in range(cell.clients):
        torch.manual_seed(cfg.seed)
        models.append(method.build_model(cfg, info))
    rounds, t_start = [], time.perf_counter()
    for rnd in range(1, cell.rounds + 1):
        t0, accs, correct, total = time.perf_counter(), [], 0.0, 0
        for i, (model, d) in enumerate(zip(models, data)):
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rnd * 7919 + i)
            params = list(model.parameters())
            train_epochs(model, params, d.x_train, d.y_train, cfg.local_epochs, cfg, gen)
            _, acc = evaluate(model, d.x_test, d.y_test)
            accs.append(acc)
            correct, total = correct + acc * len(d.y_test), total + len(d.y_test)
        rounds.append(
            {
                "round": rnd,
                "accuracy_mean": sum(accs) / len(accs),
                "accuracy_pooled": correct / total,
                "per_client_accuracy": {f"client-{i}": a for i, a in enumerate(accs)},
                "bytes_up": 0,
                "bytes_down": 0,
                "seconds": time.perf_counter() - t0,
            }
        )
    finals = [r["accuracy_mean"] for r in rounds]
    cell.dir.mkdir(parents=True, exist_ok=True)
    res = {
        "method": cfg.method,
        "config": cell.config,
        "rounds": rounds,
        "best_accuracy_mean": max(finals),
        "final_accuracy_mean": finals[-1],
        "best_accuracy_pooled": max(r["accuracy_pooled"] for r in rounds),
        "final_accuracy_pooled": rounds[-1]["accuracy_pooled"],
        "total_bytes_up": 0,
        "total_bytes_down": 0,
        "total_seconds": time.perf_counter() - t_start,
    }
    (cell.dir / "results.json").write_text(json.dumps(res, indent=1))


def _pfl_research(cell: Cell) -> None:
    """Hand the cell's workload to pfl-research: every client's arrays as our loader
    partitions them, the initial weights as our engines build them, the schedule;
    then this process becomes pfl's (exec: none of its memory stays)."""
    import numpy as np
    import torch

    from benchmarks.pfl_peer import PFL_VERSION, pfl_python
    from methods import get_method, parse_run_config
    from pflower.data import data_info, load_client_data

    cfg = parse_run_config(cell.config)
    if cfg.method != "fedavg" or cfg.optimizer != "sgd":
        raise SystemExit("engine 'pfl' runs FedAvg with SGD only (method='fedavg')")
    python = pfl_python()
    info = data_info(cfg)
    arrays = {}
    for i in range(cell.clients):
        d = load_client_data(cfg, i, cell.clients)
        for name in ("x_train", "y_train", "x_test", "y_test"):
            arrays[f"{name}_{i}"] = getattr(d, name).numpy()
    cell.dir.mkdir(parents=True, exist_ok=True)
    np.savez(cell.dir / "pfl-input.npz", **arrays)
    torch.save(get_method("fedavg").build_model(cfg, info).state_dict(), cell.dir / "pfl-init.pt")
    spec = {
        "clients": cell.clients,
        "cohort": max(1, math.ceil(cfg.fraction_fit * cell.clients)),  # as our sampler
        "rounds": cfg.num_server_rounds,
        "model": cfg.model,
        "input_shape": list(info.input_shape),
        "num_classes": info.num_classes,
        "hidden_dim": cfg.hidden_dim,
        "local_epochs": cfg.local_epochs,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "momentum": cfg.momentum,
        "seed": cfg.seed,
        "config": cell.config,
        "pfl_version": PFL_VERSION,
    }
    (cell.dir / "pfl-spec.json").write_text(json.dumps(spec))
    sys.stdout.flush()
    os.execv(str(python), [str(python), "-m", "benchmarks.pfl_peer", str(cell.dir)])


LOG_TAIL = 30  # lines of a failed deployed run's log in its cell's error


def _deployment(cell: Cell, warm: bool) -> None:
    """A loopback deployment, one SuperNode per client, dialing the SuperLink through
    a byte-counting relay; the run's results.json gains the wire bytes. ``warm``: the
    sites' ClientApps are forked by deploy.warm_superexec."""
    from client_app.timing import median_phases
    from harness.loopback import CountingRelay, LoopbackFederation

    with tempfile.TemporaryDirectory(prefix="pflower-experiment-") as tmp:
        fed = LoopbackFederation(
            Path(tmp), isolation="process" if warm else "subprocess", warm=warm
        )
        try:
            fed.start_superlink()
            relay = CountingRelay(fed.fleet_port)
            fed.fleet_port = relay.port  # SuperNodes dial the relay
            for i in range(cell.clients):
                site = f"site-{i}"
                fed.nodes[site] = fed.start_supernode(site, i, cell.clients, Path(tmp) / site)
            for site, proc in fed.nodes.items():
                fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 300, site, proc)
            t0 = time.perf_counter()
            run_id = fed.run({**cell.config, "log-phases": True})
            status = fed.wait_run(run_id, 3600)
            wall = time.perf_counter() - t0
            if not (cell.dir / "results.json").exists():  # the ServerApp's log says why
                log = fed.flwr("log", str(run_id), "loopback", "--show").stdout
                tail = "\n".join(log.strip().splitlines()[-LOG_TAIL:])
                raise RuntimeError(
                    f"the deployed run ended '{status}' and wrote no results; "
                    f"the end of its log (flwr log {run_id}):\n{tail}"
                )
        finally:
            fed.close()
        # a SuperNode's, or its SuperExec's (warm) ClientApps' phase lines
        logs = [ln for proc in fed.procs for ln in proc.text().splitlines()]
    res = json.loads((cell.dir / "results.json").read_text())
    res.update(wire_bytes_up=relay.up, wire_bytes_down=relay.down, run_status=status)
    res["wall_seconds_per_round"] = wall / cell.rounds
    res["client_phases"] = median_phases(logs)  # the median ClientApp message
    (cell.dir / "results.json").write_text(json.dumps(res, indent=1))


# ----------------------------------------------------------------------------- probes
# Numbers computed from a finished run's results.json and what the run's config implies
# (never by reaching into a strategy). Each returns a flat dict that the cell stores as
# ``results["probe"]`` and the report can tabulate (a preset's ``probe`` key names one).


def fedfac_recovery(results: dict[str, Any], clients: int) -> dict[str, float]:
    """FedFac's simulation study (paper Sec. 4.3): the share of hidden neurons whose
    final shared/personal label equals the generating teacher's."""
    from methods import parse_run_config
    from pflower.data import simulation_study

    masks = results["rounds"][-1].get("fa_shared_mask") or {}
    if len(masks) != 1:
        raise ValueError(f"the recovery probe needs one split layer, got {list(masks)}")
    (mask,) = masks.values()
    truth = simulation_study(parse_run_config(results["config"]), clients).shared_neurons
    return {"index_recovery": float((np.asarray(mask, bool) == truth).mean())}


def linear_probe(results: dict[str, Any], clients: int) -> dict[str, float]:
    """How much a linear head can read from the final shared encoder: per client, a
    fresh linear head on z = features(x) (frozen, eval mode) trained on the client's
    training data (20 epochs, SGD lr 0.1, momentum 0.9, batch 64), scored on its test
    data; the mean over clients. For DualFed: what h_s could reach (docs/dualfed.md)."""
    import torch

    from client_app.train import evaluate, train_epochs
    from methods import get_method, parse_run_config
    from pflower.data import data_info, load_client_data
    from strategies.checkpoint import SERVER_STATE, load_server_state

    cfg = parse_run_config(results["config"])
    info = data_info(cfg)
    model = get_method(cfg.method).build_model(cfg, info)
    _, arrays = load_server_state(Path(cfg.output_dir) / cfg.run_name / SERVER_STATE, cfg.method)
    encoder = {
        k.removeprefix("global/"): torch.from_numpy(v)
        for k, v in arrays.items()
        if k.startswith("global/features.")
    }
    model.load_state_dict({**model.state_dict(), **encoder})
    model.eval()
    probe_cfg = cfg.model_copy(
        update={
            "lr": 0.1,
            "momentum": 0.9,
            "weight_decay": 0.0,
            "batch_size": 64,
            "optimizer": "sgd",
        }
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    accuracies = []
    for pid in range(clients):
        data = load_client_data(cfg, pid, clients)
        with torch.no_grad():
            z, z_test = model.features(data.x_train), model.features(data.x_test)
        head = torch.nn.Linear(z.shape[1], info.num_classes)
        train_epochs(head, list(head.parameters()), z, data.y_train, 20, probe_cfg, generator)
        accuracies.append(evaluate(head, z_test, data.y_test)[1])
    return {"linear_probe_accuracy": float(np.mean(accuracies))}


PROBES: dict[str, Callable[[dict[str, Any], int], dict[str, float]]] = {
    "fedfac-recovery": fedfac_recovery,
    "linear-probe": linear_probe,
}


# ----------------------------------------------------------------------------- the runner


CLUSTER_PIDS = "PFLOWER_BENCH_CLUSTER_PIDS"  # comma-separated: counted in a cell's peak


def _tree_rss(pid: int, others: list[int] | None = None) -> int:
    """Resident memory of a process and all its descendants (Ray workers included),
    and of ``others`` (processes of the run that are not its children) and theirs."""
    total = 0
    seen = {q.pid: q for root in (pid, *(others or [])) for q in process_tree(root)}
    for p in seen.values():  # a process once, if it is also a descendant
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def flower_python(line: str) -> str:
    """The interpreter of a cell on Flower ``line`` ("": this one): ``.venv`` for 1.39,
    ``.venv-flwr142`` for 1.42, made by scripts/dev.sh if missing (1.42 as a layer
    over this interpreter's environment)."""
    from pflower.flower_lines import installed

    if not line or installed("flwr").startswith(line + "."):
        return sys.executable
    venv = REPO / (".venv" if line == "1.39" else ".venv-flwr142")
    python = venv / "bin" / "python"
    if not python.exists():
        env = {**os.environ, "PFLOWER_FLOWER": line, "VENV": str(venv)}
        env.pop("PFLOWER_FLOWER_BASE", None)  # a 1.39 venv is a venv of its own
        if line != "1.39":
            env["PFLOWER_FLOWER_BASE"] = sys.prefix
        dev = ["bash", "scripts/dev.sh", "check"]
        subprocess.run(dev, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    return str(python)


def run_cell(
    cell: Cell, timeout: float | None, resume_at: int = 0, reference: bool = False
) -> tuple[bool, float, str]:
    """One cell in a subprocess, its peak memory sampled; (ok, seconds, reason).
    ``resume_at``: go on from the cell's own checkpoint of that round. ``reference``:
    time the machine's reference step just before and after (benchmarks/machine.py)."""
    cell.dir.mkdir(parents=True, exist_ok=True)
    before = reference_ms() if reference else 0.0
    spec = cell
    if resume_at:  # the rounds left, from the checkpoint, with the records so far
        left = {"resume-from": str(cell.dir), "num-server-rounds": cell.rounds - resume_at}
        spec = dataclasses.replace(cell, config={**cell.config, **left})
    else:
        (cell.dir / "results.json").unlink(missing_ok=True)  # a partial run from before
    log_path = cell.dir / "cell.log"
    peak, t0, reason = [0], time.perf_counter(), ""
    launched = time.time()  # startup: from here to round 1's start (its started_at)
    # a resumed cell's log goes on after its earlier part
    with open(log_path, "a" if resume_at else "w") as log:
        proc = subprocess.Popen(
            [flower_python(cell.flower), "-m", "benchmarks", "cell", cell_spec(spec)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

        def sample() -> None:
            detached: list[int] = []  # flwr-run: the local SuperLink flwr starts detached
            # and the processes of a Ray cluster the run joins (benchmarks/scale.py)
            cluster = [int(p) for p in os.environ.get(CLUSTER_PIDS, "").split(",") if p]
            while proc.poll() is None:
                if cell.engine == "flwr-run" and not detached:
                    detached = [p.pid for p in run_processes(flwr_home(cell))]
                peak[0] = max(peak[0], _tree_rss(proc.pid, detached + cluster))
                time.sleep(0.2)

        threading.Thread(target=sample, daemon=True).start()
        cpu = RoundCpuWatcher(proc.pid, cell.dir / "results.json").start()
        try:
            if proc.wait(timeout=timeout) != 0:
                reason = f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reason = f"timed out after {timeout:.0f}s"
    seconds = time.perf_counter() - t0
    after = reference_ms() if reference else 0.0
    stopped = (load_results(cell) or {}).get("stopped")
    if not reason and not is_complete(cell):
        reason = "no complete results.json"
        if stopped:  # max-minutes: stopped cleanly after a round, resumable
            reason = (
                f"stopped by {stopped['reason']} after round {stopped['after_round']} of "
                f"{stopped['of_rounds']}: run the same command again to go on from its checkpoint"
            )
    if reason and not stopped:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "rror" in ln] or lines or ["empty log"]
        reason += f": {errors[-1].strip()[:300]} (log: {log_path})"
    status = {"ok": not reason, "seconds": seconds, "reason": reason, "peak_rss": peak[0]}
    if stopped and reason:
        status["stopped"] = stopped
    status["engine"] = cell.engine
    status["launched_at"] = launched
    if reference:
        status["reference_ms"] = [round(before, 3), round(after, 3)]
    if not reason:
        status["cpu"] = cpu.summary(load_results(cell) or {})
    (cell.dir / "cell.json").write_text(json.dumps(status, indent=2))
    return not reason, seconds, reason


def run_preset(
    preset: Preset,
    cells: list[Cell],
    timeout: float | None = None,
    rerun: bool = False,
    max_minutes: float = 0.0,
) -> list[str]:
    """Run the cells not complete yet, printing progress; returns the failed labels.
    ``max_minutes`` > 0: the whole call's budget; each cell runs with what is left as
    its ``max-minutes`` (it stops cleanly after a round, resumable), and no cell starts
    once it is spent (the same command later goes on where this one stopped)."""
    failed: list[str] = []
    started, ran = time.perf_counter(), 0
    reference = bool(preset.report.get("machine-reference", False))
    for i, cell in enumerate(cells, 1):
        head = f"[{i}/{len(cells)}] {cell.setting} / {cell.label} / seed {cell.seed}"
        if not rerun and is_complete(cell):
            print(f"{head}: complete, reused", flush=True)
            continue
        left_minutes = max_minutes - (time.perf_counter() - started) / 60
        if max_minutes > 0 and left_minutes <= 0:
            print(f"{head}: not started, --max-minutes {max_minutes:g} spent", flush=True)
            continue
        if max_minutes > 0:
            cell = dataclasses.replace(cell, config={**cell.config, "max-minutes": left_minutes})
        resume_at = 0 if rerun else resume_point(cell)
        start = f", from its checkpoint of round {resume_at}" if resume_at else ""
        print(f"{head}: running ({cell.engine}, {cell.clients} clients{start}) ...", flush=True)
        ok, seconds, reason = run_cell(cell, timeout, resume_at, reference)
        ran += 1
        left = (time.perf_counter() - started) / ran * (len(cells) - i)
        if ok:
            best = (load_results(cell) or {}).get("best_accuracy_mean", 0.0)
            print(f"{head}: ok in {seconds:.0f}s, best acc {best:.4f} (~{left:.0f}s left)")
        elif reason.startswith("stopped by max-minutes"):
            print(f"{head}: {reason}", flush=True)
        else:
            failed.append(f"{cell.setting} / {cell.label} / seed {cell.seed}")
            print(f"{head}: FAILED in {seconds:.0f}s: {reason}", flush=True)
    return failed


# The ``flwr-run`` engine: a cell run as a user runs the project, ``bash scripts/dev.sh
# run`` (the pre-flight, then ``flwr run . --stream`` on the local SuperLink flwr starts,
# which runs Flower's Ray simulation in a ``flwr-simulation`` process of its own). The
# cell gets its own FLWR_HOME (``<cell dir>/flwr-home``) and free ports, never Flower's
# default ones; flwr 1.39 starts the local SuperLink detached, so its processes are not
# the cell's children: ``run_processes`` finds them by that FLWR_HOME in their command
# line (for the memory samples), and they are stopped by pid when the cell ends.

FLWR_HOME = "flwr-home"


def flwr_home(cell: Cell) -> Path:
    return cell.dir / FLWR_HOME


def toml_value(value: Any) -> str:
    """A run-config value as ``--run-config`` takes it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def flwr_command(cell: Cell) -> list[str]:
    """``dev.sh run`` with the cell's whole config and its federation."""
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in sorted(cell.config.items()))
    cpus = int(cell.num_cpus) if float(cell.num_cpus).is_integer() else cell.num_cpus  # flwr's type
    federation = f"num-supernodes={cell.clients} client-resources-num-cpus={cpus}"
    federation += f" client-resources-num-gpus={cell.num_gpus}"
    return ["bash", "scripts/dev.sh", "run", "--run-config", run_config, "--federation-config"] + [
        federation
    ]


def flwr_environment(cell: Cell) -> dict[str, str]:
    from harness.loopback import free_ports

    http, control = free_ports(2)
    return {
        **os.environ,
        "FLWR_HOME": str(flwr_home(cell)),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "VENV": str(Path(sys.executable).parent.parent),
        "PFLOWER_SKIP_SETUP": "1",  # this environment is the project's
    }


def run_processes(home: Path) -> list[psutil.Process]:
    """The local SuperLink's processes of the cell whose FLWR_HOME is ``home``
    (flwr 1.39 starts it detached: it is no child of the cell's process)."""
    marker = str(home)
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if any(marker in a for a in cmdline) and any("flower-superlink" in a for a in cmdline):
            out.append(p)
    return out


def stop_flwr(home: Path) -> None:
    """Stop the cell's local SuperLink (and what it started) by pid."""
    procs = []
    for root in run_processes(home):
        try:
            procs += [*root.children(recursive=True), root]
        except psutil.Error:
            continue
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue


def run_flwr(cell: Cell) -> None:
    """The cell through ``dev.sh run``; RuntimeError with its exit code if it failed."""
    flwr_home(cell).mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(flwr_command(cell), cwd=REPO, env=flwr_environment(cell))
    finally:
        stop_flwr(flwr_home(cell))
    if proc.returncode != 0:
        raise RuntimeError(f"dev.sh run exited with {proc.returncode}")


# ----------------------------------------------------------------------------- estimates
#
# A preset's device time, estimated before it starts from a measured rate.
#
# For each distinct (method, model, batch size, input shape) of the cells left to run,
# the rate is measured where the cells will train (CUDA when there is one, else this
# CPU): the method's own model (its transform included: Factorized-FL's factors,
# FedFac's wire aside) trained on random inputs of the data's shape, a few seconds of
# optimizer steps after a warm-up, in images a second. The work is counted from the
# cells' configs and their clients' partitions (rows only; no image is decoded):
# every round, each sampled client's training images times its local epochs, and its
# test images (scored at a third of a training step's cost). Local training is the
# bulk of a round for every method here; the server's work (Factorized-FL's per-client
# mixtures, FedFac's factor analysis) and start-up are not counted, so the estimate is
# a floor.

EVAL_COST = 1 / 3  # a scored image, against a training step's image (forward only)


@dataclasses.dataclass(frozen=True)
class Work:
    """One cell's images a run: trained (image-steps) and scored."""

    trained: float
    scored: float


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def measure_rate(config: dict[str, Any], seconds: float = 3.0, warmup: int = 2) -> float:
    """Training images a second of the cell's model and optimizer at its batch size,
    on the device the cells use."""
    import torch
    import torch.nn.functional as F

    from client_app.train import make_optimizer
    from methods import get_method, parse_run_config
    from pflower.data import data_info

    cfg = parse_run_config(config)
    info = data_info(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = get_method(cfg.method).build_model(cfg, info).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg)
    x = torch.randn(cfg.batch_size, *info.input_shape, device=device)
    y = torch.randint(0, info.num_classes, (cfg.batch_size,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or done == 0:
        step()
        done += cfg.batch_size
        if device.type == "cuda" and done % (cfg.batch_size * 8) == 0:
            torch.cuda.synchronize()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return done / (time.perf_counter() - start)


def cell_work(cell: Cell, rounds: int | None = None) -> Work:
    """The images ``cell`` trains and scores in ``rounds`` (default: all of its
    rounds), from its config and its clients' partitions."""
    from methods import parse_run_config
    from pflower.data.hf import load_source
    from pflower.data.partitions import _partition

    cfg = parse_run_config(cell.config)
    if cfg.dataset == "synthetic":  # the generated study: every client alike, made at once
        from pflower.data import load_client_data

        d = load_client_data(cfg, 0, cell.clients)
        sizes = [(d.y_train, d.y_test)] * cell.clients
    else:
        src = load_source(cfg.dataset)
        sizes = [_partition(cfg, src, i, cell.clients)[:2] for i in range(cell.clients)]
    train = sum(len(tr) for tr, _ in sizes) / cell.clients  # a client's mean
    test = sum(len(te) for _, te in sizes) / cell.clients
    sampled = max(1, math.ceil(cfg.fraction_fit * cell.clients))
    rounds = cell.rounds if rounds is None else rounds
    steps = cfg.local_steps * cfg.batch_size if cfg.local_steps > 0 else train
    return Work(
        trained=rounds * sampled * cfg.local_epochs * steps,
        scored=rounds * cell.clients * test,
    )


def rate_key(cell: Cell) -> tuple[Any, ...]:
    c = cell.config
    return (c["method"], c.get("model"), c.get("batch-size"), c.get("profile"), c.get("dataset"))


def estimate(cells: list[Cell], seconds: float = 3.0) -> tuple[float, list[str]]:
    """(estimated device seconds of ``cells``, one line for each measured rate)."""
    rates: dict[tuple[Any, ...], float] = {}
    lines, total = [], 0.0
    for cell in cells:
        key = rate_key(cell)
        if key not in rates:
            rates[key] = measure_rate(cell.config, seconds)
            c = cell.config
            lines.append(
                f"  {c['method']} on {c.get('model')} at batch {c.get('batch-size', 'auto')}: "
                f"{rates[key]:,.0f} img/s"
            )
        work = cell_work(cell, cell.rounds - resume_point(cell))  # a stopped cell: the rest
        total += (work.trained + EVAL_COST * work.scored) / rates[key]
    return total, lines


def estimate_report(cells: list[Cell], max_minutes: float = 0.0, seconds: float = 3.0) -> str:
    """What ``python -m benchmarks run`` prints before a GPU preset starts."""
    if not cells:
        return "estimated device time: nothing left to run"
    total, lines = estimate(cells, seconds)
    out = [
        f"estimated device time: {total / 60:,.1f} min for {len(cells)} cell(s) left, "
        f"local training and scoring only (measured on {device_name()}):",
        *lines,
    ]
    if max_minutes > 0:
        out.append(
            f"--max-minutes {max_minutes:g}: each cell stops cleanly after the round that "
            "passes it (checkpoint written); the same command again goes on from there"
        )
    return "\n".join(out)
