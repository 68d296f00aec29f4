"""What the benchmark scripts share: where the data lives, dev-set subsets,
and the resume check for a finished run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"  # ../shared/data beside the checkout
CIFAR10_DEV = str(SHARED_DATA / "cifar10-dev-12k.parquet")


def subset_parquet(rows: int, seed: int, out_dir: Path) -> str:
    """A seeded ``rows``-row subset of the dev set (0 = all of it): every process of
    a run decodes the whole file, so a smaller file starts faster."""
    if rows <= 0:
        return CIFAR10_DEV
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


def complete(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The results at ``path`` if they finished every round of this config."""
    if not path.exists():
        return None
    res = json.loads(path.read_text())
    cfg = res.get("config", {})
    if any(cfg.get(k) != v for k, v in config.items() if k != "output-dir"):
        return None
    if len(res.get("rounds", [])) != config["num-server-rounds"]:
        return None
    return res
