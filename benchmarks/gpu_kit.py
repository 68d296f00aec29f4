"""The GPU kit: paper-scale presets on a lent GPU machine, within its budget.

The device machine (docs/PERFORMANCE.md, "On a lent GPU") has PyTorch and CUDA but not
Flower and a few of our other dependencies, reaches no package index, and takes a working
tree of at most 64 MiB. The steps, each a command of ``bash scripts/gpu_kit.sh`` (the
last also ``python -m benchmarks.gpu_kit report``):

* ``prepare`` (here): downloads, with pip, the wheels of every package the in-process
  engine needs that the device image lacks (CPython 3.12, manylinux x86-64; not Ray:
  too large to carry) into ``.whl/``, copies the CIFAR-10 dev set into ``.gpu-kit/data``
  (both git-ignored), measures what would travel, and prints the device call;
* ``device`` (there): installs the wheels into a target folder, checks the CUDA path
  through Flower (the in-process engine's real Messages and ClientApp, node config
  ``device=cuda``), then runs every cell of the named presets at once until a deadline
  and writes their reports at the last round every cell of a preset reached, a summary,
  the plots and a tarball of the runs to ``$OUT``; a second call on the same warm machine
  resumes each cell from its last checkpoint;
* ``dry-run`` (here, a CI test): ``device`` on this machine's CPU for one round, on a
  small subset of the dev set;
* ``report`` (here): the summary and reports again, from the tarball unpacked, into
  docs/results (the manifest in it names the calls and the device).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import gpu_efficiency, presets
from benchmarks.presets import REPO, Cell

log = logging.getLogger("gpu-kit")

PRESETS = ("gpu-factorized-fl-dev", "gpu-fedfac-cifar10-dev")
WHEELS = REPO / ".whl"
KIT = REPO / ".gpu-kit"
CARRY_LIMIT = 64 * 2**20  # the device tool's working-tree limit, carried paths included
# What the in-process engine imports that the device image (its package list in the
# device tool's KINDS.md) lacks, or has in versions our pins exclude (grpcio and protobuf:
# Flower's generated code refuses an older runtime; typing-extensions: pydantic's floor;
# typer and fsspec: Flower's and datasets' ceilings).
# opacus stays behind: its wheel ships a top-level ``benchmarks`` package (ours is the
# runner) and only DP runs import it.
DEVICE_LACKS = (
    "flwr",
    "flwr-datasets",
    "datasets",
    "dill",
    "multiprocess",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "cryptography",
    "cffi",
    "pycryptodome",
    "iterators",
    "tomli",
    "tomli-w",
    "grpcio",
    "grpcio-health-checking",
    "protobuf",
    "sqlalchemy",
    "alembic",
    "mako",
    "fastapi",
    "starlette",
    "typer",
    "fsspec",
)
DEVICE_PYTHON = "3.12"
# pip matches a manylinux tag exactly: every glibc the device's (recent) one runs
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
DRY_RUN_ROWS = 3000  # the dry run's subset of the dev set: every client gets a few images
RESERVE = 40.0  # seconds the device step keeps for its reports and tarball


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_versions(constraints: Path = REPO / "constraints.txt") -> dict[str, str]:
    """name -> version of the tested environment (constraints.txt)."""
    out = {}
    for line in constraints.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            out[normalise(name.strip())] = version.strip()
    return out


def wheel_specs() -> list[str]:
    pins = pinned_versions()
    missing = [n for n in DEVICE_LACKS if n not in pins]
    if missing:
        raise SystemExit(f"constraints.txt pins no version of {missing}")
    return [f"{n}=={pins[n]}" for n in DEVICE_LACKS]


def wheel_dist(path: Path) -> str:
    """The distribution a wheel file holds (its name up to the version)."""
    return normalise(path.name.split("-")[0])


def download_wheels(dest: Path) -> list[Path]:
    """The device's wheels into ``dest``, one version of each (others removed)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", DEVICE_PYTHON, "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    # pip's own constraints file (if this machine sets one) pins this machine's Python
    env = {**os.environ, "PIP_CONSTRAINT": ""}
    proc = subprocess.run([*cmd, *wheel_specs()], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"pip download failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    wanted = {normalise(s.split("==")[0]): s.split("==")[1] for s in wheel_specs()}
    kept = []
    for whl in sorted(dest.glob("*.whl")):
        name, version = wheel_dist(whl), whl.name.split("-")[1]
        if wanted.get(name) != version:
            whl.unlink()  # another version, or a package no longer carried
        else:
            kept.append(whl)
    if {wheel_dist(w) for w in kept} != set(wanted):
        raise SystemExit(f"wheels missing: {sorted(set(wanted) - {wheel_dist(w) for w in kept})}")
    return kept


def tree_bytes() -> int:
    """What the device tool sends besides the carried paths: tracked files and
    untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return sum(
        (REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file()
    )


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prepare(wheels: Path = WHEELS, kit: Path = KIT) -> dict[str, int]:
    """Wheels and data for the device; returns the sizes that travel (bytes)."""
    download_wheels(wheels)
    data = kit / "data"
    data.mkdir(parents=True, exist_ok=True)
    source = presets.CIFAR10_DEV
    if not source.exists():
        presets.subset_parquet(0, 0)  # exits naming the missing file and its recipe
    target = data / source.name
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        shutil.copyfile(source, target)
    sizes = {"tree": tree_bytes(), "wheels": folder_bytes(wheels), "data": folder_bytes(kit)}
    sizes["total"] = sum(sizes.values())
    return sizes


# ----------------------------------------------------------------------------- device


def device_report() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30)
    import flwr

    info["flwr"] = flwr.__version__ if hasattr(flwr, "__version__") else "?"
    info["cpus"] = os.cpu_count()
    return info


def flower_smoke(device: str, work: Path) -> dict[str, Any]:
    """FedPer, 3 clients, 2 rounds, through the in-process engine (Flower's Server,
    real Messages through the real ClientApp) with node config ``device`` set; the
    clients' reported devices must all be that device."""
    from pflower.engine.inprocess import run_inprocess

    config = {
        "method": "fedper",
        "dataset": "synthetic",
        "model": "mlp",
        "sim-samples": 60,
        "hidden-dim": 16,
        "num-server-rounds": 2,
        "run-name": f"flower-{device}",
        "output-dir": str(work / "smoke"),
    }
    res = run_inprocess(config, 3, node_configs=[{"device": device}] * 3)
    devices = res.get("devices", {})
    if set(devices) != {device} or sum(devices.values()) != 3:
        raise RuntimeError(f"the clients trained on {devices}, not all three on {device!r}")
    return {"devices": devices, "final_accuracy_mean": res["final_accuracy_mean"]}


def run_cells(cells: list[Cell], deadline: float, jobs: int) -> None:
    """Every cell not complete yet, ``jobs`` at a time, each from its last checkpoint
    (a warm machine's earlier call), each stopped at ``deadline``."""
    from benchmarks import runner

    def one(cell: Cell) -> str:
        if runner.is_complete(cell):
            return "complete (reused)"
        left = deadline - time.time()
        if left < 30:
            return "not started: no time left"
        resume_at = runner.resume_point(cell)
        ok, seconds, reason = runner.run_cell(cell, left, resume_at)
        start = f" from round {resume_at}" if resume_at else ""
        return f"ok in {seconds:.0f}s{start}" if ok else f"stopped{start}: {reason[:200]}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, c): c for c in cells}
        for future in concurrent.futures.as_completed(futures):
            cell = futures[future]
            log.info("%s / %s / seed %d: %s", cell.preset, cell.label, cell.seed, future.result())


def truncated(res: dict[str, Any], last_round: int) -> dict[str, Any]:
    """A run's results as of round ``last_round``: its rounds up to it and the
    figures taken from them (final, best), as results.json states them."""
    rounds = [r for r in res["rounds"] if int(r["round"]) <= last_round]
    accs = [r["accuracy_mean"] for r in rounds]
    best = int(np.argmax(accs))
    return {
        **res,
        "rounds": rounds,
        "final_accuracy_mean": accs[-1],
        "final_accuracy_pooled": rounds[-1]["accuracy_pooled"],
        "best_accuracy_mean": accs[best],
        "best_round": rounds[best]["round"],
        "best_accuracy_pooled": max(r["accuracy_pooled"] for r in rounds),
        "total_bytes_up": sum(r["bytes_up"] for r in rounds),
        "total_bytes_down": sum(r["bytes_down"] for r in rounds),
        "truncated_at_round": last_round,
    }


def rounds_reached(cell: Cell) -> int:
    from benchmarks.presets import load_results, same_experiment

    res = load_results(cell)
    if not res or not res.get("rounds") or not same_experiment(cell, res.get("config", {})):
        return 0
    return int(res["rounds"][-1]["round"])


def common_view(preset: presets.Preset, cells: list[Cell], view: Path) -> tuple[int, list[Cell]]:
    """The last round every cell with a record reached, and the cells re-pointed at
    copies of their runs truncated to it (under ``view``), for the reporter."""
    from benchmarks.presets import load_results

    reached = [rounds_reached(c) for c in cells]
    common = min((r for r in reached if r > 0), default=0)
    if not common:
        return 0, []
    out = []
    for cell, done in zip(cells, reached, strict=True):
        moved = dataclasses.replace(
            cell,
            rounds=common,
            config={
                **cell.config,
                "num-server-rounds": common,
                "output-dir": str(view / preset.name / cell.setting),
            },
        )
        moved.dir.mkdir(parents=True, exist_ok=True)
        if done:
            res = truncated(load_results(cell) or {}, common)
            (moved.dir / "results.json").write_text(json.dumps(res, indent=1))
        if (cell.dir / "cell.json").exists():
            shutil.copyfile(cell.dir / "cell.json", moved.dir / "cell.json")
        out.append(moved)
    return common, out


LAST_K = 5  # the summary's second figure: the mean of the last rounds' records


def cell_status(cell: Cell) -> str:
    """How a cell's last call ended: complete, stopped at the deadline, or failed."""
    path = cell.dir / "cell.json"
    if not path.exists():
        return "not run"
    status = json.loads(path.read_text())
    if status.get("ok"):
        return "complete"
    if str(status.get("reason", "")).startswith("timed out"):
        return f"stopped at the deadline after round {rounds_reached(cell)}"
    return f"failed: {str(status.get('reason', ''))[:200]}"


def failed_cells(cells: list[Cell]) -> list[Cell]:
    """The cells that make a call fail: one that failed, never ran, or was stopped at
    the deadline before it recorded a round (a cell stopped later is a result)."""
    return [
        c
        for c in cells
        if cell_status(c).startswith(("failed", "not run")) or not rounds_reached(c)
    ]


def summary_lines(preset: presets.Preset, cells: list[Cell], common: int) -> list[str]:
    """One table per preset: rounds reached, seconds a round, accuracy at the common
    round and the mean of its last LAST_K records (with partial participation each
    record scores only the clients sampled next round), beside the paper's figure;
    then every cell that did not complete, and why."""
    from benchmarks.presets import load_results

    lines = [f"## {preset.name}", ""]
    lines += [f"Compared at round {common}, the last round every cell reached.", ""]
    head = "| row | seeds | rounds reached | s/round | acc at common round (%) |"
    head += f" mean of rounds {max(common - LAST_K + 1, 1)}-{common} (%) | paper |"
    lines += [head, "|---|---|---|---|---|---|---|"]
    for setting in preset.settings:
        paper = preset.paper(setting)
        for label, method, _ in preset.rows():
            mine = [c for c in cells if c.setting == setting and c.label == label]
            seeds, reached, secs, at, tail = [], [], [], [], []
            for c in mine:
                res = load_results(c)
                if not res or not rounds_reached(c):
                    continue
                seeds.append(str(c.seed))
                reached.append(str(rounds_reached(c)))
                secs.append(np.median([r["seconds"] for r in res["rounds"][1:]] or [0]))
                if common:
                    cut = truncated(res, common)["rounds"]
                    at.append(100 * cut[-1]["accuracy_mean"])
                    tail.append(100 * np.mean([r["accuracy_mean"] for r in cut[-LAST_K:]]))
            row = [
                f"`{label}`",
                ", ".join(seeds) or "none",
                ", ".join(reached) or "0",
                f"{np.mean(secs):.2f}" if secs else "",
                f"{np.mean(at):.1f} ({', '.join(f'{a:.1f}' for a in at)})" if at else "",
                f"{np.mean(tail):.1f}" if tail else "",
                paper.get(label, paper.get(method, "")),
            ]
            lines.append("| " + " | ".join(row) + " |")
    unfinished = [(c, cell_status(c)) for c in cells]
    unfinished = [(c, s) for c, s in unfinished if s != "complete"]
    if unfinished:
        lines += ["", "Cells that did not complete their rounds:", ""]
        lines += [f"- {c.label} / seed {c.seed}: {s}" for c, s in unfinished]
    return lines + [""]


MANIFEST = "gpu-kit-manifest.json"  # under runs/: every call that ran these cells


def load_manifest(work: Path) -> dict[str, Any]:
    path = work / "runs" / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {"calls": []}


def write_reports(work: Path, out: Path) -> list[Path]:
    """The summary (gpu-kit-summary.md) and each preset's report, CSV and plots, at
    the common round, into ``out``, from the runs under ``work`` and their manifest
    (the device step calls it; so does ``report``, on a tarball unpacked here)."""
    manifest = load_manifest(work)
    use_data_dir(Path(manifest.get("data_dir", presets.SHARED_DATA)))
    dry = manifest.get("dry_run", False)
    seeds, rounds = ([0], 1) if dry else (None, None)
    commands = [c["command"] for c in manifest["calls"]]
    lines = ["# GPU kit", ""]
    lines += ["One line a call of the device step (each resumes the cells of the one before):", ""]
    for call in manifest["calls"]:
        gpu = call["device"].get("gpu") or "no GPU (CPU)"
        lines.append(
            f"- `{call['command']}` on {gpu} (torch {call['device']['torch']}, "
            f"{call['device']['cpus']} CPUs), {call['started']}, {call['seconds']:.0f} s; "
            f"the Flower path: {call['flower_path']}"
        )
    lines += [
        "",
        "The reports beside this file compare every row at its preset's common round.",
        "",
    ]
    written = []
    for name in manifest.get("presets", []):
        preset = presets.load(name)
        cells = preset.cells(seeds, rounds, work / "runs")
        common, view = common_view(preset, cells, work / "view")
        lines += summary_lines(preset, cells, common)
        if common:
            notes = [f"{c}  # truncated at round {common}, the common round" for c in commands]
            from benchmarks import report

            written.append(report.write(preset, view, notes, out))
            written += sorted(out.glob(f"{preset.name}-*.png")) + [out / f"{preset.name}.csv"]
    summary = out / "gpu-kit-summary.md"
    summary.write_text("\n".join(lines).rstrip() + "\n")
    return [summary, *written]


def pack(out: Path, work: Path, reports: Path) -> None:
    """The runs' figures and the manifest (not their checkpoints or personal state)
    and the reports, as one tarball; the device tool brings back at most 8 files."""
    keep = ("results.json", "cell.json", "cell.log", "rounds.csv", "per_client.jsonl", MANIFEST)

    def wanted(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return info if info.isdir() or Path(info.name).name in keep else None

    with tarfile.open(out / "gpu-kit-runs.tar.gz", "w:gz") as tar:
        tar.add(work / "runs", arcname="runs", filter=wanted)
        tar.add(reports, arcname="reports")


def patches_or_off() -> None:
    """The speed patches (pflower.patches) refuse a torch or Flower they were not
    checked against, and the device image's torch may be one: then the cells run
    without them (slower, nothing computed changes: the patches' own contract)."""
    import pflower.patches as patches

    try:
        patches.check()
    except patches.UntestedVersion as err:
        log.warning("%s: running without the speed patches", err)
        os.environ[patches.SWITCH] = "0"


def device(args: argparse.Namespace) -> int:
    start = time.time()
    deadline = start + args.seconds - RESERVE
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.StreamHandler(sys.stdout), logging.FileHandler(out / "gpu-kit.log")],
    )
    patches_or_off()
    info = device_report()
    log.info("device: %s", json.dumps(info))
    if not info["cuda"] and not args.dry_run:
        log.error("no CUDA device: the kit's device step needs one (dry-run runs on CPU)")
        return 3
    smoke = flower_smoke("cuda" if info["cuda"] else "cpu", work)
    log.info("Flower path: %s", json.dumps(smoke))
    names = args.presets or list(PRESETS)
    if gpu_efficiency.STEP in names:  # the engines beside a plain loop (its own report)
        names = [n for n in names if n != gpu_efficiency.STEP]
        path = gpu_efficiency.run(out, work / gpu_efficiency.STEP, args.dry_run, info)
        log.info("%s: %s in %.0f s", gpu_efficiency.STEP, path, time.time() - start)
        if not names:
            return 0
    loaded = [presets.load(n) for n in names]
    seeds, rounds = ([0], 1) if args.dry_run else (None, None)
    runs = work / "runs"
    every: list[Cell] = []
    for preset in loaded:
        cells = preset.cells(seeds, rounds, runs)
        problems = preset.problems(cells)
        if problems:
            log.error("\n".join(problems))
            return 2
        every += cells
    manifest = load_manifest(work)
    if (
        manifest.get("presets", names) != names
        or manifest.get("dry_run", args.dry_run) != args.dry_run
    ):
        manifest = {"calls": []}  # another experiment: its cells are its own
    jobs = args.jobs or min(len(every), 2 * (os.cpu_count() or 1))
    # the cells share the machine's cores: no process takes them all for its own ops
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    log.info(
        "%d cells, %d at a time, until %s (%.0f s)",
        len(every),
        jobs,
        time.strftime("%H:%M:%S", time.localtime(deadline)),
        deadline - time.time(),
    )
    run_cells(every, deadline, jobs)
    command = "bash scripts/gpu_kit.sh " + ("dry-run" if args.dry_run else "device")
    command += "".join(f" {n}" for n in args.presets) + f" --seconds {args.seconds:.0f}"
    manifest["calls"].append(
        {
            "command": command,
            "device": info,
            "flower_path": smoke,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)),
            "seconds": time.time() - start,
        }
    )
    manifest.update(presets=names, dry_run=args.dry_run, data_dir=str(presets.SHARED_DATA))
    runs.mkdir(parents=True, exist_ok=True)
    (runs / MANIFEST).write_text(json.dumps(manifest, indent=1))
    reports = work / "reports"
    for path in write_reports(work, reports):
        if path.suffix in (".md", ".png"):  # the rest is in the tarball
            shutil.copyfile(path, out / path.name)
    pack(out, work, reports)
    log.info("done in %.0f s; files in %s", time.time() - start, out)
    failed = failed_cells(every)
    for cell in failed:
        log.error("%s / %s / seed %d: %s", cell.preset, cell.label, cell.seed, cell_status(cell))
    return 1 if failed else 0


def use_data_dir(folder: Path) -> None:
    """``{dev}`` resolves to the dev set in ``folder`` (in this process; cells get the
    path itself): a run's stored config names the file it read, and a report matches
    runs to cells by config. The device step reads .gpu-kit/data (PFLOWER_DATA_DIR)."""
    presets.SHARED_DATA = folder
    presets.CIFAR10_DEV = folder / presets.CIFAR10_DEV.name


def dry_run_data(folder: Path) -> Path:
    """A DRY_RUN_ROWS subset of the dev set, under the dev set's own file name, so
    that ``{dev}`` resolves to it with PFLOWER_DATA_DIR set to ``folder``."""
    subset = Path(presets.subset_parquet(DRY_RUN_ROWS, seed=0))
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(subset, folder / presets.CIFAR10_DEV.name)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="wheels and data for the device, sizes checked")
    prep.add_argument("--wheels", type=Path, default=WHEELS)
    prep.add_argument("--kit", type=Path, default=KIT)
    rep = sub.add_parser("report", help="the summary and reports again, from a work folder")
    rep.add_argument("--work", type=Path, default=Path("outputs/gpu-kit"))
    rep.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    for name in ("device", "dry-run"):
        run = sub.add_parser(name, help="run the presets (dry-run: one round on CPU)")
        run.add_argument(
            "presets",
            nargs="*",
            help=f"default: {' '.join(PRESETS)}; {gpu_efficiency.STEP}: the engines beside "
            "a plain loop (benchmarks/gpu_efficiency.py)",
        )
        run.add_argument("--seconds", type=float, default=540, help="the whole step's budget")
        run.add_argument("--jobs", type=int, default=0, help="cells at a time (default: all)")
        run.add_argument("--out", default=os.environ.get("OUT", "outputs/gpu-kit/out"))
        run.add_argument("--work", default="outputs/gpu-kit", help="runs (resumed) and reports")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        sizes = prepare(args.wheels, args.kit)
        mib = {k: round(v / 2**20, 1) for k, v in sizes.items()}
        print(
            f"travels: tree {mib['tree']} MiB, wheels {mib['wheels']} MiB, data {mib['data']} MiB"
        )
        print(f"total {mib['total']} MiB of {CARRY_LIMIT // 2**20} MiB")
        if sizes["total"] >= CARRY_LIMIT:
            print("too large for the device tool", file=sys.stderr)
            return 1
        print(
            "device call: run(command='bash scripts/gpu_kit.sh device', "
            "carry=['.whl', '.gpu-kit'], timeout_s=600)"
        )
        return 0
    if args.command == "report":
        for path in write_reports(args.work.resolve(), args.out.resolve()):
            print(path)
        return 0
    args.dry_run = args.command == "dry-run"
    if not args.dry_run:
        return device(args)
    before = os.environ.get("PFLOWER_DATA_DIR"), presets.SHARED_DATA
    with tempfile.TemporaryDirectory(prefix="gpu-kit-dry-") as tmp:  # its data subset
        try:
            os.environ["PFLOWER_DATA_DIR"] = str(dry_run_data(Path(tmp)))
            use_data_dir(Path(tmp))
            return device(args)
        finally:  # the caller's data again (a test calls this in its own process)
            if before[0] is None:
                os.environ.pop("PFLOWER_DATA_DIR", None)
            else:
                os.environ["PFLOWER_DATA_DIR"] = before[0]
            use_data_dir(before[1])


if __name__ == "__main__":
    sys.exit(main())
