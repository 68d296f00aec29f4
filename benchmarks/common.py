"""What the benchmark scripts share: where the data lives, dev-set subsets,
the resume check for a finished run, and one resumable simulation."""

from __future__ import annotations

import json
import time
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


def run_one(config: dict[str, Any], clients: int) -> dict[str, Any]:
    """One simulation (skipped when its results are complete); adds wall_seconds."""
    path = Path(config["output-dir"]) / config["run-name"] / "results.json"
    done = complete(path, config)
    if done is not None:
        print(f"reusing {path}", flush=True)
        return done
    from server_app.simulate import simulate

    started = time.time()
    simulate(config, clients)
    res = complete(path, config)
    if res is None:
        raise RuntimeError(f"{config['run-name']} did not complete: {path}")
    res["wall_seconds"] = time.time() - started
    path.write_text(json.dumps(res, indent=1))
    print(f"{config['run-name']}: {res['wall_seconds']:.0f} s", flush=True)
    return res
