"""``python -m benchmarks scale [--settings ...] [--out DIR]``: the scale-1m preset's
cells (FedPer at 1,000 clients a round, 1k to 1M clients, through ``flwr run`` and the
in-process engine), then what a client costs: per engine and size the seconds per
client-round (median of rounds 2-3 over their replies) and its ratio to the 1,000-client
run, the peak memory (summed RSS of every process of the run), the start-up (round 1's
start after the launch), and the memory model MB = a + b x clients fitted by least
squares on the 10k, 100k and 1M runs. Writes ``scale-1m-model.md`` and ``.png`` beside
the preset's report (docs/results by default).

``--partitions``: the partitioners alone (IID, Dirichlet, pathological, natural) on a
synthetic label array of 10k, 100k and 1M clients: the seconds to build every client's
rows and the bytes held, beside flwr-datasets' partitioners through ``load_partition``
(the path before compact partitions) at the sizes ``--flower-up-to`` allows; writes
``scale-1m-partitions.md``.

``--ray-cluster``: the small settings (1k, 10k, 100k clients, 100 a round) through
``flwr run``, setting by setting on this machine's own Ray and then on a two-node Ray
cluster started here for it (harness/ray_cluster.py: two network namespaces; root);
writes ``scale-1m-cluster.md``, the two side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import presets
from benchmarks.presets import is_complete, load_results

Runner = Callable[[list[str]], int]  # python -m benchmarks's main
PRESET = "scale-1m"
FITTED = (10_000, 100_000, 1_000_000)  # the sizes the memory model is fitted on
MAIN = ("1000-clients", "10000-clients", "100000-clients", "1000000-clients")
SMALL = ("1000-clients-100", "10000-clients-100", "100000-clients-100")  # --ray-cluster's
ENGINE = "flwr run"  # the row a Ray cluster runs


def cell_figures(cell: presets.Cell) -> dict[str, Any] | None:
    """One complete cell's figures, or None."""
    if not is_complete(cell):
        return None
    res = load_results(cell) or {}
    status = json.loads((cell.dir / "cell.json").read_text())
    rounds = res["rounds"]
    later = [r["seconds"] / max(1, r["replies"]) for r in rounds[1:]] or [
        rounds[0]["seconds"] / max(1, rounds[0]["replies"])
    ]
    start = rounds[0].get("started_at")
    return {
        "clients": cell.clients,
        "per_round": rounds[0]["replies"],
        "s_client_round": float(np.median(later)),
        "peak_mb": status["peak_rss"] / 2**20,
        "startup_s": start - status["launched_at"] if start and "launched_at" in status else None,
        "personal_state": res.get("personal_state", {}),
        "final_accuracy": res.get("final_accuracy_mean"),
    }


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(a MB, b KB a client) of MB = a + b x clients, least squares."""
    if len({c for c, _ in points}) < 2:
        return None
    slope, intercept = np.polyfit([c for c, _ in points], [m for _, m in points], 1)
    return float(intercept), float(slope * 1024)


def collect(runs: Path) -> dict[str, list[dict[str, Any]]]:
    """Row label -> its complete cells' figures, by clients."""
    preset = presets.load(PRESET)
    out: dict[str, list[dict[str, Any]]] = {}
    for cell in preset.cells(runs=runs):
        if cell.setting not in MAIN:
            continue
        figures = cell_figures(cell)
        if figures is not None:
            out.setdefault(cell.label, []).append(figures)
    for rows in out.values():
        rows.sort(key=lambda f: f["clients"])
    return out


def report(rows: dict[str, list[dict[str, Any]]], commands: list[str]) -> list[str]:
    lines = [
        "# A million simulated clients: what a client costs",
        "",
        "FedPer at 1,000 clients a round, 3 rounds (benchmarks/presets/scale-1m.toml). "
        "s/client-round: the median of rounds 2-3, each round's seconds over its replies; "
        "peak: the summed resident sets of every process of the run, sampled every 0.2 s "
        "(shared pages counted once per process that maps them); start-up: round 1's start "
        "after the launch (for `flwr run`: the pre-flight, the local SuperLink, the "
        "simulation process, Flower's registration of every node, Ray).",
        "",
        "| engine | clients | a round | s/client-round | x 1,000 clients | peak (MB) "
        "| start-up (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, figures in rows.items():
        base = next((f["s_client_round"] for f in figures if f["clients"] == 1000), None)
        for f in figures:
            ratio = f"{f['s_client_round'] / base:.2f}" if base else ""
            startup = f"{f['startup_s']:.0f}" if f["startup_s"] is not None else ""
            lines.append(
                f"| {label} | {f['clients']:,} | {f['per_round']:,} | "
                f"{f['s_client_round']:.4f} | {ratio} | {f['peak_mb']:,.0f} | {startup} |"
            )
    lines += ["", "Memory model, fitted on 10k, 100k and 1M clients:", ""]
    lines += ["| engine | a (MB) | b (KB a client) |", "|---|---|---|"]
    for label, figures in rows.items():
        model = fit([(f["clients"], f["peak_mb"]) for f in figures if f["clients"] in FITTED])
        if model is not None:
            lines.append(f"| {label} | {model[0]:,.0f} | {model[1]:.3f} |")
    lines += ["", "Made with:", "", *[f"    {c}" for c in commands], ""]
    return lines


def plot(rows: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, speed) = plt.subplots(1, 2, figsize=(11, 4))
    for label, figures in rows.items():
        clients = [f["clients"] for f in figures]
        mem.plot(clients, [f["peak_mb"] / 1024 for f in figures], "o", label=label)
        model = fit([(f["clients"], f["peak_mb"]) for f in figures if f["clients"] in FITTED])
        if model is not None:
            xs = np.logspace(3, 6, 50)
            mem.plot(xs, (model[0] + model[1] / 1024 * xs) / 1024, "-", alpha=0.5,
                     label=f"{label}: {model[0] / 1024:.2f} GB + {model[1]:.2f} KB x clients")  # fmt: skip
        speed.plot(clients, [f["s_client_round"] * 1000 for f in figures], "o-", label=label)
    mem.axhline(8, color="red", ls=":", label="8 GB")
    for ax in (mem, speed):
        ax.set_xscale("log")
        ax.set_xlabel("clients (1,000 a round)")
        ax.legend(fontsize=7)
    mem.set_ylabel("peak memory (GB, every process)")
    speed.set_ylabel("ms per client-round")
    speed.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- partitions

PARTITIONERS = ("iid", "dirichlet", "pathological", "natural")
ALPHA, CLASSES, CLASSES_PER_CLIENT = 0.5, 10, 2


def synthetic_rows(clients: int, rows_per_client: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labels (10 classes) and writer ids (``rows_per_client`` rows each, in a shuffled
    order) of ``clients x rows_per_client`` rows."""
    rng = np.random.default_rng(seed)
    n = clients * rows_per_client
    labels = rng.integers(0, CLASSES, n)
    writers = rng.permutation(np.repeat(np.arange(clients), rows_per_client))
    return labels, writers


def flower_partitioner(kind: str, clients: int, seed: int, min_size: int = 0) -> Any:
    """flwr-datasets' partitioner of ``kind`` with the arguments compact.py reproduces
    (an IidPartitioner goes with ``Dataset.shuffle(seed)``: ``flower_partitions``)."""
    from flwr_datasets import partitioner as fp

    if kind == "iid":
        return fp.IidPartitioner(clients)
    if kind == "dirichlet":
        return fp.DirichletPartitioner(clients, "label", ALPHA, min_size, seed=seed)
    if kind == "pathological":
        return fp.PathologicalPartitioner(
            clients, "label", CLASSES_PER_CLIENT, "first-deterministic", seed=seed
        )
    return fp.NaturalIdPartitioner(partition_by="writer")


def flower_partitions(
    partitioner: Any, labels: np.ndarray, writers: np.ndarray | None = None, shuffle: int = -1
) -> list[np.ndarray]:
    """Every partition's rows through flwr-datasets' ``partitioner`` and
    ``load_partition``, the path library_partitions took before compact partitions
    (``shuffle``: ``Dataset.shuffle``'s seed first, as before IidPartitioner)."""
    import datasets

    columns = {"label": labels, "__row__": np.arange(len(labels))}
    if writers is not None:
        columns["writer"] = writers
    ds = datasets.Dataset.from_dict(columns)
    partitioner.dataset = ds.shuffle(seed=shuffle) if shuffle >= 0 else ds
    return [
        np.asarray(partitioner.load_partition(i)["__row__"], dtype=np.int64)
        for i in range(partitioner.num_partitions)
    ]


def compact_partitions(
    kind: str, labels: np.ndarray, writers: np.ndarray, clients: int, seed: int
) -> Any:
    from pflower.data import compact

    if kind == "iid":
        return compact.iid(len(labels), clients, seed)
    if kind == "dirichlet":
        return compact.dirichlet(labels, clients, ALPHA, 0, seed)
    if kind == "pathological":
        return compact.pathological(labels, clients, CLASSES_PER_CLIENT, seed)
    return compact.natural(writers)


def time_partitions(
    sizes: list[int], rows_per_client: int, flower_up_to: int, seed: int = 0
) -> list[dict[str, Any]]:
    """Per size and partitioner: seconds and bytes held, compact and (up to
    ``flower_up_to`` clients) flwr-datasets'; whether they gave the same rows."""
    import flwr_datasets.partitioner  # noqa: F401  imported before the clock starts

    import pflower.data.compact  # noqa: F401

    out = []
    for clients in sizes:
        labels, writers = synthetic_rows(clients, rows_per_client, seed)
        for kind in PARTITIONERS:
            t0 = time.perf_counter()
            parts = compact_partitions(kind, labels, writers, clients, seed)
            row = {"kind": kind, "clients": clients, "rows": len(labels)}
            row["seconds"] = time.perf_counter() - t0
            row["bytes"] = parts.nbytes
            row["smallest"] = int(parts.sizes().min())
            if clients <= flower_up_to:
                t0 = time.perf_counter()
                theirs = flower_partitions(
                    flower_partitioner(kind, clients, seed),
                    labels,
                    writers if kind == "natural" else None,
                    seed if kind == "iid" else -1,
                )
                row["flower_seconds"] = time.perf_counter() - t0
                # what library_partitions held before: a tuple of arrays
                row["flower_bytes"] = sys.getsizeof(theirs) + sum(sys.getsizeof(a) for a in theirs)
                row["same"] = len(theirs) == len(parts) and all(
                    np.array_equal(a, parts.indices(i)) for i, a in enumerate(theirs)
                )
            print(json.dumps(row), flush=True)
            out.append(row)
            del parts
    return out


def partitions_report(rows: list[dict[str, Any]], command: str) -> list[str]:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# Partitions of a million clients",
        "",
        f"Synthetic labels ({CLASSES} classes) and writer ids, {rows[0]['rows'] // rows[0]['clients']} "
        f"rows a client; Dirichlet alpha {ALPHA} with no minimum size (the smallest client's "
        f"rows are shown: a run's own rule asks 2 to 10), pathological "
        f"{CLASSES_PER_CLIENT} classes a client (first-deterministic), natural one writer a "
        "client. compact: pflower/data/compact.py (an int64 offset a client, an int32 row "
        "index a row); flwr-datasets: its partitioner through `load_partition`, every "
        "client, as the product did before (bytes: the tuple of arrays it held). "
        f"Load average when written: {load} on {os.cpu_count()} cores.",
        "",
        "| partitioner | clients | rows | compact (s) | bytes a client | smallest client "
        "| flwr-datasets (s) | its bytes a client | flwr-datasets / compact | same rows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        theirs = r.get("flower_seconds")
        lines.append(
            f"| {r['kind']} | {r['clients']:,} | {r['rows']:,} | {r['seconds']:.2f} | "
            f"{r['bytes'] / r['clients']:.1f} | {r['smallest']} | "
            + (
                f"{theirs:.2f} | {r['flower_bytes'] / r['clients']:.1f} | "
                f"{theirs / r['seconds']:.0f}x | {'yes' if r['same'] else 'NO'} |"
                if theirs is not None
                else "| | | |"
            )
        )
    return [*lines, "", "Made with:", "", f"    {command}", ""]


# ----------------------------------------------------------------------------- Ray cluster


def _cell(runs: Path, setting: str) -> presets.Cell:
    (cell,) = [
        c
        for c in presets.load(PRESET).cells(runs=runs)
        if c.setting == setting and c.label == ENGINE
    ]
    return cell


def cluster_cells(
    cluster: Any, settings: list[str], runs: Path, rerun: bool = False
) -> dict[str, dict[str, int]]:
    """The ``flwr run`` cells of ``settings`` (under ``runs``; a complete one again only
    with ``rerun``) run inside the head's namespace of ``cluster``
    (harness.ray_cluster.Cluster), joining it; each cell's peak counts the cluster's
    processes too. Per setting: the ClientApp actors seen on each node while it ran,
    and the exit code. Kept in ``runs``/cluster.json."""
    from benchmarks.runner import CLUSTER_PIDS

    seen_path = runs / "cluster.json"
    seen = json.loads(seen_path.read_text()) if seen_path.exists() else {}
    env = cluster.env(**{CLUSTER_PIDS: ",".join(map(str, cluster.node_pids()))})
    for setting in settings:
        if not rerun and setting in seen and is_complete(_cell(runs, setting)):
            continue
        command = [sys.executable, "-m", "benchmarks", "run", PRESET, "--settings", setting]
        command += ["--rows", ENGINE, "--runs", str(runs), "--out", str(runs.parent)]
        proc = subprocess.Popen(
            cluster.exec(*command, *(["--rerun"] if rerun else [])), cwd=presets.REPO, env=env
        )
        head: set[int] = set()
        worker: set[int] = set()
        while proc.poll() is None:
            on_head, on_worker = cluster.actors()
            head.update(on_head)
            worker.update(on_worker)
            time.sleep(0.5)
        seen[setting] = {"head": len(head), "worker": len(worker), "exit": proc.returncode}
        runs.mkdir(parents=True, exist_ok=True)
        seen_path.write_text(json.dumps(seen, indent=1))
    return seen


def _figure(figures: dict[str, Any] | None, key: str, fmt: str) -> str:
    return format(figures[key], fmt) if figures and figures.get(key) is not None else "-"


def cluster_report(one: Path, two: Path, settings: list[str], commands: list[str]) -> list[str]:
    """One machine's cells (under ``one``) beside the cluster's (under ``two``)."""
    preset = presets.load(PRESET)
    figures: dict[tuple[str, str], dict[str, Any]] = {}
    for where, runs in (("one", one), ("two", two)):
        for cell in preset.cells(runs=runs):
            if cell.setting in settings and cell.label == ENGINE:
                got = cell_figures(cell)
                if got is not None:
                    figures[(where, cell.setting)] = got
    actors_path = two / "cluster.json"
    actors = json.loads(actors_path.read_text()) if actors_path.exists() else {}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# The scale cells on a two-node Ray cluster",
        "",
        "FedPer through `flwr run` (benchmarks/presets/scale-1m.toml, 100 clients a round, "
        "3 rounds) on this machine's own Ray (2 CPUs) and on a Ray cluster of two nodes "
        "of 1 CPU each, a head and a worker in two network namespaces joined by a veth "
        "pair (harness/ray_cluster.py), the run joining it from the head's namespace "
        "(`RAY_ADDRESS`). Both on this one machine: the cluster's cost is Ray's across an "
        "address, not a second machine's power. s/client-round: the median of rounds "
        "2-3; peak: every process of the run (the cluster's Ray nodes and their workers "
        "included); start-up: round 1's start after the launch (on the cluster Ray is "
        f"up already). Load average when written: {load} on {os.cpu_count()} cores.",
        "",
        "| clients | a round | one machine: s/client-round | cluster: s/client-round | "
        "cluster / one | peak one / cluster (MB) | start-up one / cluster (s) | "
        "final accuracy one / cluster | actors on head, worker |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for setting in settings:
        a, b = figures.get(("one", setting)), figures.get(("two", setting))
        if a is None and b is None:
            continue
        ref, seen, cell = a or b, actors.get(setting, {}), _figure
        ratio = f"{b['s_client_round'] / a['s_client_round']:.2f}" if a and b else "-"
        lines.append(
            f"| {ref['clients']:,} | {ref['per_round']} | {cell(a, 's_client_round', '.4f')} | "
            f"{cell(b, 's_client_round', '.4f')} | {ratio} | {cell(a, 'peak_mb', ',.0f')} / "
            f"{cell(b, 'peak_mb', ',.0f')} | {cell(a, 'startup_s', '.0f')} / "
            f"{cell(b, 'startup_s', '.0f')} | {cell(a, 'final_accuracy', '.4f')} / "
            f"{cell(b, 'final_accuracy', '.4f')} | {seen.get('head', '-')}, "
            f"{seen.get('worker', '-')} |"
        )
    return [*lines, "", "Made with (as root):", "", *[f"    {c}" for c in commands], ""]


def cluster_main(args: argparse.Namespace, argv: list[str], run: Runner) -> int:
    from harness.ray_cluster import two_node_cluster

    settings = args.settings or list(SMALL)
    out = args.out.resolve() if args.out else presets.REPO / "docs" / "results"
    one = args.out.resolve() / "runs" if args.out else presets.RUNS
    two = one / "ray-cluster"
    code = 0
    for setting in [] if args.report_only else settings:
        # side by side, setting by setting: this machine's cell (no cluster up), then
        # the cluster's (a cluster started for it)
        passed = ["run", PRESET, "--settings", setting, "--rows", ENGINE, "--runs", str(one)]
        code = run([*passed, "--out", str(one.parent), *(["--rerun"] if args.rerun else [])])
        with two_node_cluster(args.cluster_prefix) as cluster:
            seen = cluster_cells(cluster, [setting], two, args.rerun)
        code = code or seen[setting]["exit"]
    commands = [shown_command(argv)]
    text = cluster_report(one, two, settings, commands)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{PRESET}-cluster.md").write_text("\n".join(text))
    print(f"cluster: {out / f'{PRESET}-cluster.md'}")
    return code


def main(argv: list[str], run: Runner) -> int:
    """``python -m benchmarks scale``; ``run`` is that command line's ``main`` (the
    preset's cells run and reported as ``python -m benchmarks run`` does)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__)
    parser.add_argument("--settings", nargs="+", help="only these settings of scale-1m")
    parser.add_argument("--rows", nargs="+", help="only these rows ('flwr run', 'in-process')")
    parser.add_argument("--out", type=Path, help="runs under OUT/runs, the report in OUT")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--rerun", action="store_true", help="rerun complete cells too")
    parser.add_argument(
        "--partitions", action="store_true", help="time the partitioners alone (no runs)"
    )
    parser.add_argument("--clients", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--rows-per-client", type=int, default=40)
    parser.add_argument(
        "--flower-up-to", type=int, default=10_000, help="flwr-datasets' path up to this size"
    )
    parser.add_argument(
        "--ray-cluster",
        action="store_true",
        help="the small settings on this machine and on a two-node Ray cluster (root)",
    )
    parser.add_argument("--cluster-prefix", default="pfl", help="its namespaces' prefix")
    args = parser.parse_args(argv)
    if args.partitions:
        return partitions_main(args, argv)
    if args.ray_cluster:
        return cluster_main(args, argv, run)

    passed = ["run", PRESET, "--settings", *(args.settings or MAIN)]
    if args.rows:
        passed += ["--rows", *args.rows]
    if args.out:
        passed += ["--out", str(args.out)]
    passed += [
        f"--{flag}" for flag in ("report-only", "rerun") if getattr(args, flag.replace("-", "_"))
    ]
    code = run(passed)
    out = args.out.resolve() if args.out else presets.REPO / "docs" / "results"
    runs = args.out.resolve() / "runs" if args.out else presets.RUNS
    manifest = runs / PRESET / "manifest.json"
    commands = json.loads(manifest.read_text()).get("commands", []) if manifest.exists() else []
    rows = collect(runs)
    text = report(rows, [c.replace(f"run {PRESET}", "scale", 1) for c in commands])
    (out / f"{PRESET}-model.md").write_text("\n".join(text))
    if rows:
        plot(rows, out / f"{PRESET}-model.png")
    print(f"model: {out / f'{PRESET}-model.md'}")
    return code


def shown_command(argv: list[str]) -> str:
    """The command a report names: without where it was written or how often run."""
    shown = [a for a in argv if a not in ("--report-only", "--rerun")]
    if "--out" in shown:
        at = shown.index("--out")
        del shown[at : at + 2]
    return " ".join(["python -m benchmarks scale", *shown])


def partitions_main(args: argparse.Namespace, argv: list[str]) -> int:
    rows = time_partitions(args.clients, args.rows_per_client, args.flower_up_to)
    out = args.out.resolve() if args.out else presets.REPO / "docs" / "results"
    out.mkdir(parents=True, exist_ok=True)
    text = partitions_report(rows, shown_command(argv))
    (out / f"{PRESET}-partitions.md").write_text("\n".join(text))
    print(f"partitions: {out / f'{PRESET}-partitions.md'}")
    return 0 if all(r.get("same", True) for r in rows) else 1
