"""One reporter: a preset's cells -> ``<out>/<preset>.md`` (a table per setting, the
command that made it), ``<out>/<preset>.csv`` (one line per run: every seed's
figures) and ``<out>/<preset>-<setting>.png`` (curves, accuracy against bytes,
per-client accuracy, any per-round extras). Numbers only: what they mean is written
in docs/, after reading them.

``[report]`` keys of a preset: ``out`` (default docs/results; ``--out`` wins), ``extras`` (record
keys as ``name`` or ``name:final|mean|sum|max``, looked up in the run's probe, its
top level, then its rounds), ``curves`` (per-round keys drawn), ``per-client``
(draw each client's final accuracy), ``heatmap`` (a per-round client x client
matrix, e.g. Factorized-FL's ``ffl_mixture``, drawn for the last round of seed 0),
``ratio-to`` (a row label: s/round divided by that row's), ``per-client-round`` (a
column of seconds per client per round: each round's seconds over its replies),
``machine-reference`` (the machine's reference step timed around each cell and
tabulated: benchmarks/machine.py), ``cost-plot`` (``<preset>-cost.png``: seconds per
client-round and peak memory against the number of clients, one line per row: the
scale presets).
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import machine
from benchmarks.presets import REPO, RESERVED, Cell, Preset, is_complete, load_results
from pflower.results import git_commit, scored_rounds
from pflower.results.reference import REFERENCE_FILE

AGGREGATES = {"final": lambda v: v[-1], "mean": np.mean, "sum": np.sum, "max": np.max}


def extra_value(res: dict[str, Any], spec: str) -> float | None:
    """One number per run for ``name[:agg]``."""
    name, _, agg = spec.partition(":")
    for source in (res.get("probe", {}), res):
        if isinstance(source.get(name), (int, float)):
            return float(source[name])
    values = [r[name] for r in res["rounds"] if isinstance(r.get(name), (int, float))]
    return float(AGGREGATES[agg or "final"](values)) if values else None


def summarise(cells: list[Cell]) -> dict[str, Any]:
    """One table row from a row's cells (one per seed): only complete runs count."""
    runs = [(c, load_results(c)) for c in cells if is_complete(c)]
    if not runs:
        reasons = []
        for c in cells:
            status = c.dir / "cell.json"
            if status.exists():
                reasons.append(json.loads(status.read_text()).get("reason", ""))
        return {"n": 0, "reason": next((r for r in reasons if r), "not run")}
    results = [r for _, r in runs]
    n_rounds = min(len(r["rounds"]) for r in results)
    curves = np.array(  # an unscored round (evaluate-every): NaN
        [[x["accuracy_mean"] for x in r["rounds"][:n_rounds]] for r in results], dtype=float
    )
    traffic = [
        [x.get("bytes_up", 0) + x.get("bytes_down", 0) for x in r["rounds"]] for r in results
    ]
    peaks, cpu, reference = [], [], []
    for c, _ in runs:
        status = c.dir / "cell.json"
        if status.exists():
            kept = json.loads(status.read_text())
            peaks.append(kept.get("peak_rss", 0) / 1e6)
            if kept.get("cpu"):
                cpu.append(kept["cpu"])
            if kept.get("reference_ms"):
                reference.append(kept["reference_ms"])
    secs = [[x["seconds"] for x in r["rounds"]] for r in results]
    return {
        "n": len(results),
        "seeds": [c.seed for c, _ in runs],
        "final": [r["final_accuracy_mean"] for r in results],
        "best": [r["best_accuracy_mean"] for r in results],
        "best_pooled": [r.get("best_accuracy_pooled", r["final_accuracy_pooled"]) for r in results],
        "mb": float(np.mean([sum(t) / 1e6 / len(t) / cells[0].clients for t in traffic])),
        # steady state: the median round after the first (start-up costs land in round 1;
        # the closing evaluation is timed apart, strategies/recording.py)
        "s_round": float(np.mean([np.median(s[1:] if len(s) > 1 else s) for s in secs])),
        "peak_mb": float(np.mean(peaks)) if peaks else float("nan"),
        "cpu": cpu,  # CPU by process over the timed rounds (benchmarks/machine.py)
        "reference_ms": reference,  # the machine's step before and after (machine.py)
        # per client that trained: each round's seconds over its replies, the median after round 1
        "s_client_round": float(
            np.mean(
                [
                    np.median([x["seconds"] / max(x.get("replies", 1), 1) for x in rs[1:] or rs])
                    for rs in (r["rounds"] for r in results)
                ]
            )
        ),
        "x": [x.get("round", i + 1) for i, x in enumerate(results[0]["rounds"][:n_rounds])],
        "curve": curves.mean(axis=0),
        "curve_std": curves.std(axis=0),
        "cum_mb": np.cumsum(np.mean([t[:n_rounds] for t in traffic], axis=0)) / 1e6,
        # each seed's final per-client accuracy, and each client's test-set size
        "per_client": [r["rounds"][-1].get("per_client_accuracy", {}) for r in results],
        "test_sizes": {
            k: v.get("test", 0)
            for k, v in results[0]["rounds"][-1].get("per_client_samples", {}).items()
        },
        "sites": site_names(results[0].get("config", {})),
        "rounds": [r["rounds"][:n_rounds] for r in results],
        "results": results,
    }


def site_names(config: dict[str, Any]) -> dict[str, str]:
    """Client key -> the site's name: its folder under ``client-data-paths`` (the
    clients take the paths in order); other clients keep their key."""
    paths = [p.strip() for p in str(config.get("client-data-paths", "")).split(",") if p.strip()]
    return {f"client-{i}": Path(p).name or p for i, p in enumerate(paths)}


def client_order(keys: Iterable[str]) -> list[str]:
    """Client keys in partition order (client-2 before client-10)."""
    return sorted(keys, key=lambda k: (len(k), k))


MAX_SITES_TABLE = 20  # more clients than this: no per-site table (the plot shows them)


def per_site_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Each row's final accuracy at each site (mean over seeds, 95% interval), the
    columns named by the site and its test-set size: a site of 6 test samples moves
    in steps of 16.7 points."""
    done = {k: v for k, v in rows.items() if v["n"] and v["per_client"] and v["per_client"][0]}
    if not done:
        return []
    first = next(iter(done.values()))
    keys = client_order(first["per_client"][0])
    if len(keys) > MAX_SITES_TABLE:
        return []
    names = [f"{first['sites'].get(k, k)} (n={first['test_sizes'].get(k, '?')})" for k in keys]
    lines = ["", "Per site (final accuracy %, mean over seeds and its 95% interval):", ""]
    lines += ["| row | " + " | ".join(names) + " |", "|---" * (len(keys) + 1) + "|"]
    for label, row in done.items():
        cells = []
        for k in keys:
            v = [100 * pc[k] for pc in row["per_client"] if k in pc]
            cells.append(f"{np.mean(v):.1f} {interval_text(v)}" if v else "")
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return lines


def _pct(values: list[float]) -> str:
    arr = 100 * np.asarray(values, dtype=float)
    return f"{arr.mean():.1f} ± {arr.std(ddof=1):.1f}" if len(arr) > 1 else f"{arr.mean():.1f}"


def ci95(values: list[float]) -> tuple[float, float] | None:
    """The 95% confidence interval of the mean over seeds (Student's t, from scipy:
    its quantiles for small n), or None for one seed."""
    from scipy import stats

    arr = np.asarray(values, dtype=float)
    if len(arr) < 2:
        return None
    half = stats.t.ppf(0.975, len(arr) - 1) * arr.std(ddof=1) / np.sqrt(len(arr))
    return float(arr.mean() - half), float(arr.mean() + half)


def interval_text(percents: list[float]) -> str:
    """The 95% interval over seeds of values in %, as a reader should take it: clipped
    to [0, 100] and marked ``*`` when clipped, flagged as not meaningful below 3 seeds,
    and said to be a point (not certainty) when every seed scored the same."""
    v = np.asarray(percents, dtype=float)
    if len(v) < 2:
        return "one seed"
    if np.allclose(v, v[0]):
        return f"all {len(v)} seeds equal"
    lo, hi = ci95(list(v))  # type: ignore[misc]
    text = f"[{max(lo, 0.0):.1f}, {min(hi, 100.0):.1f}]" + ("*" if lo < 0 or hi > 100 else "")
    return text + (f" (n={len(v)}: not meaningful)" if len(v) < 3 else "")


def _ci(values: list[float]) -> str:
    return interval_text([100 * x for x in values])


def _seeds(row: dict[str, Any]) -> str:
    return ", ".join(f"{100 * v:.1f}" for v in row["final"])


def _num(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return ""
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def table(preset: Preset, setting: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    extras = list(preset.report.get("extras", []))
    ratio_to = preset.report.get("ratio-to", "")
    base = rows.get(ratio_to, {}).get("s_round") if ratio_to else None
    paper = preset.paper(setting)
    head = ["row", "seeds", "final acc (%)", "95% CI", "each seed", "best acc (%)"]
    head += ["best pooled (%)", "MB/client/round"]
    per_client = bool(preset.report.get("per-client-round"))
    head += ["s/round", *([f"x {ratio_to}"] if ratio_to else [])]
    head += [*(["s/client-round"] if per_client else []), "peak RSS (MB)", *extras]
    head += ["paper"] if paper else []
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, row in rows.items():
        method = label.split(" ")[0]
        cells = [f"`{label}`", str(row["n"])]
        if not row["n"]:
            reason = row["reason"][:160]  # a row no command ran is not a failure
            cells += [reason if reason == "not run" else f"failed: {reason}"]
            cells += [""] * (len(head) - 3)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells += [_pct(row["final"]), _ci(row["final"]), _seeds(row)]
        cells += [_pct(row["best"]), _pct(row["best_pooled"])]
        cells += [f"{row['mb']:.3g}", f"{row['s_round']:.2f}"]
        if ratio_to:
            cells.append(f"{row['s_round'] / base:.1f}" if base else "")
        if per_client:
            cells.append(f"{row['s_client_round']:.4f}")
        cells.append(_num(row["peak_mb"]))
        for spec in extras:
            values = [v for r in row["results"] if (v := extra_value(r, spec)) is not None]
            cells.append(_num(float(np.mean(values))) if values else "")
        if paper:
            cells.append(paper.get(label, paper.get(method, "") if label == method else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cpu_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """CPU a client-round by process over rounds 2 to N-1 (seed 0; benchmarks/machine.py),
    and the cores that kept busy: their CPU seconds over the rounds' wall seconds."""
    kept = {k: v["cpu"][0] for k, v in rows.items() if v["n"] and v.get("cpu")}
    kept = {k: c for k, c in kept.items() if c["client_rounds"] and c["wall_seconds"] > 0}
    if not kept:
        return []
    roles = [r for r in machine.ROLES if any(c["cpu_seconds"].get(r, 0) > 0 for c in kept.values())]
    head = ["row", "rounds", *(f"{r} (ms)" for r in roles), "all (ms)", "cores busy"]
    lines = ["", "CPU a client-round, by process, over the rounds named (seed 0):", ""]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, c in kept.items():
        per = {r: 1000 * c["cpu_seconds"].get(r, 0.0) / c["client_rounds"] for r in roles}
        total = sum(c["cpu_seconds"].values())
        cells = [f"`{label}`", "{}-{}".format(*c["rounds"])]
        cells += [f"{per[r]:.1f}" for r in roles]
        cells += [f"{1000 * total / c['client_rounds']:.1f}", f"{total / c['wall_seconds']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def machine_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """The machine's reference step just before and after each row's first cell
    (benchmarks/machine.py), and their spread over the setting: how far a ratio
    between two rows can be the machine's rather than the engines'."""
    kept = {k: v["reference_ms"][0] for k, v in rows.items() if v.get("reference_ms")}
    if not kept:
        return []
    every = [ms for pair in kept.values() for ms in pair]
    lines = [
        "",
        "The machine's reference step (benchmarks/machine.py: CNN4, batch 16, one torch "
        "thread), just before and after each row's cell (seed 0); over this setting "
        f"the slowest is {100 * machine.spread(every):.0f}% above the fastest:",
        "",
        "| row | before (ms) | after (ms) |",
        "|---|---|---|",
    ]
    lines += [f"| `{k}` | {a:.2f} | {b:.2f} |" for k, (a, b) in kept.items()]
    return lines


def phases_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Where a round's time goes: the median ClientApp message phase by phase
    (deployments log them) and the server's side (every run records it), seed 0."""
    cols = {}
    for label, row in rows.items():
        if not row["n"]:
            continue
        res = row["results"][0]
        server = [r["server_seconds"] for r in res["rounds"][1:] if r.get("server_seconds")]
        phases = {f"client: {k}": v for k, v in res.get("client_phases", {}).items()}
        for k in dict.fromkeys(k for s in server for k in s):
            phases[f"server: {k}"] = float(np.median([s[k] for s in server if k in s]))
        if phases:
            cols[label] = phases
    if not any(any(k.startswith("client") for k in c) for c in cols.values()):
        return []
    names = list(dict.fromkeys(k for c in cols.values() for k in c))
    lines = ["", "| phase (s, median; seed 0) | " + " | ".join(cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_num(c.get(name)) for c in cols.values()) + " |")
    return lines


def plot(preset: Preset, setting: str, rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = list(preset.report.get("curves", []))
    per_client = bool(preset.report.get("per-client", False))
    done = {k: v for k, v in rows.items() if v["n"]}
    key = preset.report.get("heatmap", "")  # a per-round {"clients", "matrix"} record
    heat = {k: v["rounds"][0][-1][key] for k, v in done.items() if key in v["rounds"][0][-1]}
    panels = 2 + len(curves) + per_client + len(heat)
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
    axes = axes[0]
    for i, (label, row) in enumerate(done.items()):
        color = plt.cm.tab20(i % 20) if len(done) > 10 else f"C{i}"  # distinct colours
        x = np.asarray(row["x"])  # the recorded rounds (a round may have no record)
        axes[0].plot(x, 100 * row["curve"], marker="o", ms=3, color=color, label=label)
        low, high = row["curve"] - row["curve_std"], row["curve"] + row["curve_std"]
        axes[0].fill_between(x, 100 * low, 100 * high, color=color, alpha=0.15)
        axes[1].plot(row["cum_mb"], 100 * row["curve"], marker="o", ms=3, color=color)
        for ax, key in zip(axes[2:], curves):
            series = [[r.get(key) for r in rr] for rr in row["rounds"]]
            series = [s for s in series if all(isinstance(v, (int, float)) for v in s)]
            if series:
                ax.plot(x, np.mean(series, axis=0), marker="o", ms=3, color=color)
            ax.set(xlabel="round", title=key)
        if per_client and row["per_client"]:  # every seed's clients, a marker per site
            ax = axes[2 + len(curves)]
            keys = client_order({k for pc in row["per_client"] for k in pc})
            for j, k in enumerate(keys):
                pc = [100 * p[k] for p in row["per_client"] if k in p]
                offset = (j - (len(keys) - 1) / 2) * min(0.6 / max(len(keys), 1), 0.15)
                marker = "os^Dvp<>h*"[j % 10] if len(keys) <= 10 else "o"
                label_k = row["sites"].get(k, k) if i == 0 and len(keys) <= 10 else None
                ax.scatter(
                    np.full(len(pc), i + offset),
                    pc,
                    s=14,
                    color=color,
                    marker=marker,
                    alpha=0.7,
                    label=label_k,
                )
    axes[0].set(xlabel="round", ylabel="accuracy, mean over clients (%)")
    if done:  # every round on the axis, also where only some were scored (evaluate-every)
        axes[0].set_xlim(0.5, max(len(r["rounds"][0]) for r in done.values()) + 0.5)
    axes[0].set_title(f"{preset.name}: {setting}")
    axes[1].set(xlabel="cumulative MB sent (up + down)", ylabel="accuracy (%)")
    axes[1].set_title("accuracy vs communication")
    if any(r["cum_mb"][-1] > 0 for r in done.values()):
        firsts = [r["cum_mb"][0] for r in done.values() if r["cum_mb"][0] > 0]
        axes[1].set_xscale("symlog", linthresh=min(firsts))  # zero-byte Local fits too
    if per_client:
        ax = axes[2 + len(curves)]
        ax.set_xticks(range(len(done)), list(done), rotation=45, ha="right", fontsize=7)
        seeds = max(r["n"] for r in done.values()) if done else 0
        ax.set(ylabel="final accuracy (%)", title=f"each client, every seed ({seeds})")
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=6, title="site", title_fontsize=6)
    for ax, (label, record) in zip(axes[panels - len(heat) :], heat.items()):
        image = ax.imshow(np.asarray(record["matrix"]), vmin=0, vmax=1, cmap="viridis")
        ax.set(xlabel="from client", ylabel="client", title=f"{label}: {key}, last round")
        fig.colorbar(image, ax=ax, fraction=0.046)
    if done:
        axes[0].legend(fontsize=7)
    for ax in axes[: panels - len(heat)]:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cost_points(preset: Preset, cells: list[Cell]) -> dict[str, list[tuple[int, float, float]]]:
    """row -> [(clients, s/client-round, peak GB)] of each setting's complete cell of the
    lowest seed: each round's seconds over its replies, the median after round 1 (as the
    report's column), and the peak of the run's process tree."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for label, _, _ in preset.rows():
        mine = sorted(
            (c for c in cells if c.label == label and is_complete(c)), key=lambda c: c.seed
        )
        first: dict[str, Cell] = {}
        for c in mine:
            first.setdefault(c.setting, c)
        for c in first.values():
            rounds = load_results(c)["rounds"]
            per = np.median([r["seconds"] / max(r.get("replies", 1), 1) for r in rounds[1:]])
            status = c.dir / "cell.json"
            peak = json.loads(status.read_text()).get("peak_rss", 0) if status.exists() else 0
            out.setdefault(label, []).append((c.clients, float(per), peak / 1e9))
    return {label: sorted(pts) for label, pts in out.items()}


def cost_plot(preset: Preset, cells: list[Cell], path: Path) -> bool:
    """``[report] cost-plot``: the cost against the number of clients (cost_points), one
    line per row; False (nothing drawn) without a complete cell."""
    data = cost_points(preset, cells)
    if not data:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, pts in data.items():
        xs = [p[0] for p in pts]
        ax1.plot(xs, [p[1] for p in pts], marker="o", label=label)
        ax2.plot(xs, [p[2] for p in pts], marker="o", label=label)
    for ax, title in ((ax1, "seconds per client-round"), (ax2, "peak memory (GB, process tree)")):
        ax.set_xscale("log")
        ax.set_xlabel("simulated clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax1.legend()
    fig.suptitle(f"{preset.name} (python -m benchmarks run {preset.name})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _shown(value: Any) -> Any:
    """A path inside the repository relative to it (the report is committed); one
    outside it (a user's own data or runs) as given."""
    if isinstance(value, str) and os.path.isabs(value):
        if Path(value).resolve().is_relative_to(REPO):
            return os.path.relpath(value, REPO)
    return value


CSV_FIELDS = (
    "setting",
    "row",
    "method",
    "seed",
    "rounds",
    "clients",
    "final_accuracy_mean",
    "best_accuracy_mean",
    "best_accuracy_pooled",
    "mb_per_client_round",
    "seconds_per_round",
    "run_dir",
)


def csv_lines(setting: str, label: str, cells: list[Cell]) -> list[dict[str, Any]]:
    """One CSV line per complete run of a row (each seed on its own)."""
    out = []
    for cell in cells:
        res = load_results(cell) if is_complete(cell) else None
        if res is None:
            continue
        rounds = res["rounds"]
        traffic = [x.get("bytes_up", 0) + x.get("bytes_down", 0) for x in rounds]
        secs = [x["seconds"] for x in rounds]
        out.append(
            {
                "setting": setting,
                "row": label,
                "method": cell.config["method"],
                "seed": cell.seed,
                "rounds": cell.rounds,
                "clients": cell.clients,
                "final_accuracy_mean": res["final_accuracy_mean"],
                "best_accuracy_mean": res["best_accuracy_mean"],
                "best_accuracy_pooled": res.get("best_accuracy_pooled"),
                "mb_per_client_round": sum(traffic) / 1e6 / len(traffic) / cell.clients,
                "seconds_per_round": float(np.median(secs[1:] if len(secs) > 1 else secs)),
                "run_dir": _shown(str(cell.dir)),
            }
        )
    return out


def write(
    preset: Preset,
    cells: list[Cell],
    commands: list[str],
    out: Path | None = None,
    equal_budget: str | None = None,
) -> Path:
    """The preset's markdown report, CSV and plots (into ``out``, default the preset's
    ``[report] out`` or docs/results); returns the report's path."""
    out = out or REPO / preset.report.get("out", "docs/results")
    budget = preset.equal_budget if equal_budget is None else equal_budget
    lines = [f"# {preset.name}", "", preset.description, "", "Made with:", "", "```"]
    lines += [*commands, "```", ""]
    lines += [
        "Accuracy: mean over clients of each client's accuracy on its own test split, "
        "after the round (mean ± sample std over seeds, the 95% confidence interval of "
        "that mean (Student's t, clipped to 0-100 and marked * where clipped; below 3 "
        "seeds not meaningful; equal seeds said as such), and each seed's value in seed "
        "order); *pooled*: over all "
        "test samples. MB/client/round: serialized payloads, down and up. s/round: the "
        "median round after the first (the last round ends where the closing "
        "evaluation begins). Peak RSS: the run's process tree. Every run's "
        f"figures: [{preset.name}.csv]({preset.name}.csv). Generated by "
        "benchmarks/report.py: do not edit by hand.",
        "",
    ]
    if budget:
        lines += [
            f"Equal budget: every row trains with `{budget}`'s local schedule (epochs, batch "
            "size, optimizer, learning rate, momentum, weight decay) where the preset does "
            "not set a key itself.",
            "",
        ]
    table_rows: list[dict[str, Any]] = []
    for setting in preset.settings:
        mine = [c for c in cells if c.setting == setting]
        rows = {}
        for label, _, _ in preset.rows():
            rows[label] = summarise([c for c in mine if c.label == label])
            table_rows += csv_lines(setting, label, [c for c in mine if c.label == label])
        first = mine[0]
        keys = {**preset.config, **preset.settings[setting]}
        shown = ", ".join(f"{k}={_shown(v)}" for k, v in keys.items() if k not in RESERVED)
        lines += [f"## {setting}", ""]
        engines = ", ".join(dict.fromkeys(c.engine for c in mine))
        lines += [f"{engines}; {first.clients} clients, {first.rounds} rounds; {shown}", ""]
        lines += table(preset, setting, rows)
        lines += per_site_table(rows)
        lines += cpu_table(rows)
        lines += machine_table(rows)
        lines += phases_table(rows)
        image = out / f"{preset.name}-{setting}.png"
        plot(preset, setting, rows, image)
        lines += ["", f"![{setting}]({image.name})", ""]
    cost_image = out / f"{preset.name}-cost.png"
    if preset.report.get("cost-plot") and cost_plot(preset, cells, cost_image):
        lines += ["## Cost against the number of clients", "", f"![cost]({cost_image.name})", ""]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{preset.name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(table_rows)
    path = out / f"{preset.name}.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


REFERENCE_MATCH = ("dataset", "model", "hidden-dim", "sim-samples", "sim-dim", "sim-shared-neurons")
REFERENCE_MATCH += ("sim-shared-covariates", "sim-noise", "sim-client-streams")
# the committed figures (reference.json): method -> the label a summary and a plot show
REFERENCE_ROWS = {"fedfac-static": "FedFac (static)", "fedavg": "FedAvg", "local": "Local"}


def write_reference(preset: Preset, setting: str, runs: Path, command: str) -> int:
    """pflower/results/reference.json: FedAvg's, Local's and FedFac (static)'s final mean
    accuracy (mean, sample std and each seed) and each seed's accuracy per round, in one
    setting of a preset, from its complete runs under ``runs``. A run on the same data and
    budget shows them: its summary prints the committed figures beside its own, its plot
    the committed curves beside its own (pflower/results/reference.py). ``command``: what
    made it, recorded in the file."""
    cells = [
        c for c in preset.cells(runs=runs) if c.setting == setting and c.label in REFERENCE_ROWS
    ]
    rows, match, clients, rounds, commits = {}, {}, 0, 0, set()
    for label in REFERENCE_ROWS:
        done = [c for c in cells if c.label == label and is_complete(c)]
        if len(done) < 2:
            print(f"{label}: {len(done)} complete seeds in {setting}; run the preset first")
            return 1
        results = [load_results(c) for c in done]
        finals = [r["final_accuracy_mean"] for r in results]
        rows[label] = {
            "label": REFERENCE_ROWS[label],
            "mean": float(np.mean(finals)),
            "std": float(np.std(finals, ddof=1)),
            "seeds": {str(c.seed): f for c, f in zip(done, finals)},
            "curves": {
                str(c.seed): [r["accuracy_mean"] for r in scored_rounds(res["rounds"])]
                for c, res in zip(done, results)
            },
        }
        commits.update(r.get("provenance", {}).get("git_commit", "?") for r in results)
        stored = results[0]["config"]
        match = {k: stored[k] for k in REFERENCE_MATCH if k in stored}
        clients, rounds = done[0].clients, done[0].rounds
    entry = {"preset": preset.name, "setting": setting, "clients": clients, "rounds": rounds}
    entry.update(match=match, rows=rows)
    made = {
        "command": command,
        "runs_commit": sorted(commits),  # what ran the cells
        "written_at": git_commit(REPO),
        "date": time.strftime("%Y-%m-%d"),
    }
    REFERENCE_FILE.write_text(json.dumps({"made": made, "settings": [entry]}, indent=1) + "\n")
    print(f"wrote {REFERENCE_FILE}")
    return 0


# ----------------------------------------------------------------------------- ablations


def ablation_rows(preset: Preset, runs: Path) -> dict[str, dict[str, Any]]:
    """label -> {method, seeds, final (per seed, %), up, down (MB a client-round), extras}."""
    out: dict[str, dict[str, Any]] = {}
    for cell in preset.cells(runs=runs):
        if not is_complete(cell):
            continue
        res = load_results(cell) or {}
        row = out.setdefault(
            cell.label,
            {
                "method": cell.config["method"],
                "authors": cell.config.get("profile") == "authors",
                **{k: [] for k in ("seeds", "final", "up", "down")},
            },
        )
        n = len(res["rounds"]) * cell.clients
        row["seeds"].append(cell.seed)
        row["final"].append(100 * res["final_accuracy_mean"])
        row["up"].append(sum(r.get("bytes_up", 0) for r in res["rounds"]) / n / 1e6)
        row["down"].append(sum(r.get("bytes_down", 0) for r in res["rounds"]) / n / 1e6)
        for spec in preset.report.get("extras", []):
            value = extra_value(res, spec)
            if value is not None:  # a byte count: as MB a client and round, as the others
                value = value / n / 1e6 if "bytes" in spec else value
                row.setdefault(spec, []).append(value)
    return out


def _paired(row: dict[str, Any], base: dict[str, Any]) -> list[float]:
    """The row's final accuracy minus its default's, seed by seed (common seeds)."""
    mine = dict(zip(row["seeds"], row["final"], strict=True))
    theirs = dict(zip(base["seeds"], base["final"], strict=True))
    return [mine[s] - theirs[s] for s in sorted(mine) if s in theirs]


def _mean_sd(values: list[float], digits: int = 1) -> str:
    if not values:
        return ""
    sd = f" ± {np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else ""
    return f"{np.mean(values):.{digits}f}{sd}"


def ablation_table(preset: Preset, data: dict[str, dict[str, Any]]) -> list[str]:
    extras = [e for e in preset.report.get("extras", []) if not e.startswith("total_bytes")]
    head = ["row", "seeds", "final acc (%)", "each seed", "Δ vs default (paired)"]
    head += ["MB up / client-round", "MB down / client-round"]
    head += [f"{e} (MB / client-round)" if "bytes" in e else e for e in extras]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, row in data.items():
        base = data.get(row["method"]) if label != row["method"] else None
        diff = _paired(row, base) if base else []
        cells = [f"`{label}`", str(len(row["seeds"])), _mean_sd(row["final"])]
        cells.append(" / ".join(f"{v:.1f}" for v in row["final"]))
        cells.append(("+" if np.mean(diff) >= 0 else "") + _mean_sd(diff) if diff else "")
        cells += [f"{np.mean(row['up']):.4g}", f"{np.mean(row['down']):.4g}"]
        cells += [f"{np.mean(row[e]):.4g}" if row.get(e) else "" for e in extras]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ablation_plot(preset: Preset, data: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(data)
    fig, (acc, up) = plt.subplots(
        1, 2, figsize=(11, 0.42 * len(labels) + 1.5), sharey=True, width_ratios=(3, 2)
    )
    y = np.arange(len(labels))[::-1]
    means = [np.mean(data[k]["final"]) for k in labels]
    sds = [np.std(data[k]["final"], ddof=1) if len(data[k]["final"]) > 1 else 0 for k in labels]
    colours = ["tab:blue" if data[k]["method"] == k else "tab:gray" for k in labels]
    colours = [
        "tab:orange" if data[k]["authors"] else c for k, c in zip(labels, colours, strict=True)
    ]
    acc.barh(y, means, xerr=sds, color=colours, alpha=0.8)
    for yi, k in zip(y, labels, strict=True):
        acc.plot(data[k]["final"], [yi] * len(data[k]["final"]), "k.", ms=4)
    acc.set_yticks(y, labels, fontsize=8)
    acc.set_xlabel("final mean client accuracy (%): mean ± std over seeds, dots: seeds")
    up.barh(y, [np.mean(data[k]["up"]) for k in labels], color=colours, alpha=0.8)
    up.set_xscale("log")
    up.set_xlabel("MB up a client and round (log)")
    fig.suptitle(f"{preset.name}: blue our default, orange the authors' profile", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_ablation(preset: Preset, runs: Path, out: Path) -> int:
    """An ablation's table and plot (out/<preset>-ablation.md and .png) from a preset's
    runs: each row against its method's default row (the row named as the method alone),
    seed by seed on the same seeds, data and budget; MB up and down a client and round,
    and the preset's ``[report] extras``."""
    data = ablation_rows(preset, runs)
    if not data:
        print(f"no complete runs of {preset.name}: python -m benchmarks run {preset.name}")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{preset.name}-ablation.png"
    ablation_plot(preset, data, png)
    text = [
        f"# {preset.name}: the ablation",
        "",
        preset.description,
        "",
        f"Made with `python -m benchmarks run {preset.name}` then "
        f"`python -m benchmarks ablation {preset.name}` (generated: do not edit by hand). "
        "Final mean client accuracy after the last round; Δ: the row minus its method's "
        "default row (the method alone), seed by seed, mean ± std of those differences; "
        "MB: serialized fit payloads a client and round.",
        "",
        *ablation_table(preset, data),
        "",
        f"![ablation]({png.name})",
        "",
    ]
    (out / f"{preset.name}-ablation.md").write_text("\n".join(text))
    print(f"ablation: {out / f'{preset.name}-ablation.md'}")
    return 0
