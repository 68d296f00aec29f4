"""``python -m benchmarks list | run PRESET [...] | scale [...] | reference PRESET SETTING | ablation PRESET``: run a preset's missing cells,
then write its report (docs/results/<preset>.md, .csv and plots by default; with
``--out DIR`` the runs go to DIR/runs and the report to DIR). docs/PRESETS.md."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from benchmarks import presets


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cell"]:  # one cell, in its own process (the runner starts it)
        from benchmarks.runner import run_cell_here

        run_cell_here(argv[1])
        return 0
    if argv[:1] == ["scale"]:  # the scale-1m preset, then its memory model (benchmarks/scale.py)
        from benchmarks.scale import main as scale

        return scale(argv[1:], run=main)
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the presets and what each runs")
    ref = sub.add_parser(
        "reference",
        help="write pflower/results/reference.json (the committed FedAvg, Local and FedFac "
        "figures a run's summary and plot show) from a preset setting's complete runs",
    )
    ref.add_argument("preset")
    ref.add_argument("setting")
    ref.add_argument("--runs", type=Path, default=presets.RUNS, help="where the cells ran")
    abl = sub.add_parser(
        "ablation",
        help="write docs/results/<preset>-ablation.md and .png: each row against its "
        "method's default row, paired by seed (run the preset first)",
    )
    abl.add_argument("preset")
    abl.add_argument("--runs", type=Path, default=presets.RUNS, help="where the cells ran")
    abl.add_argument("--out", type=Path, default=presets.REPO / "docs" / "results")
    run = sub.add_parser("run", help="run a preset's missing cells, then report")
    run.add_argument("preset", help="a name under benchmarks/presets, or a .toml path")
    run.add_argument("--seeds", nargs="+", type=int, help="default: the preset's")
    run.add_argument("--rounds", type=int, help="default: the preset's (a shorter trial)")
    run.add_argument("--rows", nargs="+", help="only these row labels")
    run.add_argument("--settings", nargs="+", help="only these settings (table columns)")
    run.add_argument("--rerun", action="store_true", help="rerun complete cells too")
    run.add_argument("--report-only", action="store_true", help="only rewrite the report")
    run.add_argument("--cell-timeout", type=float, help="seconds per cell")
    run.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="this call's budget: each cell stops cleanly after the round that passes it "
        "(resumable: the same command goes on from there); no cell starts after it",
    )
    run.add_argument(
        "--estimate",
        action="store_true",
        help="print the estimated device time of the cells left (measured img/s) and stop; "
        "a GPU preset prints it before it starts",
    )
    run.add_argument("--runs", type=Path, help="where the cells run (default: OUT/runs)")
    run.add_argument(
        "--out",
        type=Path,
        help="where the runs (OUT/runs) and the report go (default: outputs/benchmarks and "
        "the preset's [report] out, docs/results)",
    )
    run.add_argument(
        "--equal-budget",
        metavar="METHOD",
        help="every row trains with METHOD's local schedule (default: the preset's "
        "equal-budget, else each method's own auto schedule)",
    )
    args = parser.parse_args(argv)
    if args.command == "list":
        for name in presets.names():
            p = presets.load(name)
            rows = ", ".join(label for label, _, _ in p.rows())
            print(f"{name}{' [GPU]' if p.gpu else ''}: {p.description}\n    rows: {rows}")
        return 0
    from benchmarks import report, runner

    if args.command == "reference":
        made = "python -m benchmarks " + shlex.join(argv)
        runs = args.runs.expanduser().resolve()
        return report.write_reference(presets.load(args.preset), args.setting, runs, made)
    if args.command == "ablation":
        runs = args.runs.expanduser().resolve()
        return report.write_ablation(presets.load(args.preset), runs, args.out)

    try:
        preset = presets.load(args.preset)
        if args.equal_budget is not None:
            presets.check_budget_method(args.equal_budget, "--equal-budget")
    except SystemExit as err:  # a preset that cannot run: one line, the config-error status
        print(f"preset error: {err.code}", file=sys.stderr)
        return 2
    out = args.out.expanduser().resolve() if args.out else None
    args.runs = args.runs or (out / "runs" if out else presets.RUNS)
    try:  # a placeholder that cannot resolve (a missing weight file): one line, exit 2
        cells = preset.cells(args.seeds, args.rounds, args.runs, args.equal_budget)
    except SystemExit as err:
        print(f"preset error: {preset.name}: {err.code}", file=sys.stderr)
        return 2
    # every cell's keys, then each distinct data's pre-flight, before any runs
    problems = preset.problems(cells) or (
        [] if args.report_only else presets.data_problems(preset.name, cells)
    )
    if problems:
        print("\n".join(f"preset error: {p}" for p in problems), file=sys.stderr)
        return 2
    manifest_path = args.runs / preset.name / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("rounds") != args.rounds:  # another round count: another experiment
        manifest = {}
    # the command that makes the report: what to run, not how often it was retried
    command = "python -m benchmarks " + shlex.join(a for a in argv if a != "--rerun")
    if not args.report_only:
        manifest["commands"] = list(dict.fromkeys([*manifest.get("commands", []), command]))
    seeds = sorted({*(args.seeds or preset.seeds), *manifest.get("seeds", [])})
    manifest.update(seeds=seeds, rounds=args.rounds)
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    todo = preset.cells(args.seeds, args.rounds, args.runs, args.equal_budget)
    if args.rows:
        todo = [c for c in todo if c.label in args.rows]
    if args.settings:
        unknown = set(args.settings) - set(preset.settings)
        if unknown:
            parser.error(
                f"unknown settings {sorted(unknown)}; {preset.name} has {list(preset.settings)}"
            )
        todo = [c for c in todo if c.setting in args.settings]
    if args.estimate or (preset.gpu and not args.report_only):
        left = [c for c in todo if args.rerun or not runner.is_complete(c)]
        print(runner.estimate_report(left, args.max_minutes), flush=True)
        if args.estimate:
            return 0
    failed = []
    if not args.report_only:
        failed = runner.run_preset(preset, todo, args.cell_timeout, args.rerun, args.max_minutes)
    cells = preset.cells(seeds, args.rounds, args.runs, args.equal_budget)
    path = report.write(preset, cells, manifest.get("commands", []), out, args.equal_budget)
    print(f"report: {path}" + (f"; {len(failed)} failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
