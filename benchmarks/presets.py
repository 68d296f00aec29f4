"""Presets are data: ``benchmarks/presets/<name>.toml`` -> a grid of runs.

A preset names methods, settings (table columns: data, clients, rounds) and
variants (extra rows: a method with keys on top), seeds, and the paper's
numbers. Reserved keys in ``[config]``, a setting or a variant: ``engine``
(inprocess | simulation | flwr-run | plain | floor | deployment | deployment-warm | pfl), ``clients``, ``rounds``,
``num-cpus``, ``num-gpus``, ``flower`` (1.39 | 1.42: the Flower line's environment the
cell runs in); every other key is a run-config key.
String values may name data: ``{dev}`` (the CIFAR-10 dev set),
``{dev:N}`` (a seeded N-row subset of it), ``{fashion}`` (Fashion-MNIST),
``{dev-domains:K}`` (K per-domain image folders, comma-separated: for ``client-data-paths``),
``{fed-heart-disease}`` (the four hospitals' table, built from ../shared/data once),
``{pfllib-partition}`` and ``{pfllib-classes}`` (PFLlib's ``dir`` partition of the dev set
as per-client folders, and their class names: benchmarks/pfllib_peer.py, made once from a
PFLlib checkout at $PFLLIB_DIR).
``equal-budget = "fedavg"`` gives every row that method's local schedule
(docs/PRESETS.md has the whole format, with an example).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PRESET_DIR = Path(__file__).resolve().parent / "presets"
RUNS = REPO / "outputs" / "benchmarks"
DATA_CACHE = REPO / "outputs" / "data"
# the CIFAR-10 dev set: $PFLOWER_DATA_DIR, else ../shared/data beside the checkout; make
# it with `python -m pflower.data.recipes build cifar10-dev-check --out <that folder>`
SHARED_DATA = Path(os.environ.get("PFLOWER_DATA_DIR") or REPO.parent / "shared" / "data")
CIFAR10_DEV = SHARED_DATA / "cifar10-dev-12k.parquet"
FASHION_IDX = Path("/usr/share/datasets/fashion-mnist")
RESERVED = ("engine", "clients", "rounds", "num-cpus", "num-gpus", "paper", "flower")
# a cell's Flower line (``flower`` in a setting or variant): its interpreter's venv
FLOWER_LINES = ("1.39", "1.42")
TOP_LEVEL = (
    *("description", "methods", "seeds", "settings", "variants", "config", "method-config"),
    *("report", "probe", "gpu", "equal-budget", "base-row", "engine", "clients", "rounds"),
    *("num-cpus", "num-gpus"),
)
ENGINES = (
    *("inprocess", "simulation", "flwr-run", "plain", "floor", "deployment", "deployment-warm"),
    *("pfl", "pfllib"),
)


@dataclass(frozen=True)
class Cell:
    """One run: a table row (label) in a setting, for one seed."""

    preset: str
    setting: str
    label: str
    seed: int
    engine: str
    clients: int
    rounds: int
    config: dict[str, Any]  # the complete run config (method, seed, rounds, output paths)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    probe: str = ""
    flower: str = ""  # "": the Flower of the interpreter that runs the preset

    @property
    def dir(self) -> Path:
        return Path(self.config["output-dir"]) / self.config["run-name"]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    settings: dict[str, dict[str, Any]]  # name -> reserved and config keys
    variants: dict[str, dict[str, Any]]  # row suffix -> keys ("" = the method alone)
    config: dict[str, Any]
    method_config: dict[str, dict[str, Any]]
    report: dict[str, Any] = field(default_factory=dict)  # extras, plots, ratio-to
    probe: str = ""
    gpu: bool = False
    equal_budget: str = ""  # a method whose resolved local schedule every row gets

    def rows(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(label, method, keys) in table order: each method with each variant; a
        variant that names its own ``method`` is one row of its own."""
        rows = []
        for m in self.methods:
            for v, keys in self.variants.items():
                if "method" not in keys:
                    rows.append((f"{m} {v}".strip(), m, keys))
        own = [(v, k["method"], k) for v, k in self.variants.items() if "method" in k]
        return rows + own

    def cells(
        self,
        seeds: list[int] | None = None,
        rounds: int | None = None,
        runs: Path = RUNS,
        equal_budget: str | None = None,
    ) -> list[Cell]:
        """The grid, setting-major (every row of a setting before the next setting).
        ``equal_budget`` (default: the preset's) names a method whose local schedule
        every row takes where the preset does not set that key itself."""
        budget = self.equal_budget if equal_budget is None else equal_budget
        budget_dir = f"-equal-{budget}" if budget and budget != self.equal_budget else ""
        out = []
        for sname, setting in self.settings.items():
            for seed in seeds if seeds is not None else self.seeds:
                for label, method, variant in self.rows():
                    keys = {
                        **self.config,
                        **setting,
                        **self.method_config.get(method, {}),
                        **variant,
                    }
                    run_cfg = {k: resolve(v) for k, v in keys.items() if k not in RESERVED}
                    if budget:
                        run_cfg = {**run_cfg, **budget_schedule(run_cfg, budget)}
                    # the clients' personal state on disk, in the cell's directory: an
                    # interrupted cell resumes with it (runner.resume_point)
                    run_cfg.setdefault("personal-state", "disk")
                    slug = re.sub(r"[^\w.=-]+", "_", label)
                    run_cfg.update(
                        {
                            "method": method,
                            "seed": seed,
                            "num-server-rounds": rounds or keys.get("rounds", 10),
                            # an equal-budget run is another experiment: its own folder
                            "output-dir": str(runs / (self.name + budget_dir) / sname),
                            "run-name": f"{slug}-seed{seed}",
                        }
                    )
                    out.append(
                        Cell(
                            self.name,
                            sname,
                            label,
                            seed,
                            keys.get("engine", "inprocess"),
                            int(keys.get("clients", 10)),
                            run_cfg["num-server-rounds"],
                            run_cfg,
                            float(keys.get("num-cpus", 1.0)),
                            float(keys.get("num-gpus", 0.0)),
                            self.probe,
                            str(keys.get("flower", "")),
                        )
                    )
        return [_found_elsewhere(c, runs) for c in out]

    def problems(self, cells: list[Cell]) -> list[str]:
        """What would fail or do nothing, found before any cell runs: each cell's
        config validated as its run will validate it (an unknown key gets the closest
        valid one), and method keys that no row they apply to reads. One line each,
        a problem shared by many cells once."""
        from methods import ConfigError, foreign_keys, parse_run_config

        found: dict[str, list[str]] = {}
        every = [m for _, m, _ in self.rows()]
        groups = [("[config]", every, self.config)]
        groups += [(f"[settings.{n}]", every, k) for n, k in self.settings.items()]
        groups += [(f"[method-config.{m}]", [m], k) for m, k in self.method_config.items()]
        for v, keys in self.variants.items():
            groups.append(
                (f"[variants.{v!r}]", [keys.get("method")] if "method" in keys else every, keys)
            )
        for where, methods, keys in groups:
            for problem in foreign_keys(methods, keys):
                found.setdefault(f"{where}: {problem}", [])
        for cell in cells:
            try:
                parse_run_config(cell.config)
            except ConfigError as err:
                text = str(err).removeprefix("invalid run config: ")
                found.setdefault(text, []).append(f"{cell.setting} / {cell.label}")
        out = []
        for text, where in found.items():
            more = f" and {len(where) - 1} more cells" if len(where) > 1 else ""
            out.append(f"{self.name}: {text}" + (f" ({where[0]}{more})" if where else ""))
        return out

    def paper(self, setting: str) -> dict[str, str]:
        return {k: str(v) for k, v in self.settings[setting].get("paper", {}).items()}


# the keys that decide what a cell's clients read: cells alike in these share one data check
DATA_KEYS = (
    *("dataset", "client-data-paths", "class-names", "partitioner", "partition-by", "alpha"),
    *("classes-per-client", "train-per-client", "test-per-client", "input-shape", "num-classes"),
)


def data_problems(preset: str, cells: list[Cell]) -> list[str]:
    """The pre-flight's data checks (pflower/cli/preflight.py) for each distinct data
    a preset's cells read, before any runs: a missing file or folder, a partitioner the
    data cannot serve, a ``clients`` that does not match the sites the data define.
    One line each, naming the cell, the key and the preset key to change."""
    from methods import ConfigError, parse_run_config
    from pflower.cli.preflight import data_checks
    from pflower.data.sites import federation_fit_problem

    found: dict[str, list[str]] = {}
    seen = set()
    for cell in cells:
        if cell.engine in ("pfl", "floor"):  # FedAvg arrays handed to another loop
            continue
        data = json.dumps([cell.clients, *(cell.config.get(k) for k in DATA_KEYS)], default=str)
        if data in seen:
            continue
        seen.add(data)
        where = f"{cell.setting} / {cell.label} / seed {cell.seed}"
        try:
            cfg = parse_run_config(cell.config)
            fit = federation_fit_problem(cfg, cell.clients, "set the preset's clients = {n}")
            if fit:
                raise ConfigError(fit.replace("num-supernodes=", "clients = ", 1))
            data_checks(cfg, cell.clients)
        except ConfigError as err:
            found.setdefault(str(err).removeprefix("invalid run config: "), []).append(where)
    return [
        f"{preset}: {text} ({where[0]}"
        + (f" and {len(where) - 1} more)" if len(where) > 1 else ")")
        for text, where in found.items()
    ]


# what benchmarks/report.py reads from a preset's [report] table
REPORT_KEYS = (
    *("extras", "curves", "per-client", "heatmap", "ratio-to", "per-client-round", "out"),
    *("machine-reference", "cost-plot"),
)


def _found_elsewhere(cell: Cell, runs: Path) -> Cell:
    """A cell with no run of its own, pointed at a complete run of the same
    experiment under another preset's folder (a renamed or copied preset file): runs
    are matched by their content, the cell's config (``is_complete``), not by the
    file name."""
    if (cell.dir / "results.json").exists() or not runs.is_dir():
        return cell
    for found in sorted(runs.glob(f"*/*/{cell.config['run-name']}/results.json")):
        there = dataclasses.replace(
            cell, config={**cell.config, "output-dir": str(found.parent.parent)}
        )
        status = found.parent / "cell.json"
        engine = json.loads(status.read_text()).get("engine") if status.exists() else None
        if engine in (None, cell.engine) and is_complete(there):
            return there
    return cell


def _with_hints(unknown: list[str], known: tuple[str, ...]) -> str:
    """The unknown keys, each with the closest known one where there is one."""
    import difflib

    return ", ".join(
        f"{k!r}"
        + "".join(f" (did you mean {c!r}?)" for c in difflib.get_close_matches(k, known, 1))
        for k in unknown
    )


def load(name: str) -> Preset:
    """A preset by name (a file under benchmarks/presets) or by path."""
    path = Path(name) if name.endswith(".toml") else PRESET_DIR / f"{name}.toml"
    if not path.exists():
        raise SystemExit(f"no preset {name!r}; known: {', '.join(names())}")
    raw = tomllib.loads(path.read_text())
    for where, table, known in (
        ("top-level", raw, TOP_LEVEL),
        ("[report]", raw.get("report", {}), REPORT_KEYS),
    ):
        unknown = [k for k in table if k not in known]
        if unknown:
            raise SystemExit(f"{path.name}: unknown {where} key(s) {_with_hints(unknown, known)}")
    from methods import method_names

    METHODS = method_names()

    methods = tuple(raw.get("methods", []))
    named = [*methods, *(v["method"] for v in raw.get("variants", {}).values() if "method" in v)]
    unknown = [m for m in named if m not in METHODS]
    if unknown or not named:
        raise SystemExit(f"{path.name}: unknown or no methods {unknown}; known: {METHODS}")
    config = _flat(raw.get("config", {}))
    for key in ("engine", "clients", "rounds"):  # top-level shorthands
        if key in raw:
            config[key] = raw[key]
    variants: dict[str, dict[str, Any]] = {"": {}} if raw.get("base-row", True) else {}
    variants.update({k: _flat(v) for k, v in raw.get("variants", {}).items()})
    settings = {k: _flat(v) for k, v in (raw.get("settings") or {"default": {}}).items()}
    for sname, keys in [*settings.items(), *variants.items()]:
        tables = [k for k, v in keys.items() if isinstance(v, dict) and k != "paper"]
        if tables:  # [settings.a.5] is a table "5" inside "a": the name needs quotes
            raise SystemExit(f"{path.name} [{sname}]: {tables} are tables; quote names with dots")
        engine = {**config, **keys}.get("engine", "inprocess")
        if engine not in ENGINES:
            raise SystemExit(f"{path.name} [{sname}]: engine {engine!r} not in {ENGINES}")
        flower = str({**config, **keys}.get("flower", FLOWER_LINES[0]))
        if flower not in FLOWER_LINES:
            raise SystemExit(f"{path.name} [{sname}]: flower {flower!r} not in {FLOWER_LINES}")
    return Preset(
        name=path.stem,
        description=raw.get("description", "").strip(),
        methods=methods,
        seeds=tuple(raw.get("seeds", [0])),
        settings=settings,
        variants=variants,
        config=config,
        method_config={k: _flat(v) for k, v in raw.get("method-config", {}).items()},
        report=raw.get("report", {}),
        probe=raw.get("probe", ""),
        gpu=bool(raw.get("gpu", False)),
        equal_budget=check_budget_method(raw.get("equal-budget", ""), path.name),
    )


def check_budget_method(name: str, where: str) -> str:
    """``name`` if it is a method (or empty), else exit naming ``equal-budget``."""
    from methods import method_names

    if name and name not in method_names():
        raise SystemExit(f"{where}: equal-budget {name!r} is not a method: {method_names()}")
    return name


def budget_schedule(run_cfg: dict[str, Any], method: str) -> dict[str, Any]:
    """The local schedule (pflower.config.defaults.SCHEDULE_KEYS) that ``method`` resolves
    to on this cell's data and model, for each key the cell leaves ``auto``: so every
    row trains as many epochs, with the same batch size, optimizer and step size.
    Method keys (FedDecomp's tau epochs, DualFed's global-head epochs) keep their own
    rules, which follow ``local-epochs`` where the paper ties them to it."""
    from methods import registry
    from pflower.config.defaults import SCHEDULE_KEYS, resolve_auto
    from pflower.config.params import AUTO

    resolved, _ = resolve_auto({**run_cfg, "method": method}, registry()[method])
    return {
        k: resolved[k]
        for k in SCHEDULE_KEYS
        if run_cfg.get(k, AUTO) == AUTO and resolved.get(k, AUTO) != AUTO
    }


def _flat(keys: dict[str, Any]) -> dict[str, Any]:
    """A method's keys written as TOML dotted keys (``fedcp.mmd-lambda = 1``) load as
    a nested table; flattened back to the run-config key, as Flower flattens them."""
    from methods import registry

    namespaces = {m.params.namespace for m in registry().values()} - {""}
    out: dict[str, Any] = {}
    for key, value in keys.items():
        if key in namespaces and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def resolve(value: Any) -> Any:
    """``{dev}``, ``{dev:N}``, ``{fashion}`` and ``{dev-domains:K}`` -> data (made once)."""
    if not isinstance(value, str) or not value.startswith("{"):
        return value
    if value == "{fed-heart-disease}":
        return heart_parquet()
    if value in WEIGHT_FILES:
        return WEIGHT_FILES[value]()
    if value in ("{pfllib-partition}", "{pfllib-classes}"):
        from benchmarks.pfllib_peer import preset_partition

        return preset_partition(value.strip("{}").split("-")[1])
    match = re.fullmatch(r"\{(dev|fashion|dev-domains)(?::(\d+))?\}", value)
    if not match:
        raise SystemExit(
            f"unknown data placeholder {value!r}: {{dev}}, {{dev:N}}, {{fashion}}, "
            "{dev-domains:K}, {fed-heart-disease}, {pfllib-partition}, {pfllib-classes}, "
            + ", ".join(WEIGHT_FILES)
        )
    if match[1] == "fashion":
        return fashion_parquet()
    if match[1] == "dev-domains":
        return ",".join(domain_folders(int(match[2] or 4)))
    return subset_parquet(int(match[2] or 0), seed=0)


RESNET18_IMAGENET = Path(
    os.environ.get("PFLOWER_RESNET18_WEIGHTS") or SHARED_DATA / "resnet18-imagenet.pt"
)


def imagenet_resnet18() -> str:
    """``{resnet18-imagenet}``: the ImageNet-pretrained ResNet-18 the FedFac authors
    start from ($PFLOWER_RESNET18_WEIGHTS, else resnet18-imagenet.pt beside the dev
    set); none can be fetched here, so a missing file stops the preset in one line."""
    if not RESNET18_IMAGENET.is_file():
        raise SystemExit(
            f"{{resnet18-imagenet}}: no ImageNet ResNet-18 weights at {RESNET18_IMAGENET} "
            "(torchvision's resnet18 IMAGENET1K_V1 state_dict saved with torch.save; set "
            "PFLOWER_RESNET18_WEIGHTS to its file)"
        )
    return str(RESNET18_IMAGENET)


def random_resnet18(out_dir: Path = DATA_CACHE) -> str:
    """``{resnet18-random-init}``: a seeded random-init ResNet-18 state_dict (made once),
    to run a profile that needs a weight file where ImageNet's cannot be had: the
    rows that use it train from random init, as their labels say."""
    path = out_dir / "resnet18-random-init-seed0.pt"
    if not path.exists():
        import torch
        from torchvision.models import resnet18

        torch.manual_seed(0)
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(resnet18().state_dict(), tmp)
        tmp.replace(path)
    return str(path)


WEIGHT_FILES = {"{resnet18-imagenet}": imagenet_resnet18, "{resnet18-random-init}": random_resnet18}


def require_shared_data() -> None:
    """Stop in one line naming what the tests read of the shared data and is missing
    (the CIFAR-10 dev set, the Fed-Heart-Disease folder): ``dev.sh test``'s first step."""
    missing = [str(f) for f in (CIFAR10_DEV, SHARED_DATA / "fed-heart-disease") if not f.exists()]
    if missing:
        raise SystemExit(
            f"dev.sh test: the shared data are missing: {', '.join(missing)} (set "
            "PFLOWER_DATA_DIR to the folder that holds them; docs/DATA.md)"
        )


def heart_parquet(out_dir: Path = DATA_CACHE) -> str:
    """The Fed-Heart-Disease table (pflower/data/fed_heart_disease.py), made once from the
    UCI files under ../shared/data/fed-heart-disease (or $PFLOWER_DATA_DIR)."""
    from pflower.data import fed_heart_disease

    source = SHARED_DATA / "fed-heart-disease"
    path = out_dir / "fed-heart-disease.parquet"
    if not path.exists():
        if not source.is_dir():
            raise SystemExit(
                f"the Fed-Heart-Disease files are missing: {source} (the four UCI "
                "processed.*.data files; docs/DATA.md)"
            )
        tmp = fed_heart_disease.build(source, out_dir / "tmp-fed-heart-disease.parquet")
        tmp.replace(path)
    return str(path)


def subset_parquet(rows: int, seed: int, out_dir: Path = DATA_CACHE) -> str:
    """A seeded ``rows``-row subset of the dev set (0 = all of it): a smaller file
    decodes faster in every client process."""
    if not CIFAR10_DEV.exists():
        raise SystemExit(
            f"the CIFAR-10 dev set is missing: {CIFAR10_DEV}; make it with `python -m "
            f"pflower.data.recipes build cifar10-dev-check --out {SHARED_DATA}` (docs/DATA.md), "
            "or set PFLOWER_DATA_DIR to the folder that holds it"
        )
    if rows <= 0:
        return str(CIFAR10_DEV)
    import pyarrow.parquet as pq

    path = out_dir / f"cifar10-dev-{rows}-seed{seed}.parquet"
    if not path.exists():
        table = pq.read_table(CIFAR10_DEV)
        keep = np.sort(np.random.default_rng(seed).choice(table.num_rows, rows, replace=False))
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        pq.write_table(table.take(keep), tmp)
        tmp.replace(path)
    return str(path)


def domain_folders(domains: int, out_dir: Path = DATA_CACHE, source: str = "") -> list[str]:
    """A data set (default: the dev set) as ``domains`` per-site image folders, the
    per-site layout of DEPLOYMENT.md: disjoint seeded shares of its images, folder k's
    pixels through domain transform k (those of ``domain-shift``), one PNG sub-folder a
    class, named ``<label id>-<class name>`` so that every site reads the same label
    ids. Made once."""
    from PIL import Image

    from pflower.data.hf import apply_domain_shift, load_source

    src_path = source or subset_parquet(0, seed=0)
    root = out_dir / f"{Path(source).stem if source else 'cifar10-dev'}-domains{domains}"
    folders = [root / f"domain-{k}" for k in range(domains)]
    if (root / ".complete").exists():
        return [str(f) for f in folders]
    src = load_source(src_path)
    names = src.class_names or tuple(str(c) for c in range(src.num_classes))
    order = np.random.default_rng(0).permutation(len(src.labels))
    for k, rows in enumerate(np.array_split(order, domains)):
        rows = np.sort(rows)
        pixels = apply_domain_shift(src.raw(rows), k)  # (n, C, H, W) in [0, 1]
        images = np.rint(pixels.transpose(0, 2, 3, 1) * 255).astype(np.uint8)
        for row, image in zip(rows, images, strict=True):
            label = int(src.labels[row])
            out = folders[k] / f"{label:0{len(str(len(names)))}d}-{names[label]}"
            out.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(
                out / f"{row}.png"
            )
    (root / ".complete").write_text("")
    return [str(f) for f in folders]


def fashion_parquet() -> str:
    """Debian's Fashion-MNIST IDX files as one parquet file (made once)."""
    path = DATA_CACHE / "fashion-mnist.parquet"
    if not path.exists():
        if not FASHION_IDX.exists():
            raise SystemExit("Fashion-MNIST is missing: apt-get install -y dataset-fashion-mnist")
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pflower.data.convert_idx", str(FASHION_IDX), str(path)]
        subprocess.run(cmd, cwd=REPO, check=True)
    return str(path)


# ----------------------------------------------------------------------------- a cell's stored run


def load_results(cell: Cell) -> dict[str, Any] | None:
    try:
        return json.loads((cell.dir / "results.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


# where and how a run keeps its files, not what it computes; and the rounds, which a
# resumed run asks only the rest of (the rounds recorded are compared instead)
NOT_COMPARED = (
    "output-dir",
    "personal-state",
    "personal-state-budget-mb",
    "resume-from",
    "num-server-rounds",
    "max-minutes",  # when a run stops, not what it computes (a stopped cell resumes)
)


def same_experiment(cell: Cell, stored: dict[str, Any]) -> bool:
    """Whether a run's stored config is this cell's experiment."""
    given = {k: v for k, v in cell.config.items() if k not in NOT_COMPARED and v != "auto"}
    if any(stored.get(k) != v for k, v in given.items()):
        return False
    # an ``auto`` key (left out, or set to "auto" as a setting may) must still resolve to
    # what the run used, so a run made before a default changed is redone (a key the run
    # predates is not compared)
    from methods import parse_run_config

    wanted = parse_run_config(cell.config)
    now = wanted.as_dict()
    return all(stored[k] == now[k] for k in wanted.auto_resolved if k in stored)


def is_complete(cell: Cell) -> bool:
    """results.json reached the last round, for exactly this cell's config. (A round
    none of whose clients could evaluate has no record: DP noise can do that.)"""
    res = load_results(cell)
    rounds = (res or {}).get("rounds", [])
    if not rounds or max(len(rounds), rounds[-1].get("round", 0)) < cell.rounds:
        return False
    if res.get("federation_size", cell.clients) != cell.clients:  # not in the config
        return False
    return same_experiment(cell, res.get("config", {}))
