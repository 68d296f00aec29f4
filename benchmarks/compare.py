"""Methods (or variants of one) side by side over seeds, in-process
(server_app/inprocess.py: the real strategy and clients, Flower's round loop).

    python -m benchmarks.compare [--methods ...] [--seeds 0 1 2] [--rounds 10]
        [--clients 10] [--set key=value ...] [--variant name:key=value,... ...]
        [--name NAME] [--out docs/main_job]

Every run uses each method's own ``auto`` settings plus ``--set``; a
``--variant`` adds one more row per method with its keys on top. Writes
``<out>/<name>.md`` (mean +- std of the final and best mean accuracy, and the
mean of any per-round extra named by ``--extra``) and the same ``.json``.
The main job's choice (docs/main_job.md) was made with it on the default data.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from run_config.schema import METHODS
from server_app.inprocess import run_inprocess


def parse_pairs(text: str) -> dict[str, object]:
    """``k=v,k2=v2`` (or space separated) with TOML values, as ``--run-config``."""
    import tomllib

    pairs = [p for p in text.replace(",", " ").split() if p]
    return tomllib.loads("\n".join(f"{k} = {v}" for k, v in (p.split("=", 1) for p in pairs)))


def _quote(arg: str) -> str:
    """Shell quoting that keeps TOML's single quotes readable."""
    if re.fullmatch(r"[\w./:=,-]+", arg):
        return arg
    return f'"{arg}"' if '"' not in arg else shlex.quote(arg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--set", nargs="*", default=[], help="key=value for every run")
    ap.add_argument("--variant", nargs="*", default=[], help="name:key=value,... (extra rows)")
    ap.add_argument("--extra", nargs="*", default=[], help="per-round record keys to average")
    ap.add_argument("--name", default="")
    ap.add_argument("--out", default="docs/main_job")
    args = ap.parse_args()
    common = parse_pairs(" ".join(args.set))
    variants = [("", {})] + [
        (v.split(":", 1)[0], parse_pairs(v.split(":", 1)[1])) for v in args.variant
    ]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for vname, vcfg in variants:
                label = f"{method} {vname}".strip()
                finals, bests, secs, extras = [], [], [], {k: [] for k in args.extra}
                for seed in args.seeds:
                    cfg = {
                        **common,
                        **vcfg,
                        "method": method,
                        "seed": seed,
                        "num-server-rounds": args.rounds,
                        "output-dir": tmp,
                        "run-name": f"{label}-{seed}".replace(" ", "_"),
                    }
                    t0 = time.time()
                    res = run_inprocess(cfg, args.clients)
                    secs.append(time.time() - t0)
                    finals.append(res["final_accuracy_mean"])
                    bests.append(res["best_accuracy_mean"])
                    for k in args.extra:
                        vals = [r[k] for r in res["rounds"] if isinstance(r.get(k), (int, float))]
                        extras[k].append(statistics.mean(vals) if vals else float("nan"))
                    print(f"{label} seed {seed}: final {finals[-1]:.4f}", flush=True)
                rows[label] = {"final": finals, "best": bests, "seconds": secs, **extras}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"r{args.rounds}-" + ("-".join(args.set) or "default")
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    head = ["method", "final acc. (mean over clients)", "best acc.", *args.extra, "s per run"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for m in sorted(rows, key=lambda m: -statistics.mean(rows[m]["final"])):
        f, b, s = rows[m]["final"], rows[m]["best"], rows[m]["seconds"]
        sd = statistics.stdev(f) if len(f) > 1 else 0.0
        ex = [f"{statistics.mean(rows[m][k]):.3f}" for k in args.extra]
        cells = [f"`{m}`", f"{100 * statistics.mean(f):.1f} ± {100 * sd:.1f}"]
        cells += [f"{100 * statistics.mean(b):.1f}", *ex, f"{statistics.mean(s):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    command = "python -m benchmarks.compare " + " ".join(_quote(a) for a in sys.argv[1:])
    (out / f"{name}.md").write_text(
        f"# {name}\n\n{args.clients} clients, {args.rounds} rounds, seeds {args.seeds}, each "
        f"method with its own `auto` settings{'; ' + ', '.join(args.set) if args.set else ''}.\n"
        f"Made with `{command}` (in-process: the real strategy and clients, Flower's "
        "round loop, no Ray).\n\n" + table + "\n"
    )
    print(table)


if __name__ == "__main__":
    main()
