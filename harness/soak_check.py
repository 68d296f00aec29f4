"""The soak's invariants, checked at its end from what the deployment wrote, its
report and its timeline plot (harness/soak.py).

Each invariant reads records that another part of the system kept, so that one part
checks another: the sites' ledgers (what each site sent, and the SHA-256 chain of its
personal state), the ServerApp's reply log (every reply as it entered an aggregate,
and each aggregate's digest), the runs' results and checkpoints, the supervisor's
events, the fault log and the harness's samples of each site's processes.
"""

from __future__ import annotations

import calendar
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy.site_guard import LEDGER_FILE
from harness.soak_faults import SITE_KINDS, Fault

FEDPER, SECAGG = "soak-fedper", "soak-secagg"
MAX_SITE_PROCS = 6  # a site: its SuperNode, its SuperExec, a worker (and one forking)
RSS_GROWTH = 1.2  # a site's memory at the end, at most this times its first window's


@dataclass
class Records:
    """What the invariants read, kept in ``records.json`` beside the report so that a
    soak kept with ``--keep`` can be checked again (``python -m harness.soak_check``)."""

    t0: float
    seconds: float
    seed: int
    minutes: float
    out: str
    runs_dir: str
    sites: list[str]
    state_dirs: dict[str, str]
    site_logs: dict[str, str]
    exits: dict[str, list[int | None]]
    workload: dict[str, Any]
    samples: list[dict[str, Any]]
    rounds_seen: list[dict[str, Any]]
    segments: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    errors: list[str]

    @classmethod
    def of(cls, soak: Any, plan: list[Fault]) -> Records:
        fed = soak.fed
        return cls(
            t0=soak.t0,
            seconds=soak.now(),
            seed=soak.args.seed,
            minutes=soak.args.minutes,
            out=str(soak.out),
            runs_dir=str(soak.runs_dir),
            sites=list(fed.nodes),
            state_dirs={s: str(fed.state_dir(s)) for s in fed.nodes},
            site_logs={s: str(fed.nodes[s].log) for s in fed.nodes},
            exits={s: [p.popen.poll() for p in fed.procs if p.name == s] for s in fed.nodes},
            workload=soak.run_config(FEDPER, 1, False),
            samples=soak.samples,
            rounds_seen=soak.rounds_seen,
            segments=soak.segments,
            faults=[fault_entry(f) for f in plan],
            errors=soak.errors,
        )

    @classmethod
    def load(cls, path: Path) -> Records:
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1, default=str))

    @property
    def plan(self) -> list[Fault]:
        return [
            Fault(
                f["at"],
                f["kind"],
                f["target"],
                f["seconds"],
                {k: v for k, v in f.items() if k not in ("at", "kind", "target", "seconds")},
            )
            for f in self.faults
        ]


def fault_entry(fault: Fault) -> dict[str, Any]:
    return {
        "at": fault.at,
        "kind": fault.kind,
        "target": fault.target,
        "seconds": fault.seconds,
        **fault.log,
    }


class Check:
    """One invariant: whether it holds, and a line saying what was found."""

    def __init__(self, name: str) -> None:
        self.name, self.problems, self.facts = name, [], []

    def fail(self, problem: str) -> None:
        self.problems.append(problem)

    @property
    def holds(self) -> bool:
        return not self.problems

    def line(self) -> str:
        text = "; ".join(self.facts)
        if self.problems:
            more = f" (+{len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
            text = "; ".join(self.problems[:3]) + more + (f" | {text}" if text else "")
        return text


def _epoch(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def _events(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for segment in segments:
        path = Path(segment.get("events", ""))
        if path.is_file():
            for line in path.read_text().splitlines():
                out.append({**json.loads(line), "segment": segment["name"], "file": str(path)})
    return out


def _results(runs_dir: Path, name: str) -> dict[str, Any]:
    path = runs_dir / name / "results.json"
    return json.loads(path.read_text()) if path.exists() else {"rounds": []}


def upload_spec(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """The FedPer upload spec (names and shapes) of the soak's workload."""
    from methods import get_method, parse_run_config
    from pflower.data import data_info

    cfg = parse_run_config(config)
    method = get_method(cfg.method)
    model = method.build_model(cfg, data_info(cfg))
    return [
        (s.name, tuple(s.shape))
        for s in method.build_wire(model, method.roles(model, cfg), cfg).up_spec()
    ]


# ---- the invariants --------------------------------------------------------------------------


def check_rounds(rec: Records, events: list[dict[str, Any]], log: list[dict]) -> Check:
    check = Check("every round completed, or recorded as failed with its reason")
    verdicts = []
    for segment in rec.segments:
        ends = [
            e for e in events if e["event"] == "ended" and e.get("file") == segment.get("events")
        ]
        last = ends[-1] if ends else {}
        if segment.get("exit") == 0:
            continue
        if last.get("checkpoint", 0) >= segment["rounds"] and last.get("details"):
            # it ran to its last round by itself; its ServerApp judged it failed (a round
            # with no reply), and said why: a verdict, recorded, not a lost round
            verdicts.append(
                f"{segment['name']} to round {segment['rounds']}: {last['details'][:120]}"
            )
        else:
            check.fail(
                f"run {segment['name']} (to round {segment['rounds']}) did not finish by itself"
            )
    finals = {FEDPER: 0, SECAGG: 0}
    for segment in rec.segments:
        finals[segment["name"]] = segment["rounds"]
    for name, total in finals.items():
        if not total:
            continue
        rounds = _results(Path(rec.runs_dir), name)["rounds"]
        numbers = [int(r["round"]) for r in rounds]
        if numbers != list(range(1, total + 1)):
            missing = sorted(set(range(1, total + 1)) - set(numbers))
            check.fail(f"{name}: rounds {missing[:5]} missing from its results")
        aggregated = {e["done"] for e in log if e["kind"] == "aggregate" and e["replies"]}
        failed = carried = 0
        for r in rounds:
            if r.get("replies") or r.get("failed"):
                failed += not r.get("replies")
            elif r.get("scored_after_resume") and name == FEDPER and r["round"] in aggregated:
                # aggregated by a run that died before scoring it: its results lost the
                # count, its replies are in the reply log
                carried += 1
            else:
                check.fail(f"{name} round {r['round']}: no reply and no failure named")
        check.facts.append(
            f"{name}: {len(rounds)} rounds, {failed} with no reply (each failure named)"
            + (f", {carried} aggregated just before a crash (in the reply log)" if carried else "")
        )
    lost = [e for e in events if e["event"] == "ended" and e["status"] != "finished:completed"]
    for e in lost:
        if not e.get("details"):
            check.fail(f"run {e['run']} ended {e['status']} with no reason")
    check.facts.append(
        f"{len(lost)} runs ended failed (a crash, or a verdict), each with Flower's reason"
        if lost
        else "no run interrupted"
    )
    check.facts += [f"judged failed after its last round: {v}" for v in verdicts]
    return check


def _chain_faults(plan: list[Fault], site: str, kind: str) -> list[Fault]:
    return [f for f in plan if f.target == site and f.kind == kind and "start" in f.log]


def check_state_chain(plan: list[Fault], ledgers: dict[str, list]) -> Check:
    """Every fit restored the state its site saved last (the SHA-256 chain); or a later
    generation (saves whose replies never left: a kill, or a full disk that let the
    state be rewritten but not the ledger grow), or, only after a ``corrupt-state`` fault
    of that site, the state before its newest. Never the initial state again, never an
    older one; each saved state names the one it was trained from."""
    check = Check("no site's personal state lost or rolled back beyond what it missed")
    counts: Counter[str] = Counter()
    for site, lines in ledgers.items():
        corrupt_faults = len(_chain_faults(plan, site, "corrupt-state"))
        by_run: dict[str, list] = defaultdict(list)
        for e in lines:
            if e["type"] == "train" and e.get("state"):
                by_run[e.get("run_name", "")].append(e)
        rollbacks = 0
        for run_name, entries in by_run.items():
            last, last_gen = None, 0
            for e in entries:
                restored = next((s for s in e["state"] if "restored" in s), None)
                corrupt = any("corrupt" in s for s in e["state"])
                where = f"{site} {run_name} run {e.get('run')} round {e['round']}"
                gen = int(restored.get("generation", 0)) if restored else 0
                if restored is None:
                    if last is not None:
                        check.fail(f"{where}: started afresh after saving {last[:12]}")
                elif restored["restored"] == last:
                    counts["the last saved"] += 1
                elif last is None:
                    counts["first"] += 1
                elif gen > last_gen:
                    counts["later (replies not sent)"] += 1
                elif restored.get("from") == "previous" and corrupt and gen == last_gen - 1:
                    rollbacks += 1
                    counts["the one before (corrupt newest)"] += 1
                else:
                    check.fail(
                        f"{where}: restored {restored['restored'][:12]} (generation {gen}), "
                        f"its last save was {last[:12]} (generation {last_gen})"
                    )
                for saved in (s for s in e["state"] if "saved" in s):
                    parent = restored["restored"] if restored else None
                    if saved.get("parent") != parent or saved.get("generation") != gen + 1:
                        check.fail(
                            f"{where}: saved a state that is not the child of what it restored"
                        )
                    last, last_gen = saved["saved"], int(saved["generation"])
        if rollbacks > corrupt_faults:
            check.fail(
                f"{site}: {rollbacks} fallbacks to the state before, {corrupt_faults} corrupt-state faults"
            )
    check.facts.append(
        "fits restored " + (", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "nothing")
    )
    return check


def _authoritative(log: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The aggregate each run-wide round ended with (the last one written: a round
    aggregated by a run that then died before its checkpoint is done again by the
    next), and those it replaced."""
    last: dict[int, dict] = {}
    replaced = []
    for e in log:
        if e["kind"] == "aggregate":
            if e["done"] in last:
                replaced.append(last[e["done"]])
            last[e["done"]] = e
    return [last[d] for d in sorted(last)], replaced


def check_replies(ledgers: dict[str, list], log: list[dict]) -> Check:
    check = Check("no reply counted twice; none from before a restart counted after it")
    aggregates, replaced = _authoritative(log)
    keys = {(a["run"], a["round"]) for a in aggregates}
    counted = [e for e in log if e["kind"] == "reply" and (e["run"], e["round"]) in keys]
    sent = {}
    for site, lines in ledgers.items():
        for e in lines:
            if e["type"] == "train" and e.get("sha256"):
                sent.setdefault(e["sha256"], []).append((site, e.get("run"), e["round"]))
    seen = Counter(e["sha256"] for e in counted)
    for sha, n in seen.items():
        if n > 1:
            check.fail(f"reply {sha[:12]} counted {n} times")
    for e in counted:
        origin = sent.get(e["sha256"], [])
        if not origin:
            check.fail(
                f"run {e['run']} round {e['round']}: a reply no site's ledger lists ({e['sha256'][:12]})"
            )
        elif (e["client_key"], e["run"], str(e["round"])) not in origin:
            site, run, rnd = origin[0]
            check.fail(
                f"run {e['run']} round {e['round']} counted {site}'s reply to run {run} round {rnd}"
            )
    matched = ", each once and matched to its site's ledger line" if check.holds else ""
    check.facts.append(
        f"{len(counted)} replies in {len(aggregates)} aggregates{matched}; {len(replaced)} "
        "aggregates of crashed runs done again"
    )
    return check


def check_replay(rec: Records, log: list[dict], names: list[str]) -> Check:
    from strategies.checkpoint import load_server_state
    from strategies.reply_log import arrays_digest, replay

    check = Check("the final global state equals a replay of the accepted replies' log")
    run_dir = Path(rec.runs_dir) / FEDPER
    aggregates, _ = _authoritative(log)
    final = None
    for agg in aggregates:
        replies = [
            e
            for e in log
            if e["kind"] == "reply" and e["run"] == agg["run"] and e["round"] == agg["round"]
        ]
        if not replies:
            check.fail(f"round {agg['done']}: an aggregate with no logged reply")
            continue
        final = replay(run_dir, replies)
        if arrays_digest(final) != agg["sha256"]:
            check.fail(
                f"round {agg['done']} (run {agg['run']}): the replay differs from the aggregate"
            )
    path = run_dir / "server-state.npz"
    if final is None or not path.exists():
        check.fail("no aggregate, or no final checkpoint")
        return check
    done, arrays = load_server_state(path, "fedper")
    if aggregates and done != aggregates[-1]["done"]:
        check.fail(
            f"the checkpoint is of round {done}, the log's last aggregate of {aggregates[-1]['done']}"
        )
    kept = [arrays.get(f"global/{n}") for n in names]
    if any(k is None for k in kept) or any(
        k.dtype != f.dtype or not np.array_equal(k, f) for k, f in zip(kept, final)
    ):
        check.fail("the final checkpoint's global tensors differ from the replay of its round")
    if check.holds:
        check.facts.append(
            f"{len(aggregates)} rounds replayed bit for bit; the checkpoint of round {done} "
            "equals the last"
        )
    return check


def read_whole_lines(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """A JSON-lines file's entries, and the numbers of the lines that are not whole."""
    entries, broken = [], []
    text = path.read_text() if path.exists() else ""
    for i, line in enumerate(text.splitlines()):
        try:
            entries.append(json.loads(line))
        except ValueError:
            broken.append(i)
    return entries, broken


def check_uploads(
    ledgers: dict[str, list], spec: list[tuple[str, tuple[int, ...]]], torn: list[str] = ()
) -> Check:
    check = Check("no site sent a tensor outside its method's upload spec")
    for problem in torn:  # a ledger that lost part of a line cannot vouch for it
        check.fail(problem)
    shapes = [list(shape) for _, shape in spec]
    plain = masked = 0
    for site, lines in ledgers.items():
        for e in lines:
            masked += "secaggplus_configs.masked_params" in e["metrics"]
            if not e.get("arrays"):
                continue
            where = f"{site} {e.get('run_name')} round {e['round']} ({e['type']})"
            if e["type"] != "train":
                check.fail(f"{where}: tensors in a {e['type']} reply")
            elif e.get("run_name") == SECAGG:  # its uploads travel masked, not as tensors
                check.fail(f"{where}: tensors in the clear in a SecAgg+ run")
            elif [a["shape"] for a in e["arrays"]] != shapes or any(
                a.get("tensor", n) != n for a, (n, _) in zip(e["arrays"], spec)
            ):
                check.fail(f"{where}: {[a.get('tensor') for a in e['arrays']]} is not the spec")
            else:
                plain += 1
    check.facts.append(
        f"{plain} FedPer uploads of exactly the {len(spec)} shared tensors, {masked} SecAgg+ "
        "uploads masked (no tensor in the clear); no tensor in any other reply"
    )
    return check


def check_resources(rec: Records) -> Check:
    check = Check("each site's process count and memory bounded (RSS at the end <= 1.2x)")
    samples = rec.samples
    if not samples:
        check.fail("no samples")
        return check
    duration = samples[-1]["t"]
    window = min(300.0, 0.4 * duration)
    facts = []
    for site in rec.sites:
        first = [s[site]["rss_mb"] for s in samples if s["t"] <= window and s[site]["procs"]]
        last = [s[site]["rss_mb"] for s in samples[-6:] if s[site]["procs"]]
        most = max(s[site]["procs"] for s in samples)
        if most > MAX_SITE_PROCS:
            check.fail(f"{site}: {most} processes at once (bound {MAX_SITE_PROCS})")
        if not first or not last:
            check.fail(f"{site}: no sample in the first window or at the end")
            continue
        ratio = statistics.median(last) / max(first)
        if ratio > RSS_GROWTH:
            check.fail(
                f"{site}: RSS at the end {statistics.median(last):.0f} MB, {ratio:.2f}x its first window's"
            )
        facts.append(f"{site} {ratio:.2f}x, {most} procs")
    check.facts.append(f"first window {window:.0f} s: " + ", ".join(facts))
    return check


def check_restarts(rec: Records, plan: list[Fault]) -> Check:
    check = Check("every site restarted after SIGKILL was taken back (no exit 305)")
    at_once = 0
    for fault in plan:
        if fault.kind != "site-kill" or "restarted" not in fault.log:
            continue
        log = Path(rec.site_logs[fault.target]).read_text(errors="replace")
        text = log[fault.log.get("log_offset", 0) :]
        at_once += fault.seconds == 0
        if "Exit Code: 305" in text or "Failed to activate SuperNode" in text:
            check.fail(f"{fault.target} restarted at {fault.log['restarted']:.0f} s exited 305")
        elif "SuperNode ID" not in text:
            check.fail(
                f"{fault.target} restarted at {fault.log['restarted']:.0f} s never came back"
            )
    for site, codes in rec.exits.items():
        for code in codes:
            if code not in (None, -9):  # alive at the end, or killed by a fault
                check.fail(f"a SuperNode of {site} exited {code}")
    check.facts.append(f"{at_once} restarted at once, all taken back")
    return check


def check_faults(rec: Records, plan: list[Fault]) -> Check:
    check = Check("every planned fault was injected")
    for error in rec.errors:
        check.fail(error)
    for fault in plan:
        if "start" not in fault.log:
            check.fail(f"{fault.kind} at {fault.at:.0f} s never ran")
        elif "error" in fault.log:
            check.fail(f"{fault.kind} on {fault.target}: {fault.log['error']}")
        elif fault.log.get("killed") == 0 or fault.log.get("corrupted") is False:
            check.fail(f"{fault.kind} at {fault.log['start']:.0f} s found nothing to hit")
    check.facts.append(
        f"{sum('start' in f.log for f in plan)} of {len(plan)}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(Counter(f.kind for f in plan).items()))
    )
    return check


# ---- recovery times ---------------------------------------------------------------------------


def recoveries(rec: Records, plan: list[Fault], ledgers: dict[str, list], log: list[dict]) -> None:
    """Each fault's recovery: from its end (healed, restarted, killed) to the target
    site's next reply that left (site faults) or the next completed round (the
    server's), in seconds; in ``fault.log["recovery"]``."""
    rounds = sorted(
        [e["time"] - rec.t0 for e in log if e["kind"] == "aggregate"]
        + [r["t"] for r in rec.rounds_seen]
    )
    replies = {
        site: sorted(
            _epoch(e["time"]) - rec.t0
            for e in lines
            if e["type"] == "train" and e.get("sha256") and not e["error"]
        )
        for site, lines in ledgers.items()
    }
    for fault in plan:
        if "end" not in fault.log:
            continue
        end = fault.log["end"]
        times = replies[fault.target] if fault.kind in SITE_KINDS else rounds
        after = [t for t in times if t >= end - 1]  # the ledger's clock has whole seconds
        if after:
            fault.log["recovered"] = after[0]
            fault.log["recovery"] = max(0.0, after[0] - end)


# ---- the report ------------------------------------------------------------------------------


def plot(rec: Records, plan: list[Fault], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(sorted({f.kind for f in plan}), plt.get_cmap("tab10").colors))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7), sharex=True)
    for name, marker in ((FEDPER, "."), (SECAGG, "x")):
        seen = [r for r in rec.rounds_seen if r["name"] == name]
        if seen:
            top.plot(
                [r["t"] / 60 for r in seen], [r["round"] for r in seen], marker, ms=3, label=name
            )
            accs = [r for r in seen if r["acc"] is not None]
            bottom.plot(
                [r["t"] / 60 for r in accs],
                [100 * r["acc"] for r in accs],
                marker,
                ms=3,
                label=name,
            )
    height = max((r["round"] for r in rec.rounds_seen), default=1)
    for i, fault in enumerate(f for f in plan if "start" in f.log):
        start, end = fault.log["start"] / 60, fault.log["end"] / 60
        for ax in (top, bottom):
            ax.axvspan(start, max(end, start + 0.05), color=colors[fault.kind], alpha=0.25, lw=0)
        if "recovery" in fault.log:  # from the fault's end to its recovery, and how long
            y = height * (0.15 + 0.1 * (i % 6))
            top.plot([end, fault.log["recovered"] / 60], [y, y], color=colors[fault.kind], lw=2)
            top.annotate(
                f"{fault.log['recovery']:.0f}s", (fault.log["recovered"] / 60, y), fontsize=6
            )
    from matplotlib.patches import Patch

    handles = top.get_legend_handles_labels()[0]
    handles += [Patch(color=c, alpha=0.4, label=k) for k, c in colors.items()]
    top.set_ylabel("round (of its experiment)")
    bottom.set_ylabel("mean client accuracy (%)")
    bottom.set_xlabel("wall time (min)")
    top.legend(handles=handles, fontsize=7, ncol=4, loc="upper left")
    top.set_title(
        "soak: rounds and accuracy over wall time; each fault shaded, a bar from its end "
        "to its recovery (s)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def report(soak: Any, plan: list[Fault], argv: list[str]) -> bool:
    """Keep the soak's records beside its report, then check them (``evaluate``)."""
    rec = Records.of(soak, plan)
    rec.save(Path(rec.out) / "records.json")
    return evaluate(rec, argv)


def evaluate(rec: Records, argv: list[str]) -> bool:
    """Check every invariant, print the table, write the report and the plot; whether
    every invariant holds."""
    from strategies.reply_log import read_log

    plan = rec.plan
    out = Path(rec.out)
    ledgers, torn = {}, []
    for site in rec.sites:
        ledgers[site], broken = read_whole_lines(Path(rec.state_dirs[site]) / LEDGER_FILE)
        torn += [f"{site}'s ledger line {i + 1} is not whole" for i in broken]
    log = read_log(Path(rec.runs_dir) / FEDPER)
    events = _events(rec.segments)
    spec = upload_spec(rec.workload)
    checks = guarded(
        [
            lambda: check_rounds(rec, events, log),
            lambda: check_state_chain(plan, ledgers),
            lambda: check_replies(ledgers, log),
            lambda: check_replay(rec, log, [n for n, _ in spec]),
            lambda: check_uploads(ledgers, spec, torn),
            lambda: check_resources(rec),
            lambda: check_restarts(rec, plan),
            lambda: check_faults(rec, plan),
        ]
    )
    recoveries(rec, plan, ledgers, log)
    ok = all(c.holds for c in checks)
    table = _table(
        ["invariant", "holds", "what was found"],
        [[c.name, "yes" if c.holds else "**NO**", c.line()] for c in checks],
    )
    print(table, flush=True)
    name = f"soak-{rec.seed}-{rec.minutes:g}min"
    plot(rec, plan, out / f"{name}.png")
    times = [f.log["recovery"] for f in plan if "recovery" in f.log]
    by_kind = defaultdict(list)
    for f in plan:
        if "recovery" in f.log:
            by_kind[f.kind].append(f.log["recovery"])
    summary = {
        "command": " ".join(argv),
        "ok": ok,
        "seconds": rec.seconds,
        "cores": os.cpu_count(),
        "invariants": [{"name": c.name, "holds": c.holds, "found": c.line()} for c in checks],
        "faults": [fault_entry(f) for f in plan],
        "recovery_s": {
            "median": statistics.median(times) if times else None,
            "worst": max(times, default=None),
        },
        "segments": rec.segments,
    }
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1, default=str))
    fault_rows = [
        [f"{f.log.get('start', f.at):.0f}", f.kind, f.target, f"{f.seconds:g}",
         f"{f.log['end']:.0f}" if "end" in f.log else "-",
         f"{f.log['recovery']:.1f}" if "recovery" in f.log else "-"]
        for f in plan
    ]  # fmt: skip
    kind_rows = [
        [k, len(v), f"{statistics.median(v):.1f}", f"{max(v):.1f}"]
        for k, v in sorted(by_kind.items())
    ]
    run_rows = [
        [s["name"], s["rounds"], f"{s['started']:.0f}", f"{s.get('ended', 0):.0f}", s.get("exit"),
         sum(1 for e in events if e.get("file") == s.get("events") and e["event"] == "resuming")]
        for s in rec.segments
    ]  # fmt: skip
    median, worst = summary["recovery_s"]["median"], summary["recovery_s"]["worst"]
    text = f"""# {name}

`{summary["command"]}`: {"every invariant holds" if ok else "AN INVARIANT IS BROKEN"} (exit {0 if ok else 1}).
{rec.seconds / 60:.1f} minutes of faults and training on {os.cpu_count()} cores; {len(plan)} faults;
recovery median {median or 0:.1f} s, worst {worst or 0:.1f} s.
Made by `python -m harness.soak` (harness/soak.py; the invariants: harness/soak_check.py).

![timeline]({name}.png)

## Invariants

{table}

## Recovery by fault kind (s: from the fault's end to the target site's next reply, or the next round)

{_table(["kind", "faults", "median", "worst"], kind_rows)}

## Faults (s after training started)

{_table(["start", "kind", "target", "seconds (wait, stall, outage)", "end", "recovery"], fault_rows)}

## Runs (each submitted and kept going by deploy.supervise)

{_table(["run-name", "to round", "started", "ended", "exit", "resumed"], run_rows)}
"""
    (out / f"{name}.md").write_text(text)
    print(f"soak: report {out / (name + '.md')}", flush=True)
    return ok


def guarded(makers: list[Callable[[], Check]]) -> list[Check]:
    """Each check; one that raises fails, naming the error (the others still run)."""
    out = []
    for make in makers:
        try:
            out.append(make())
        except Exception as err:  # noqa: BLE001 - a broken record breaks its invariant
            check = Check(getattr(make, "__name__", "a check"))
            check.fail(f"could not be checked: {type(err).__name__}: {err}")
            out.append(check)
    return out


def main(argv: list[str]) -> None:
    """``python -m harness.soak_check <out>/records.json``: check a kept soak again."""
    if len(argv) != 1:
        raise SystemExit("usage: python -m harness.soak_check <soak out>/records.json")
    sys.exit(
        0 if evaluate(Records.load(Path(argv[0])), ["python -m harness.soak_check", *argv]) else 1
    )


if __name__ == "__main__":
    main(sys.argv[1:])
