"""Answered (2026-11-25): the PRF masks cost 0.35-1.26x Flower's generator and a whole
secure round 0.70-1.15x: docs/PERFORMANCE.md ("SecAgg+ masks") and
docs/results/secagg-masks.md.

SecAgg+ mask cost: the PRF masks (pflower.patches.mask_arrays) against Flower 1.39's
``pseudo_rand_gen``, side by side in one process, for the masks one SecAgg+ round
draws: each client one private mask and one pairwise mask per neighbour, the server
one private mask per client (no drop-outs): n masks per party at n sites. Shapes: the model of the
``privacy-secagg`` preset and ResNet-8 on CIFAR-10.

    python -m benchmarks.studies.secagg_masks [--repeats 3] [--rounds] [--out docs/results/secagg-masks.md]

``--rounds`` also times whole secure rounds (the ``privacy-secagg`` preset's FedAvg,
Flower's Ray simulation) with each generator, one run after the other: the product
has no switch back to Flower's generator, so for the "flower" runs a
``sitecustomize`` on the benchmark's own PYTHONPATH (inherited by the Ray workers)
puts it in place of the PRF in every process of that run.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pflower.patches

MODELS = {  # name -> run config of the model whose shared tensors are masked
    "privacy-secagg (synthetic MLP)": {"dataset": "synthetic", "sim-samples": 400},
    "ResNet-8, CIFAR-10 (cpu-cifar10)": {  # declared: no data read
        "model": "resnet8",
        "input-shape": "3,32,32",
        "num-classes": 10,
    },
}


def shapes_of(config: dict[str, Any]) -> list[tuple[int, ...]]:
    """The shapes of a method's uploaded tensors for this run config (FedAvg: all)."""
    from methods import get_method, parse_run_config
    from pflower.data import data_info

    cfg = parse_run_config({"method": "fedavg", **config})
    model = get_method("fedavg").build_model(cfg, data_info(cfg))
    return [tuple(v.shape) for v in model.state_dict().values()]


def seconds(generator: Callable[..., Any], shapes: list[tuple[int, ...]], calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        generator(i.to_bytes(4, "little") * 11, 2**32, shapes)  # a 44-byte seed, as ECDH's
    return time.perf_counter() - start


SITECUSTOMIZE = """\
import pflower.patches
from flwr.common.secure_aggregation import secaggplus_utils
pflower.patches.mask_arrays = secaggplus_utils.pseudo_rand_gen  # benchmark only: Flower's masks
"""
ROUND_CONFIG = {  # the privacy-secagg preset's secure cell
    "method": "fedavg",
    "dataset": "synthetic",
    "sim-samples": 400,
    "sim-shared-neurons": 0.5,
    "sim-shared-covariates": 0.4,
    "personal-state": "budget",
    "secure-aggregation": True,
    "num-server-rounds": 4,
}


def round_seconds(generator: str, sites: int, folder: Path) -> tuple[float, float]:
    """(median seconds of the rounds after the first, final accuracy) of one secure run."""
    import json
    import os
    import statistics
    import subprocess

    from benchmarks.presets import REPO

    env = dict(os.environ)
    paths = [str(REPO), env.get("PYTHONPATH", "")]  # the repository, for Ray's workers too
    if generator == "flower":
        hook = folder / "flower-masks"
        hook.mkdir(parents=True, exist_ok=True)
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        paths.insert(0, str(hook))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    name = f"{generator}-{sites}"
    config = {**ROUND_CONFIG, "output-dir": str(folder), "run-name": name}
    code = (
        "import json, sys; from pflower.engine.simulate import simulate; "
        f"simulate(json.loads(sys.argv[1]), {sites}, num_cpus=2.0)"
    )
    subprocess.run(
        [sys.executable, "-c", code, json.dumps(config)], env=env, check=True, capture_output=True
    )
    res = json.loads((folder / name / "results.json").read_text())
    times = [r["seconds"] for r in res["rounds"][1:]]
    return statistics.median(times), res["final_accuracy_mean"]


def round_rows(sites_list: list[int], folder: Path) -> list[str]:
    rows = [
        "| sites n | Flower masks: s/round | PRF masks: s/round | PRF / Flower "
        "| final accuracy (Flower, PRF) |",
        "|---|---|---|---|---|",
    ]
    for sites in sites_list:
        (old, old_acc), (new, new_acc) = (
            round_seconds(g, sites, folder) for g in ("flower", "prf")
        )
        rows.append(
            f"| {sites} | {old:.2f} | {new:.2f} | {new / old:.2f}x | "
            f"{100 * old_acc:.1f}%, {100 * new_acc:.1f}% |"
        )
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.secagg_masks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sites", default="5,10,20")
    parser.add_argument("--rounds", action="store_true", help="also time whole secure rounds")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    pflower.patches.secagg_masks()
    flower = sys.modules["flwr.common.secure_aggregation.secaggplus_utils"]._flower_pseudo_rand_gen
    rows = [
        "| model | values masked | sites n | Flower s per party-round | PRF s per party-round "
        "| PRF / Flower |",
        "|---|---|---|---|---|---|",
    ]
    for name, config in MODELS.items():
        shapes = shapes_of(config)
        values = sum(math.prod(s) for s in shapes)
        for sites in (int(s) for s in args.sites.split(",")):
            # a client draws 1 private + (n - 1) pairwise masks, the server n private
            # ones (no drop-outs): n masks per party and round, interleaved best-of
            old = min(seconds(flower, shapes, sites) for _ in range(args.repeats))
            new = min(
                seconds(pflower.patches.mask_arrays, shapes, sites) for _ in range(args.repeats)
            )
            rows.append(
                f"| {name} | {values:,} | {sites} | {old:.4f} | {new:.4f} | {new / old:.2f}x |"
            )
    table = "\n".join(rows)
    print(table)
    command = "python -m benchmarks.studies.secagg_masks"
    if args.rounds:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            sites_list = [int(s) for s in args.sites.split(",")]
            rounds = "\n".join(round_rows(sites_list, Path(tmp)))
        print(rounds)
        table += "\n\nWhole secure rounds (privacy-secagg's FedAvg, 4 rounds, Ray simulation):\n\n"
        table += rounds
        command += " --rounds"
    if args.out:
        Path(args.out).write_text(
            "# SecAgg+ masks: PRF against Flower's generator\n\n"
            f"`{command} --out {args.out}`\n\n{table}\n"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
