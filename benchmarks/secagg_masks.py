"""SecAgg+ mask cost: the PRF masks (pfl_patches.mask_arrays) against Flower 1.39's
``pseudo_rand_gen``, side by side in one process, for the masks one SecAgg+ round
draws: each client one private mask and one pairwise mask per neighbour, the server
one private mask per client (no drop-outs): n masks per party at n sites. Shapes: the model of the
``privacy-secagg`` preset and ResNet-8 on CIFAR-10.

    python -m benchmarks.secagg_masks [--repeats 3] [--out docs/results/secagg-masks.md]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pfl_patches

MODELS = {  # name -> run config of the model whose shared tensors are masked
    "privacy-secagg (synthetic MLP)": {"dataset": "synthetic", "sim-samples": 400},
    "ResNet-8, CIFAR-10 (cpu-cifar10)": {
        "dataset": str(Path(__file__).parents[2] / "shared/data/cifar10-dev-12k.parquet"),
        "model": "resnet8",
        "num-classes": 10,
    },
}


def shapes_of(config: dict[str, Any]) -> list[tuple[int, ...]]:
    """The shapes of a method's uploaded tensors for this run config (FedAvg: all)."""
    from methods import get_method, parse_run_config
    from pfl_data import data_info

    cfg = parse_run_config({"method": "fedavg", **config})
    model = get_method("fedavg").build_model(cfg, data_info(cfg))
    return [tuple(v.shape) for v in model.state_dict().values()]


def seconds(generator: Callable[..., Any], shapes: list[tuple[int, ...]], calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        generator(i.to_bytes(4, "little") * 11, 2**32, shapes)  # a 44-byte seed, as ECDH's
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.secagg_masks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sites", default="5,10,20")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    pfl_patches.secagg_masks()
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
            new = min(seconds(pfl_patches.mask_arrays, shapes, sites) for _ in range(args.repeats))
            rows.append(
                f"| {name} | {values:,} | {sites} | {old:.4f} | {new:.4f} | {new / old:.2f}x |"
            )
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(
            "# SecAgg+ masks: PRF against Flower's generator\n\n"
            "`python -m benchmarks.secagg_masks --out docs/results/secagg-masks.md`\n\n"
            f"{table}\n"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
