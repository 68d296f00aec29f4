"""PFLlib (TsingZ0/PFLlib at d832e76) beside this project, on PFLlib's own ``dir``
partition of the CIFAR-10 dev file (issue #103). Nothing of PFLlib lives in this
repository: every command takes a PFLlib checkout (``--pfllib``, default
``$PFLLIB_DIR``) and imports or runs PFLlib's own code from there.

    python -m benchmarks.pfllib_peer make-partition --out DIR
    python -m benchmarks.pfllib_peer run --partition DIR --algorithm FedAvg --seed 0 --rounds 30
    python -m benchmarks.pfllib_peer run-ours --partition DIR --method fedavg --seed 0 --rounds 30
    python -m benchmarks.pfllib_peer check --partition DIR     # our loader's counts
    python -m benchmarks.pfllib_peer table RESULTS.json ...

``make-partition``: the dev file's images, pooled (as generate_Cifar10.py pools
CIFAR-10's train and test sets), put through generate_Cifar10's transform and
PFLlib's ``separate_data`` / ``split_data`` / ``save_file`` (dataset/utils/dataset_utils.py:
non-IID, unbalanced, ``dir``, alpha 0.1, train ratio 0.75, numpy and ``random``
seeded 1 as generate_Cifar10 seeds them). It writes PFLlib's layout
(``pfllib/dataset/Cifar10/{config.json,train/*.npz,test/*.npz}``), the same rows for
this project as per-client image folders (``clients/client-<i>/{train,test}/<class>/<row>.png``,
the file's own PNG bytes) and as one parquet file (``ours.parquet``: ``client`` and
``split`` columns, for a natural partition), and ``manifest.json`` (counts, label
histograms, digests). PFLlib's functions run on the row numbers; the images are then
gathered by them (the functions draw from numpy by sizes and labels only, so the
split is the one they make of the images).

``run``: PFLlib's ``system/main.py`` in a copy of the checkout's ``system/`` under the
run's folder (its dataset a link to the partition's), as a subprocess in PFLlib's
own environment, with main.py's defaults and ``-data Cifar10 -m CNN -nc 10 -jr 1
-lbs 10 -lr 0.005 -ls 1 -dev cpu`` (``-mu 0.01`` for FedProx), on one torch thread
by default (``--threads``; our engine runs each simulated client on one). A small driver
(``_drive`` below) starts main.py and records, beside PFLlib's own h5 file, what
that file lacks: each evaluation's per-client counts and each round's seconds.
``results.json`` is written in the shape of this project's runs
(benchmarks/report.py reads it).

The seed: PFLlib has no seed option; main.py and every client call
``torch.manual_seed(0)`` and numpy is never seeded. The driver seeds numpy and
``random`` with the seed and turns each ``torch.manual_seed(k)`` into
``torch.manual_seed(k + seed)``: seed 0 is PFLlib's own torch seeding, and seed s
builds the same initial CNN as this project's ``seed=s`` (both seed torch, then
build conv, conv, linear, linear in that order).

The environment (``.venv-pfllib``, beside ``.venv``), made on first use as
benchmarks/pfl_peer.py makes pfl's: it sees ours underneath (a ``.pth`` file), so
torch, numpy and scikit-learn are ours; PFLlib's other imports (h5py, ujson, calmsize,
and cvxpy, which main.py imports for FedPAC) are installed into it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import random
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# this module also runs inside PFLlib's environment: nothing of ours is imported at the top
REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-pfllib"
PFLLIB_COMMIT = "d832e76"
GET_PFLLIB = (
    f"git clone https://github.com/TsingZ0/PFLlib && git -C PFLlib checkout {PFLLIB_COMMIT}"
)
PACKAGES = ("h5py==3.16.0", "ujson==6.1.0", "calmsize==0.1.3", "cvxpy==1.9.3")
DATASET = "Cifar10"  # main.py picks FedAvgCNN's width (dim=1600) from this name

# our method -> PFLlib's ``-algo`` name (PFLlib spells them so in main.py)
METHODS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "lg-fedavg": "LG-FedAvg",
    "fedbabu": "FedBABU",
    "apfl": "APFL",
    "per-fedavg": "PerAvg",
    "ditto": "Ditto",
    "fedper": "FedPer",
    "fedrep": "FedRep",
    "fedrod": "FedROD",
    "fedcp": "FedCP",
    "local": "Local",
    "fedbn": "FedBN",
    "pfedme": "pFedMe",
    "fedala": "FedALA",
    "gpfl": "GPFL",
    "fedproto": "FedProto",
}
ALIASES = {"LG": "LG-FedAvg", "FedRoD": "FedROD", "Per-FedAvg": "PerAvg"}
# main.py's defaults, but for these (-nc: its default is 20 clients)
PFLLIB_ARGS = (
    ("-data", DATASET),
    ("-m", "CNN"),
    ("-nc", "10"),
    ("-jr", "1"),
    ("-lbs", "10"),
    ("-lr", "0.005"),
    ("-ls", "1"),
    ("-dev", "cpu"),
)
# where main.py's default makes the method degenerate, what ours runs under
# profile='pfllib' too: FedProx's -mu 0 is FedAvg; pFedMe's -bt 0 never moves the
# server's model (serverpFedMe.py's beta step: docs/pfedme.md)
ALGORITHM_ARGS = {"FedProx": (("-mu", "0.01"),), "pFedMe": (("-bt", "1.0"),)}
# generate_Cifar10.py's transform: ToTensor, then Normalize((0.5,)*3, (0.5,)*3)
NORMALISE_MEAN, NORMALISE_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


class PfllibMissing(SystemExit):
    """No PFLlib checkout where one was asked for (a one-line message)."""


# ----------------------------------------------------------------------------- checkout


def pfllib_checkout(path: str | Path | None = None) -> Path:
    """The PFLlib checkout at ``path`` (default ``$PFLLIB_DIR``); PfllibMissing, in one
    line saying how to get it, when there is none."""
    given = str(path) if path else os.environ.get("PFLLIB_DIR", "")
    where = Path(given).expanduser() if given else None
    needed = ("system/main.py", "dataset/utils/dataset_utils.py")
    if where is None or not all((where / n).is_file() for n in needed):
        said = f"no PFLlib checkout at {given!r}" if given else "no PFLlib checkout given"
        raise PfllibMissing(
            f"{said} (--pfllib or PFLLIB_DIR, a folder with system/main.py); get it with: "
            f"{GET_PFLLIB}"
        )
    return where.resolve()


def checkout_commit(checkout: Path) -> str:
    """The checkout's commit, or 'unknown' where it is no git work tree."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    head = done.stdout.strip()
    if done.returncode or not (checkout / ".git").exists():
        return "unknown"
    return head


def pfllib_name(name: str) -> str:
    """PFLlib's ``-algo`` for ``name``: one of ours (METHODS), an alias, or PFLlib's own."""
    return METHODS.get(name) or ALIASES.get(name) or name


def pfllib_python() -> Path:
    """PFLlib's interpreter, made (venv, ``.pth``, ``pip install``) if missing."""
    from benchmarks.pfl_peer import peer_python

    return peer_python(VENV, list(PACKAGES), ", ".join(PACKAGES))


# ----------------------------------------------------------------------------- partition


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def class_names_of(parquet: Path) -> list[str]:
    """The label column's ClassLabel names in the file's Hugging Face metadata."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(parquet).metadata or {}
    features = json.loads(meta.get(b"huggingface", b"{}")).get("info", {}).get("features", {})
    names = features.get("label", {}).get("names")
    if not names:
        raise SystemExit(f"{parquet}: no class names in its label column's metadata")
    return list(names)


def export_client_folders(
    out: Path,
    pngs: list[bytes],
    rows: list[tuple[np.ndarray, np.ndarray]],
    labels: np.ndarray,
    class_names: list[str],
) -> list[Path]:
    """Client i's train and test rows (``rows[i]``) as ``out/client-i/{train,test}/<class>/<row>.png``
    (the rows' own PNG bytes); returns the clients' folders, in order."""
    folders = []
    for i, (train, test) in enumerate(rows):
        folder = out / f"client-{i}"
        for split, idx in (("train", train), ("test", test)):
            for row in np.asarray(idx, dtype=np.int64).tolist():
                path = folder / split / class_names[int(labels[row])] / f"{row:05d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(pngs[row])
        folders.append(folder)
    return folders


def export_parquet(
    out: Path, source: Path, rows: list[tuple[np.ndarray, np.ndarray]], class_names: list[str]
) -> None:
    """The clients' rows of ``source`` (its ``img`` and ``label``), client by client,
    with ``client`` and ``split`` columns: ``partitioner='natural' partition-by='client'``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(source, columns=["img", "label"])
    order, client, split = [], [], []
    for i, (train, test) in enumerate(rows):
        for name, idx in (("train", train), ("test", test)):
            order += np.asarray(idx, dtype=np.int64).tolist()
            client += [i] * len(idx)
            split += [name] * len(idx)
    table = table.take(pa.array(order, type=pa.int64()))
    table = table.append_column("client", pa.array(client, type=pa.int64()))
    table = table.append_column("split", pa.array(split, type=pa.string()))
    features = {
        "img": {"_type": "Image"},
        "label": {"names": class_names, "_type": "ClassLabel"},
        "client": {"dtype": "int64", "_type": "Value"},
        "split": {"dtype": "string", "_type": "Value"},
    }
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), out)


def client_summary(
    rows: list[tuple[np.ndarray, np.ndarray]], labels: np.ndarray, class_names: list[str]
) -> list[dict[str, Any]]:
    """Each client's counts, label histograms and a digest of its row numbers."""
    out = []
    for i, (train, test) in enumerate(rows):
        entry: dict[str, Any] = {"client": i}
        for split, idx in (("train", train), ("test", test)):
            idx = np.asarray(idx, dtype=np.int64)
            counts = np.bincount(labels[idx], minlength=len(class_names))
            entry[split] = int(len(idx))
            entry[f"{split}_labels"] = {
                class_names[c]: int(n) for c, n in enumerate(counts.tolist()) if n
            }
            entry[f"{split}_rows_sha256"] = sha256(np.sort(idx).tobytes())
        out.append(entry)
    return out


def _partition(
    checkout: Path, parquet: Path, out: Path, clients: int, alpha: float, seed: int
) -> None:
    """(In PFLlib's environment: its dataset_utils imports ujson.) make-partition's work."""
    import pyarrow.parquet as pq
    import torch
    import torchvision.transforms as transforms
    from PIL import Image

    sys.path.insert(0, str(checkout / "dataset"))
    from utils import dataset_utils  # PFLlib's, from the checkout

    dataset_utils.alpha = alpha  # read by separate_data at call time (its default: 0.1)
    table = pq.read_table(parquet, columns=["img", "label"])
    pngs = table.column("img").combine_chunks().field("bytes").to_pylist()
    labels = np.asarray(table.column("label").to_numpy(), dtype=np.int64)
    class_names = class_names_of(parquet)
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize(NORMALISE_MEAN, NORMALISE_STD)]
    )
    images = torch.stack(
        [transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in pngs]
    ).numpy()

    # generate_Cifar10.py seeds both at import, then draws nothing else before these
    random.seed(seed)
    np.random.seed(seed)
    num_classes = len(set(labels.tolist()))
    X, y, statistic = dataset_utils.separate_data(
        (np.arange(len(labels)), labels),
        clients,
        num_classes,
        niid=True,
        balance=False,
        partition="dir",
        class_per_client=2,
    )
    train_rows, test_rows = dataset_utils.split_data(X, y)
    rows = [(tr["x"], te["x"]) for tr, te in zip(train_rows, test_rows, strict=True)]

    root = out / "pfllib" / "dataset" / DATASET
    for sub in ("train", "test"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    dataset_utils.save_file(
        str(root / "config.json"),
        str(root / "train") + "/",
        str(root / "test") + "/",
        [{"x": images[tr], "y": labels[tr]} for tr, _ in rows],
        [{"x": images[te], "y": labels[te]} for _, te in rows],
        clients,
        num_classes,
        statistic,
        True,
        False,
        "dir",
    )
    folders = export_client_folders(out / "clients", pngs, rows, labels, class_names)
    export_parquet(out / "ours.parquet", parquet, rows, class_names)
    summary = client_summary(rows, labels, class_names)
    for entry, folder in zip(summary, folders, strict=True):
        i = entry["client"]
        entry["folder"] = str(folder)
        for split in ("train", "test"):
            entry[f"pfllib_{split}_npz_sha256"] = sha256((root / split / f"{i}.npz").read_bytes())
    (out / "rows.json").write_text(
        json.dumps([{"train": tr.tolist(), "test": te.tolist()} for tr, te in rows])
    )
    manifest = {
        "pfllib_commit": checkout_commit(checkout),
        "pfllib_checkout": str(checkout),
        "source": str(parquet),
        "source_sha256": sha256(parquet.read_bytes()),
        "rows": len(labels),
        "clients": clients,
        "partition": "dir",
        "niid": True,
        "balance": False,
        "alpha": dataset_utils.alpha,
        "train_ratio": dataset_utils.train_ratio,
        "least_samples": int(
            min(
                dataset_utils.batch_size / (1 - dataset_utils.train_ratio),
                len(labels) / clients / 2,
            )
        ),
        "seed": seed,
        "class_names": class_names,
        "pfllib_normalise": {"mean": NORMALISE_MEAN, "std": NORMALISE_STD},
        "pfllib_dataset": str(root),
        "ours_parquet": str(out / "ours.parquet"),
        "client_folders": [str(f) for f in folders],
        "per_client": summary,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def make_partition(
    checkout: Path, parquet: Path, out: Path, clients: int = 10, alpha: float = 0.1, seed: int = 1
) -> dict[str, Any]:
    """PFLlib's partition of ``parquet`` into ``out`` (module docstring); the manifest."""
    checkout = pfllib_checkout(checkout)
    if not parquet.is_file():
        raise SystemExit(f"no data file at {parquet}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    args = [str(checkout), str(parquet.resolve()), str(out.resolve()), str(clients), str(alpha)]
    with (out / "partition.log").open("w") as log:
        subprocess.run(
            [str(pfllib_python()), __file__, "_partition", *args, str(seed)],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return json.loads((out / "manifest.json").read_text())


# ----------------------------------------------------------------------------- the driver


class Trace:
    """What a PFLlib run did, recorded from inside: its evaluations (per client) and
    its rounds' seconds (PFLlib's own ``Budget``, and the part spent evaluating)."""

    def __init__(self) -> None:
        self.evaluations: list[dict[str, Any]] = []
        self.iterations: list[dict[str, Any]] = []
        self.join_clients = 0
        self.last_test: tuple[str, Any] | None = None
        self.eval_seconds = 0.0
        self.depth = 0

    def on_accuracy(self, value: float) -> None:
        entry: dict[str, Any] = {"value": float(value), "iteration": len(self.iterations)}
        if self.last_test is not None:
            kind, (ids, samples, correct, *_) = self.last_test
            entry.update(
                kind=kind,
                ids=[int(i) for i in ids],
                samples=[int(n) for n in samples],
                correct=[float(c) for c in correct],
            )
        entry["at"] = time.perf_counter()
        self.evaluations.append(entry)
        self.last_test = None

    def on_round(self, seconds: float) -> None:
        self.iterations.append(
            {
                "seconds": float(seconds),
                "eval_seconds": self.eval_seconds,
                "at": time.perf_counter(),
            }
        )
        self.eval_seconds = 0.0


class _Recorded(list):
    """A list that tells the trace of each value PFLlib appends to it."""

    def __init__(self, values: list, hook: Any) -> None:
        super().__init__(values)
        self.hook = hook

    def append(self, value: Any) -> None:
        self.hook(value)
        super().append(value)


def _timed(name: str, fn: Any, trace: Trace) -> Any:
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        trace.depth += 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            trace.depth -= 1
        if trace.depth == 0:  # a nested call (super()) is counted by the outer one
            trace.eval_seconds += time.perf_counter() - start
            if name.startswith("test_metrics"):
                trace.last_test = (name, out)
        return out

    return wrapper


def install(server_class: Any, trace: Trace) -> None:
    """Record into ``trace`` from every server class, by hooks on PFLlib's base
    ``Server`` (its code is not changed): the lists ``rs_test_acc`` and ``Budget``
    become recording lists, and each ``test_metrics*`` / ``train_metrics*`` method of
    the base and of every subclass defined after this is timed."""

    def wrap(cls: Any) -> None:
        for name, fn in list(vars(cls).items()):
            if callable(fn) and name.startswith(("test_metrics", "train_metrics")):
                setattr(cls, name, _timed(name, fn, trace))

    def setattr_hook(self: Any, name: str, value: Any) -> None:
        if name == "rs_test_acc" and type(value) is list:
            value = _Recorded(value, trace.on_accuracy)
        elif name == "Budget" and type(value) is list:
            value = _Recorded(value, trace.on_round)
        elif name == "num_join_clients":
            trace.join_clients = int(value)
        object.__setattr__(self, name, value)

    def init_subclass(cls: Any, **kwargs: Any) -> None:
        wrap(cls)

    wrap(server_class)
    server_class.__setattr__ = setattr_hook
    server_class.__init_subclass__ = classmethod(init_subclass)


def read_h5(path: Path) -> dict[str, list[float]]:
    """The arrays of a PFLlib results file (``rs_test_acc``, ``rs_test_auc``, ``rs_train_loss``)."""
    import h5py

    with h5py.File(path, "r") as f:
        return {k: [float(v) for v in np.asarray(f[k]).ravel()] for k in f}


def last(argv: list[str], flag: str, default: str = "") -> str:
    """The value of ``flag``'s last occurrence in ``argv`` (argparse keeps the last)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values[-1] if values else default


def _drive(seed: int, threads: int, trace_path: Path, argv: list[str]) -> None:
    """(In PFLlib's environment, in the run's copy of ``system/``.) main.py, recorded."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [os.getcwd()] + [p for p in sys.path if p and Path(p).resolve() != here]
    import torch

    if threads > 0:
        torch.set_num_threads(threads)

    random.seed(seed)
    np.random.seed(seed)
    torch_seed = torch.manual_seed
    torch.manual_seed = lambda s: torch_seed(int(s) + seed)  # type: ignore[assignment]

    from flcore.servers.serverbase import Server  # PFLlib's, from the run's copy

    trace = Trace()
    install(Server, trace)
    sys.argv = ["main.py", *argv]
    started, error = time.perf_counter(), None
    try:
        runpy.run_path("main.py", run_name="__main__")
    except BaseException as err:
        error = f"{type(err).__name__}: {err}"
        raise
    finally:
        h5 = (
            Path("..")
            / "results"
            / f"{last(argv, '-data', DATASET)}_{last(argv, '-algo')}_{last(argv, '-go', 'test')}_0.h5"
        )
        out = {
            "argv": argv,
            "seed": seed,
            "torch_threads": torch.get_num_threads(),
            "join_clients": trace.join_clients,
            "evaluations": trace.evaluations,
            "iterations": trace.iterations,
            "h5": read_h5(h5) if h5.exists() else {},
            "started_at": started,
            "ended_at": time.perf_counter(),
            "error": error,
        }
        trace_path.write_text(json.dumps(out))


# ----------------------------------------------------------------------------- results


def pfllib_argv(algorithm: str, rounds: int, extra: list[str] | None = None) -> list[str]:
    """main.py's arguments: PFLLIB_ARGS, the algorithm's own, then ``extra`` (which win:
    argparse keeps an option's last value)."""
    algo = pfllib_name(algorithm)
    argv = ["-algo", algo, "-gr", str(rounds)]
    for flag, value in PFLLIB_ARGS + ALGORITHM_ARGS.get(algo, ()):
        argv += [flag, value]
    return argv + list(extra or [])


def _scored(entry: dict[str, Any]) -> dict[str, Any]:
    """One evaluation as a round's fields: pooled and mean accuracy, per client."""
    if "samples" not in entry:
        return {"accuracy_pooled": entry["value"], "accuracy_mean": float("nan")}
    accs = {
        f"client-{i}": c / n
        for i, n, c in zip(entry["ids"], entry["samples"], entry["correct"], strict=True)
    }
    return {
        "accuracy_pooled": sum(entry["correct"]) / sum(entry["samples"]),
        "accuracy_mean": float(np.mean(list(accs.values()))),
        "per_client_accuracy": accs,
        "per_client_samples": {
            f"client-{i}": {"test": n} for i, n in zip(entry["ids"], entry["samples"], strict=True)
        },
        "evaluated": entry.get("kind", ""),
    }


def results_from_trace(
    trace: dict[str, Any], config: dict[str, Any], method: str, engine: str
) -> dict[str, Any]:
    """results.json in the shape of a run's, from a driver's trace.

    PFLlib's loop runs ``-gr R`` + 1 iterations; iteration i first evaluates the model
    after i rounds (i = 0: the initial model), then trains. Round r (1..R) here is the
    evaluation at iteration r, its seconds those of iteration r - 1 (the one that
    trained it: PFLlib's ``Budget``, with its evaluation of the model before). Where an
    iteration evaluates twice (Ditto: the global, then the personalized models) its
    round is the last one. Evaluations after the loop (FedBABU's fine-tuned models) are
    ``after_training``. Best values are over every evaluation PFLlib recorded, as its
    own "Best accuracy" (the max of ``rs_test_acc``)."""
    iterations, evaluations = trace["iterations"], trace["evaluations"]
    rounds_run = len(iterations) - 1
    replies = trace.get("join_clients") or 0
    by_iteration: dict[int, list[dict[str, Any]]] = {}
    for e in evaluations:
        by_iteration.setdefault(e["iteration"], []).append(e)
    records = []
    for r in range(1, rounds_run + 1):
        it = iterations[r - 1]
        record: dict[str, Any] = {
            "round": r,
            "seconds": it["seconds"],
            "eval_seconds": it["eval_seconds"],
            "replies": replies,
            "bytes_up": 0,
            "bytes_down": 0,
        }
        scored = by_iteration.get(r, [])
        if scored:
            record.update(_scored(scored[-1]))
            if len(scored) > 1:
                record["other_evaluations"] = {e.get("kind", ""): e["value"] for e in scored[:-1]}
        else:
            record.update(accuracy_pooled=float("nan"), accuracy_mean=float("nan"))
        records.append(record)
    after = [_scored(e) for e in by_iteration.get(rounds_run + 1, [])]
    every = [_scored(e) for e in evaluations]
    pooled = [e["accuracy_pooled"] for e in every]
    means = [e["accuracy_mean"] for e in every if not np.isnan(e["accuracy_mean"])]
    h5 = trace.get("h5") or {}
    rs_test_acc = h5.get("rs_test_acc", [])
    final = after[-1] if after else (records[-1] if records else {})
    per_client_round = [x["seconds"] / max(x["replies"], 1) for x in records]
    train_per_client_round = [
        (x["seconds"] - x["eval_seconds"]) / max(x["replies"], 1) for x in records
    ]
    best_round = max(records, key=lambda x: x["accuracy_pooled"])["round"] if records else None
    return {
        "method": method,
        "engine": engine,
        "config": config,
        "rounds": records,
        "initial": _scored(by_iteration[0][-1]) if by_iteration.get(0) else {},
        "after_training": after,
        "best_accuracy_pooled": max(rs_test_acc) if rs_test_acc else max(pooled, default=0.0),
        "best_accuracy_mean": max(means, default=float("nan")),
        "best_round": best_round,
        "final_accuracy_pooled": final.get("accuracy_pooled", float("nan")),
        "final_accuracy_mean": final.get("accuracy_mean", float("nan")),
        "seconds_per_client_round": float(
            np.median(per_client_round[1:] or per_client_round or [float("nan")])
        ),
        "train_seconds_per_client_round": float(
            np.median(train_per_client_round[1:] or train_per_client_round or [float("nan")])
        ),
        "extra_iteration_seconds": iterations[-1]["seconds"] if iterations else 0.0,
        "total_seconds": trace["ended_at"] - trace["started_at"],
        "federation_size": len(evaluations[0].get("ids", [])) if evaluations else 0,
        "torch_threads": trace.get("torch_threads"),
        "h5": h5,
        "h5_matches_trace": bool(rs_test_acc)
        and np.allclose(rs_test_acc, [e["value"] for e in evaluations]),
        "total_bytes_up": 0,
        "total_bytes_down": 0,
    }


def run(
    checkout: Path | str | None,
    partition: Path,
    algorithm: str,
    seed: int,
    rounds: int,
    out: Path,
    extra: list[str] | None = None,
    threads: int = 1,
) -> dict[str, Any]:
    """PFLlib's ``algorithm`` on the partition for ``rounds``, in ``out``; results.json.
    ``threads``: torch's intra-op threads (0: torch's default, one a core); 1 by
    default, as our in-process engine runs each simulated client."""
    checkout = pfllib_checkout(checkout)
    data = partition / "pfllib" / "dataset" / DATASET
    if not (data / "config.json").is_file():
        raise SystemExit(f"no PFLlib partition at {data} (make-partition writes one)")
    commit = checkout_commit(checkout)
    if commit != "unknown" and not commit.startswith(PFLLIB_COMMIT):
        print(f"note: the PFLlib checkout is at {commit[:7]}, not {PFLLIB_COMMIT}", file=sys.stderr)
    python = pfllib_python()
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(
        checkout / "system", work / "system", ignore=shutil.ignore_patterns("__pycache__")
    )
    (work / "dataset").mkdir()
    (work / "dataset" / DATASET).symlink_to(data.resolve())
    argv = pfllib_argv(algorithm, rounds, extra)
    trace_path = (out / "trace.json").resolve()
    command = [str(python), str(Path(__file__).resolve()), "_drive", str(seed), str(threads)]
    command.append(str(trace_path))
    started = time.perf_counter()
    with (out / "stdout.log").open("w") as log:
        done = subprocess.run(
            [*command, "--", *argv], cwd=work / "system", stdout=log, stderr=subprocess.STDOUT
        )
    wall = time.perf_counter() - started
    if done.returncode:
        tail = (out / "stdout.log").read_text().strip().splitlines()[-1:] or [""]
        raise SystemExit(
            f"PFLlib {pfllib_name(algorithm)} exited {done.returncode} ({tail[0][:300]}); "
            f"log: {out / 'stdout.log'}"
        )
    trace = json.loads(trace_path.read_text())
    ours = {v: k for k, v in METHODS.items()}.get(pfllib_name(algorithm), "")
    config = {
        "algorithm": pfllib_name(algorithm),
        "method": ours,
        "seed": seed,
        "num-server-rounds": rounds,
        "threads": threads,
        "argv": argv,
        "pfllib_commit": commit,
        "partition": str(partition),
    }
    res = results_from_trace(trace, config, ours or pfllib_name(algorithm), "PFLlib")
    res["wall_seconds"] = wall
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return res


# ----------------------------------------------------------------------------- a preset's cells

PARTITION = REPO / "outputs" / "pfllib" / "partition"
# the dev set, where benchmarks/presets.py's CIFAR10_DEV finds it (presets imports this
# module, so this one does not import presets)
DEV_SET = (
    Path(os.environ.get("PFLOWER_DATA_DIR") or REPO.parent / "shared" / "data")
    / "cifar10-dev-12k.parquet"
)


def preset_partition(what: str, partition: Path = PARTITION, data: Path = DEV_SET) -> str:
    """A preset's ``{pfllib-partition}`` (``what='partition'``: the per-client folders,
    comma-separated, for ``client-data-paths``) or ``{pfllib-classes}`` (``'classes'``:
    their class names, for ``class-names``). The partition is made once, from the dev
    set and the PFLlib checkout at $PFLLIB_DIR (a one-line stop without one)."""
    if not (partition / "manifest.json").is_file():
        print(f"making PFLlib's partition of {data.name} in {partition}", flush=True)
        make_partition(None, data, partition)
    manifest = json.loads((partition / "manifest.json").read_text())
    return ",".join(manifest["client_folders" if what == "partition" else "class_names"])


def run_preset_cell(config: dict[str, Any], rounds: int, out: Path) -> dict[str, Any]:
    """A preset cell of engine ``pfllib``: PFLlib's run of the config's method and seed
    for ``rounds`` on the partition its ``client-data-paths`` name (``run``). Its
    results.json keeps the cell's config, so the runner knows the cell complete, and
    PFLlib's own under ``pfllib``."""
    folders = [p for p in str(config.get("client-data-paths", "")).split(",") if p]
    if not folders or not (Path(folders[0]).parents[1] / "manifest.json").is_file():
        raise SystemExit(
            "engine 'pfllib' runs on PFLlib's partition: client-data-paths = '{pfllib-partition}'"
        )
    method = str(config.get("method", ""))
    if method not in METHODS:
        raise SystemExit(f"engine 'pfllib': PFLlib has no {method!r}; it has {sorted(METHODS)}")
    out.mkdir(parents=True, exist_ok=True)
    partition = Path(folders[0]).parents[1]
    res = run(None, partition, METHODS[method], int(config.get("seed", 0)), rounds, out)
    res["pfllib"], res["config"] = res["config"], config
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return res


# ----------------------------------------------------------------------------- our side


def ours_config(
    partition: Path, method: str, seed: int, rounds: int, source: str = "folders"
) -> dict[str, Any]:
    """Our run config on the partition's rows as PFLlib runs the method
    (``profile='pfllib'``: cnn4, SGD at 0.005 without momentum or weight decay, batches
    of 10, one local epoch, and the method's keys at PFLlib's defaults).
    ``source``: ``folders`` (each client its image folder: each normalised with its
    own folder's statistics) or ``parquet`` (one file, naturally partitioned:
    normalised with the whole file's statistics)."""
    manifest = json.loads((partition / "manifest.json").read_text())
    config: dict[str, Any] = {
        "method": method,
        "profile": "pfllib",
        "model": "cnn4",
        "num-server-rounds": rounds,
        "seed": seed,
    }
    if source == "folders":
        config["client-data-paths"] = ",".join(manifest["client_folders"])
        config["class-names"] = ",".join(manifest["class_names"])
    elif source == "parquet":
        config.update(
            {
                "dataset": manifest["ours_parquet"],
                "partitioner": "natural",
                "partition-by": "client",
            }
        )
    else:
        raise ValueError(f"source {source!r}: 'folders' or 'parquet'")
    return config  # FedProx's mu: ours, 0.01, as `run` passes PFLlib -mu 0.01


def loader_counts(config: dict[str, Any], clients: int) -> list[dict[str, Any]]:
    """What our loader gives each client under ``config``: counts and label histograms
    (by ``class-names`` where the config has them), as ``client_summary`` writes them."""
    from methods import parse_run_config
    from pflower.data import load_client_data

    cfg = parse_run_config(config)
    names = [n for n in str(config.get("class-names", "")).split(",") if n]
    out = []
    for i in range(clients):
        d = load_client_data(cfg, i, clients)
        entry: dict[str, Any] = {"client": i}
        for split, y in (("train", d.y_train), ("test", d.y_test)):
            counts = np.bincount(y.numpy(), minlength=len(names) or 1)
            entry[split] = int(y.shape[0])
            entry[f"{split}_labels"] = {
                (names[c] if names else str(c)): int(n) for c, n in enumerate(counts.tolist()) if n
            }
        out.append(entry)
    return out


def check_partition(partition: Path, source: str = "folders") -> list[str]:
    """The differences between the manifest's per-client counts and label histograms
    and what our loader reads from ``source`` (empty: the same)."""
    manifest = json.loads((partition / "manifest.json").read_text())
    config = ours_config(partition, "fedavg", 0, 1, source)
    got = loader_counts(config, manifest["clients"])
    names = manifest["class_names"]
    wrong = []
    for want, have in zip(manifest["per_client"], got, strict=True):
        for key in ("train", "test", "train_labels", "test_labels"):
            expect = want[key]
            if source == "parquet" and key.endswith("_labels"):  # ids, not names
                expect = {str(names.index(k)): v for k, v in expect.items()}
            if expect != have[key]:
                wrong.append(f"client {want['client']} {key}: {expect} != {have[key]}")
    return wrong


def run_ours(
    partition: Path,
    method: str,
    seed: int,
    rounds: int,
    out: Path,
    source: str = "folders",
    parallel: int = 0,
    threads: int = 0,
) -> dict[str, Any]:
    """Our in-process engine on the partition (``ours_config``); its results.json.
    ``parallel``: clients training at once (0: one a torch thread); ``threads``: torch's
    threads, shared among them (0: as they are). ``parallel=1, threads=1`` is PFLlib's
    loop at ``run(threads=1)``: one client after another on one thread."""
    import torch

    from pflower.engine.inprocess import run_inprocess

    if threads > 0:
        torch.set_num_threads(threads)

    manifest = json.loads((partition / "manifest.json").read_text())
    config = ours_config(partition, method, seed, rounds, source)
    config.update({"output-dir": str(out.parent.resolve()), "run-name": out.name})
    started = time.perf_counter()
    res = run_inprocess(config, manifest["clients"], parallel=parallel)
    res["parallel"], res["threads"] = parallel, torch.get_num_threads()
    res["wall_seconds"] = time.perf_counter() - started
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return res


# ----------------------------------------------------------------------------- the table


def seconds_per_client_round(res: dict[str, Any]) -> float:
    """Each round's seconds over its replies, the median after round 1 (benchmarks/report.py)."""
    rounds = res["rounds"]
    per = [x["seconds"] / max(x.get("replies", 1), 1) for x in rounds]
    return float(np.median(per[1:] or per))


def setup_of(res: dict[str, Any]) -> str:
    """How a run used the cores (and, for ours, which export it read)."""
    cfg = res.get("config", {})
    if res.get("engine") == "PFLlib":
        return f"torch threads {res.get('torch_threads', '?')}"
    source = "folders" if cfg.get("client-data-paths") else "parquet"
    at_once = res.get("parallel") or res.get("threads", "?")  # 0: one a thread
    return f"{source}; clients at once: {at_once}; torch threads: {res.get('threads', '?')}"


def table(paths: list[Path]) -> str:
    """A markdown row per results.json: framework, method, seed, rounds, best pooled
    and mean accuracy, final pooled, seconds per client-round, how it ran."""
    lines = [
        "| framework | method | seed | rounds | best pooled | best mean | final pooled "
        "| s / client-round | setup |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for path in paths:
        res = json.loads(path.read_text())
        cfg = res.get("config", {})
        framework = "PFLlib" if res.get("engine") == "PFLlib" else "pflower"
        name = cfg.get("algorithm") or res.get("method", "")
        lines.append(
            f"| {framework} | {name} | {cfg.get('seed', '')} | {len(res['rounds'])} "
            f"| {res['best_accuracy_pooled']:.4f} | {res['best_accuracy_mean']:.4f} "
            f"| {res['final_accuracy_pooled']:.4f} | {seconds_per_client_round(res):.3f} "
            f"| {setup_of(res)} |"
        )
    return "\n".join(lines)


def _stats(values: list[float]) -> str:
    """``mean (sd)`` in percent over seeds (the value alone for one seed)."""
    pct = [100 * v for v in values]
    if len(pct) < 2:
        return f"{pct[0]:.1f}" if pct else "not run"
    return f"{np.mean(pct):.1f} ({np.std(pct, ddof=1):.1f})"


def paired_table(csv_path: Path, rounds: int = 30, tolerance: float = 3.0) -> str:
    """The pfllib-methods preset's cells (its report's CSV, one row per cell) paired by
    method: best pooled and best mean accuracy on each side (mean and sample sd over the
    seeds both sides ran to ``rounds``), ours minus PFLlib in points, whether ours is
    within ``tolerance`` points or above, and seconds per client-round on each side
    (the median round after the first over the clients, every client training every
    round; PFLlib's round includes its evaluation)."""
    import csv

    found: dict[str, dict[str, dict[int, dict[str, str]]]] = {}
    with csv_path.open() as f:
        for row in csv.DictReader(f):
            if int(row["rounds"]) < rounds:
                continue  # a cell stopped early, or a shorter trial
            side = row["row"].rsplit(" ", 1)[-1]
            found.setdefault(row["method"], {}).setdefault(side, {})[int(row["seed"])] = row
    lines = [
        "| method | seeds | PFLlib best pooled | ours best pooled | ours − PFLlib (points) "
        f"| within {tolerance:g} or above | PFLlib best mean | ours best mean "
        "| PFLlib s / client-round | ours s / client-round |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for method in [m for m in METHODS if m in found]:
        sides = found[method]
        seeds = sorted(set(sides.get("pfllib", {})) & set(sides.get("ours", {})))
        if not seeds:
            continue
        theirs = [sides["pfllib"][s] for s in seeds]
        ours = [sides["ours"][s] for s in seeds]

        def col(rows: list[dict[str, str]], key: str) -> list[float]:
            return [float(r[key]) for r in rows]

        def per_client(rows: list[dict[str, str]]) -> float:
            return float(np.mean([float(r["seconds_per_round"]) / int(r["clients"]) for r in rows]))

        gap = 100 * float(
            np.mean(col(ours, "best_accuracy_pooled"))
            - np.mean(col(theirs, "best_accuracy_pooled"))
        )
        lines.append(
            f"| {method} | {', '.join(map(str, seeds))} "
            f"| {_stats(col(theirs, 'best_accuracy_pooled'))} "
            f"| {_stats(col(ours, 'best_accuracy_pooled'))} | {gap:+.1f} "
            f"| {'yes' if gap >= -tolerance else 'no'} "
            f"| {_stats(col(theirs, 'best_accuracy_mean'))} "
            f"| {_stats(col(ours, 'best_accuracy_mean'))} "
            f"| {per_client(theirs):.2f} | {per_client(ours):.2f} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the CLI


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_partition"]:  # in PFLlib's environment (make-partition starts it)
        checkout, parquet, out, clients, alpha, seed = argv[1:]
        _partition(Path(checkout), Path(parquet), Path(out), int(clients), float(alpha), int(seed))
        return 0
    if argv[:1] == ["_drive"]:  # in PFLlib's environment (run starts it)
        rest = argv[argv.index("--") + 1 :]
        _drive(int(argv[1]), int(argv[2]), Path(argv[3]), rest)
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pfllib_peer", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    part = sub.add_parser("make-partition", help="PFLlib's dir partition, both layouts")
    part.add_argument("--pfllib", help="PFLlib checkout (default: $PFLLIB_DIR)")
    part.add_argument("--data", type=Path, help="the dev parquet (default: the CPU presets')")
    part.add_argument("--out", type=Path, default=REPO / "outputs" / "pfllib" / "partition")
    part.add_argument("--clients", type=int, default=10)
    part.add_argument("--alpha", type=float, default=0.1)
    part.add_argument("--seed", type=int, default=1, help="generate_Cifar10.py's")
    one = sub.add_parser("run", help="one PFLlib run (extra main.py options after --)")
    one.add_argument("--pfllib", help="PFLlib checkout (default: $PFLLIB_DIR)")
    one.add_argument("--partition", type=Path, default=REPO / "outputs" / "pfllib" / "partition")
    one.add_argument("--algorithm", required=True, help="PFLlib's name or ours (METHODS)")
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--rounds", type=int, default=30)
    one.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    one.add_argument("--out", type=Path, help="default: outputs/pfllib/runs/pfllib/<algo>-seed<s>")
    one.add_argument("extra", nargs="*", help="more main.py options, after --")
    mine = sub.add_parser("run-ours", help="our in-process engine on the same rows")
    mine.add_argument("--partition", type=Path, default=REPO / "outputs" / "pfllib" / "partition")
    mine.add_argument("--method", required=True)
    mine.add_argument("--seed", type=int, default=0)
    mine.add_argument("--rounds", type=int, default=30)
    mine.add_argument("--source", choices=("folders", "parquet"), default="folders")
    mine.add_argument("--parallel", type=int, default=0, help="clients at once (0: one a thread)")
    mine.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    mine.add_argument("--out", type=Path, help="default: outputs/pfllib/runs/ours/<method>-seed<s>")
    check = sub.add_parser("check", help="our loader's per-client counts against the manifest")
    check.add_argument("--partition", type=Path, default=REPO / "outputs" / "pfllib" / "partition")
    check.add_argument("--source", choices=("folders", "parquet"), default="folders")
    tab = sub.add_parser("table", help="a markdown table of results.json files")
    tab.add_argument("results", type=Path, nargs="+")
    paired = sub.add_parser("report", help="the pfllib-methods preset's runs, paired by method")
    paired.add_argument(
        "--csv",
        type=Path,
        default=REPO / "docs" / "results" / "pfllib-methods-runs" / "pfllib-methods.csv",
        help="the preset's report CSV (python -m benchmarks run pfllib-methods writes it)",
    )
    paired.add_argument("--rounds", type=int, default=30, help="cells with fewer are left out")
    paired.add_argument("--out", type=Path, help="write the table here too")
    args = parser.parse_args(argv)
    runs = REPO / "outputs" / "pfllib" / "runs"
    if args.command == "make-partition":
        manifest = make_partition(
            args.pfllib, args.data or DEV_SET, args.out, args.clients, args.alpha, args.seed
        )
        for c in manifest["per_client"]:
            print(
                f"client {c['client']}: train {c['train']}, test {c['test']}, {c['train_labels']}"
            )
        print(f"wrote {args.out} (manifest.json)")
    elif args.command == "run":
        algo = pfllib_name(args.algorithm)
        out = args.out or runs / "pfllib" / f"{algo}-seed{args.seed}"
        out.mkdir(parents=True, exist_ok=True)
        res = run(
            args.pfllib, args.partition, algo, args.seed, args.rounds, out, args.extra, args.threads
        )
        print(
            f"{algo} seed {args.seed}: best pooled {res['best_accuracy_pooled']:.4f}, best mean "
            f"{res['best_accuracy_mean']:.4f}, {res['seconds_per_client_round']:.3f} s a "
            f"client-round, {res['wall_seconds']:.1f} s in all; {out / 'results.json'}"
        )
    elif args.command == "run-ours":
        out = args.out or runs / "ours" / f"{args.method}-seed{args.seed}"
        out.parent.mkdir(parents=True, exist_ok=True)
        res = run_ours(
            args.partition,
            args.method,
            args.seed,
            args.rounds,
            out,
            args.source,
            args.parallel,
            args.threads,
        )
        print(
            f"{args.method} seed {args.seed}: best pooled {res['best_accuracy_pooled']:.4f}, "
            f"best mean {res['best_accuracy_mean']:.4f}, {seconds_per_client_round(res):.3f} s "
            f"a client-round, {res['wall_seconds']:.1f} s in all; {out / 'results.json'}"
        )
    elif args.command == "check":
        wrong = check_partition(args.partition, args.source)
        print("\n".join(wrong) or f"our loader ({args.source}) reads the manifest's counts")
        return 1 if wrong else 0
    elif args.command == "report":
        text = paired_table(args.csv, args.rounds)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
    else:
        print(table(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
