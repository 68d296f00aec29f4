"""Answered (2026-12-03, 2026-12-04): a 10-client Ray round's idle cores are its serial
boundary between rounds, each step under about 10 ms
(docs/notes/2026-12-03-where-ray-idle-cores-go.md,
docs/notes/2026-12-03-why-rays-10-client-cell-stays-above-pfl-research.md).

Where a Ray simulation's rounds go: how much of each round every actor runs a
ClientApp, how long it waits between two messages of a round, and how long both wait
between rounds, split at the simulation process's own marks (the round's last reply
stored and folded, Flower's round loop's end, the aggregation, the next round's first
instruction stored, handed to the actor pool's submit and submitted).

    python -m benchmarks.studies.ray_timeline [--preset pfl-side-by-side]
        [--setting 100-clients-10pct] [--rounds 30] [--out DIR]

One cell of the preset (its Ray simulation row), run in this process. The actors'
side comes from Ray's own task events (``ray.timeline``, taken just before Flower's
backend stops Ray); the simulation process's side from marks this benchmark adds
around Flower's in-memory LinkState, its round loop (``fit_clients``), its actor pool
(whose ``submit`` the product's Ray patches wrap in turn when the engine starts:
``ray-weights-once``'s store comes before the submit's mark) and the strategy's
aggregation and fold (nothing of the product changes). Round 1 (start-up) and the
last round (the closing evaluation) are left out. All times are wall-clock seconds
on one machine's clock.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Task = tuple[str, float, float]  # (actor, start, end), seconds
MARKS = (
    "reply stored",
    "fold end",
    "round loop end",
    "aggregate start",
    "aggregate end",
    "instruction stored",
    "submit start",
    "submitted",
)


def actor_tasks(events: list[dict[str, Any]]) -> list[Task]:
    """Each actor call (``ClientAppActor.run``) from Ray's timeline events."""
    return sorted(
        ((str(e["tid"]), e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events
         if e.get("ph") == "X" and e.get("name") == "run"),
        key=lambda t: t[1],
    )  # fmt: skip


def _median_ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 1) if values else None


def summarize(tasks: list[Task], marks: dict[str, list[float]]) -> dict[str, Any]:
    """Busy shares, gaps and round boundaries over rounds 2 to N-1, where round r is
    everything that starts between the ends of aggregations r-1 and r."""
    ends = sorted(marks["aggregate end"])
    if len(ends) < 4:
        raise ValueError("ray_timeline needs at least 4 rounds (round 1 and the last are left out)")
    start, stop = ends[0], ends[-2]  # rounds 2 to N-1
    rounds: dict[int, list[Task]] = defaultdict(list)
    for task in tasks:
        r = next((i for i, end in enumerate(ends) if task[1] < end), None)
        if r is not None and 0 < r < len(ends) - 1:
            rounds[r].append(task)
    by_actor: dict[str, list[Task]] = defaultdict(list)
    for task in (t for r in sorted(rounds) for t in rounds[r]):
        by_actor[task[0]].append(task)
    window = stop - start
    actors = {
        actor: {
            "calls": len(ts),
            "busy_share": round(sum(min(e, stop) - max(s, start) for _, s, e in ts) / window, 3),
            "call_ms": _median_ms([e - s for _, s, e in ts]),
        }
        for actor, ts in sorted(by_actor.items())
    }
    within = []  # from one call's end to the same actor's next call in the round
    for r in rounds:
        for actor in by_actor:
            calls = [t for t in rounds[r] if t[0] == actor]
            within += [b[1] - a[2] for a, b in zip(calls, calls[1:])]
    boundaries = [
        _boundary(rounds[r], rounds[r + 1], marks) for r in sorted(rounds) if r + 1 in rounds
    ]
    keys = boundaries[0].keys() if boundaries else []
    return {
        "rounds": len(rounds),
        "round_ms": _median_ms([b - a for a, b in zip(ends[:-2], ends[1:-1])]),
        "actors": actors,
        "gap_within_round_ms": _median_ms(within),
        "boundary_ms": {k: _median_ms([b[k] for b in boundaries]) for k in keys},
    }


def _boundary(
    last: list[Task], next_: list[Task], marks: dict[str, list[float]]
) -> dict[str, float]:
    """One round's end to the next round's first ClientApp call: the tail (one actor
    still running while another has nothing left), then both idle, split at the
    simulation process's marks (a step whose mark is missing, as the fold's in a held
    round, counts 0)."""
    final = max(e for _, _, e in last)
    each_done = [max(e for a, _, e in last if a == actor) for actor in {t[0] for t in last}]
    first = min(s for _, s, _ in next_)

    def after(name: str, t: float) -> float:
        return min((m for m in marks.get(name, []) if m >= t), default=first)

    def last_within(name: str, lo: float, hi: float) -> float:
        return max((m for m in marks.get(name, []) if lo <= m <= hi), default=lo)

    stored = max((m for m in marks["reply stored"] if final <= m <= first), default=final)
    agg_start = after("aggregate start", stored)
    folded = last_within("fold end", stored, agg_start)  # the last reply's fold
    loop_end = last_within("round loop end", folded, agg_start)  # Flower's fit_clients
    agg_end = after("aggregate end", agg_start)
    instruction = after("instruction stored", agg_end)
    submit_start = after("submit start", instruction)
    submitted = after("submitted", submit_start)
    return {
        "tail (an actor idle)": final - min(each_done),
        "both idle": first - final,
        "last reply to its store": stored - final,
        "its fold": folded - stored,
        "to the round loop's end": loop_end - folded,
        "to the aggregation": agg_start - loop_end,
        "aggregation": agg_end - agg_start,
        "aggregation to first instruction": instruction - agg_end,
        "to the engine's submit": submit_start - instruction,
        "Ray's submit": submitted - submit_start,
        "submitted to the actor's call": first - submitted,
    }


@contextlib.contextmanager
def _instrumented(marks: dict[str, list[float]], timeline: Path) -> Iterator[None]:
    """Marks around Flower's classes in this process, and Ray's timeline written just
    before the backend stops Ray; Flower's classes as they were afterwards. The
    product's own patches of these classes that apply at import go in first, so the
    marks wrap them and putting the classes back keeps them."""
    import flwr.server.server as flower_server
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    import server_app.app  # noqa: F401 - applies linkstate-index and engine-wakeups
    from strategies.base import PFLStrategy
    from strategies.streaming import StreamedRound

    originals: list[tuple[Any, str, Any]] = []  # a class or a module, a name, its value

    def around(cls: Any, name: str, before: str | None, after: str | None) -> None:
        inner: Callable[..., Any] = getattr(cls, name)
        originals.append((cls, name, cls.__dict__[name]))

        @functools.wraps(inner)  # the patches beneath stay visible (ray_app.in_place)
        def marked(*args: Any, **kwargs: Any) -> Any:
            if before:
                marks[before].append(time.time())
            out = inner(*args, **kwargs)
            if after:
                marks[after].append(time.time())
            return out

        setattr(cls, name, marked)

    around(InMemoryLinkState, "store_message_res", None, "reply stored")
    around(StreamedRound, "fold", None, "fold end")
    around(flower_server, "fit_clients", None, "round loop end")  # Server.fit_round's
    around(InMemoryLinkState, "store_message_ins", None, "instruction stored")
    around(BasicActorPool, "submit", "submit start", "submitted")
    around(PFLStrategy, "aggregate_fit", "aggregate start", "aggregate end")
    terminate = RayBackend.terminate
    originals.append((RayBackend, "terminate", terminate))

    def terminate_after_the_timeline(self: Any) -> None:
        ray.timeline(str(timeline))
        terminate(self)

    RayBackend.terminate = terminate_after_the_timeline
    try:
        yield
    finally:
        for cls, name, original in reversed(originals):
            setattr(cls, name, original)


def run(preset: str, setting: str, rounds: int, out: Path) -> dict[str, Any]:
    """Run the preset's Ray cell for ``setting`` with ``rounds`` rounds; its summary."""
    from benchmarks import presets, runner

    cells = presets.load(preset).cells(rounds=rounds, runs=out / "runs")
    found = [c for c in cells if c.setting == setting and c.engine == "simulation"]
    if not found:
        raise SystemExit(f"{preset}: no Ray simulation row in setting {setting!r}")
    marks: dict[str, list[float]] = {name: [] for name in MARKS}
    timeline = out / "ray-timeline.json"
    found[0].dir.mkdir(parents=True, exist_ok=True)
    with _instrumented(marks, timeline):
        runner.run_cell_here(runner.cell_spec(found[0]))
    events = json.loads(timeline.read_text())
    summary = {"preset": preset, "setting": setting, **summarize(actor_tasks(events), marks)}
    summary["phase_ms"] = {
        phase: _median_ms([e["dur"] / 1e6 for e in events if e.get("name") == f"task:{phase}"])
        for phase in ("deserialize_arguments", "execute", "store_outputs")
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="pfl-side-by-side")
    ap.add_argument("--setting", default="100-clients-10pct")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary directory")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="ray-timeline-"))
    out.mkdir(parents=True, exist_ok=True)
    s = run(args.preset, args.setting, args.rounds, out)
    print(f"{s['preset']}, {s['setting']}: {s['rounds']} rounds timed, {s['round_ms']} ms a round")
    for actor, a in s["actors"].items():
        print(
            f"  actor {actor[-8:]}: {a['calls']} calls, busy {a['busy_share']:.0%}, {a['call_ms']} ms a call"
        )
    print(f"  between two calls of a round (median): {s['gap_within_round_ms']} ms")
    print("  a round's end to the next round's first call (median ms):")
    for k, v in s["boundary_ms"].items():
        print(f"    {k:34s} {v}")
    print(f"  Ray's phases of a call (median ms): {s['phase_ms']}")
    print(f"summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
