"""The results of a run: ``<output-dir>/<run-name>/results.json``, ``rounds.csv``,
``accuracy.png``, optional TensorBoard event files (``tensorboard=true``) and a
terminal summary, written as rounds complete (a crash keeps what was done).
The strategies record into it; it knows nothing of methods."""

from __future__ import annotations

import csv
import functools
import json
import logging
import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pflower.config.schema import ConfigError, RunConfig
from pflower.flower_lines import installed

log = logging.getLogger("flwr.pflower")


def default_run_name(cfg: RunConfig) -> str:
    return f"{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"


# above this many clients a round's per-client accuracies go to PER_CLIENT_FILE, one line
# a round, not into results.json: memory and each round's rewrite stay bounded
PER_CLIENT_INLINE = 1000
PER_CLIENT_FILE = "per_client.jsonl"


SITES_DATA = "each site's own data"  # a deployed run's dataset and partition


class RunRecorder:
    """Collects per-round records and writes the results files."""

    def __init__(self, cfg: RunConfig, extra: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.run_name = cfg.run_name or default_run_name(cfg)
        self.dir = Path(cfg.output_dir).expanduser().resolve() / self.run_name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rounds: list[dict[str, Any]] = []
        # each record of ``rounds`` as results.json holds it, encoded once: a record does
        # not change once added, and encoding every round again each round (json's
        # indented encoder is pure Python) costs more with every round
        self._encoded: list[str] = []
        self.extra: dict[str, Any] = dict(extra or {})
        self.t0 = time.perf_counter()
        self.round_offset = 0  # rounds done before a resumed run
        self.provenance = provenance()
        self.board = tensorboard_writer(self.dir) if cfg.tensorboard else None
        self.data_at_sites = False  # deployed: the server's 'dataset' is not what trained

    def resume(self, server_round: int, rounds: list[dict[str, Any]], path: Path) -> None:
        """Go on after ``server_round``, keeping the earlier runs' records."""
        self.round_offset = server_round
        self.rounds, self._encoded = list(rounds), []
        self.extra["resumed_from"] = {"checkpoint": str(path), "round": server_round}

    @property
    def results_path(self) -> Path:
        return self.dir / "results.json"

    def add_round(self, record: dict[str, Any]) -> None:
        per_client = record.get("per_client_accuracy", {})
        if len(per_client) > PER_CLIENT_INLINE:  # many clients: out of memory, into a file
            record = dict(record)
            line: dict[str, Any] = {"round": record["round"]}
            for key in [k for k in record if k.startswith("per_client_")]:
                line[key.removeprefix("per_client_")] = record.pop(key)
            with open(self.dir / PER_CLIENT_FILE, "a") as out:
                out.write(json.dumps(line) + "\n")
            record["per_client_accuracy"] = {}
            record["per_client_file"] = PER_CLIENT_FILE
        self.rounds.append(record)
        if self.board is not None:
            for key in CSV_COLUMNS[1:]:
                if isinstance(record.get(key), (int, float)):
                    self.board.add_scalar(key, record[key], record["round"])
            self.board.flush()
        total = self.round_offset + self.cfg.num_server_rounds
        # with eval-in-fit a round's model is scored by the clients at the start of the
        # next round (Flower's [ROUND r+1]), the last one by the closing evaluation
        scored = (
            f"scored in round {record['round'] + 1}"
            if self.cfg.eval_in_fit and record["round"] < total
            else "scored at the end"
            if self.cfg.eval_in_fit
            else f"scored in round {record['round']}"
        )
        outcome = (
            f"({scored})  acc(mean) {record['accuracy_mean']:.4f}  "
            f"acc(pooled) {record['accuracy_pooled']:.4f}"
            if record["accuracy_mean"] is not None
            else f"not scored (evaluate-every={self.cfg.evaluate_every})"
        )
        log.info(
            "[%s] round %d/%d model %s  up %s  down %s  %.1fs",
            self.cfg.method,
            record["round"],
            total,
            outcome,
            human_bytes(record["bytes_up"]),
            human_bytes(record["bytes_down"]),
            record["seconds"],
        )
        self.write()
        if record["round"] >= total:
            self.finish()

    def summary(self) -> dict[str, Any]:
        scored = scored_rounds(self.rounds)  # evaluate-every leaves rounds between unscored
        accs = [r["accuracy_mean"] for r in scored]
        best = max(range(len(accs)), key=accs.__getitem__) if accs else None
        pooled = [r["accuracy_pooled"] for r in scored]
        config = self.cfg.as_dict()
        if self.data_at_sites and config["dataset"] == "synthetic":  # the server holds none
            config.update(dataset=SITES_DATA, partitioner=SITES_DATA)
        return {
            "method": self.cfg.method,
            "config": config,
            "provenance": self.provenance,
            "rounds": self.rounds,
            "best_accuracy_mean": accs[best] if accs else None,
            "best_round": scored[best]["round"] if accs else None,
            "best_accuracy_pooled": max(pooled) if pooled else None,
            "final_accuracy_mean": accs[-1] if accs else None,
            "final_accuracy_pooled": pooled[-1] if pooled else None,
            "total_bytes_up": sum(r["bytes_up"] for r in self.rounds),
            "total_bytes_down": sum(r["bytes_down"] for r in self.rounds),
            "total_seconds": time.perf_counter() - self.t0,
            **self.extra,
        }

    def results_json(self) -> str:
        """results.json's text: ``json.dumps(self.summary(), indent=2)``, the records
        of earlier rounds as encoded when they were first written."""
        summary = self.summary()
        for record in self.rounds[len(self._encoded) :]:
            self._encoded.append(encode_round(record))
        marker = f"rounds-{id(self)}-{len(self.rounds)}"  # not a string a summary holds
        text = json.dumps({**summary, "rounds": marker}, indent=2, default=_jsonable)
        rounds = "[\n" + ",\n".join(self._encoded) + "\n  ]" if self._encoded else "[]"
        return text.replace(json.dumps(marker), rounds, 1)

    def write(self) -> None:
        tmp = self.results_path.with_suffix(".json.tmp")
        tmp.write_text(self.results_json())
        os.replace(tmp, self.results_path)
        write_rounds_csv(self.rounds, self.dir / "rounds.csv")

    def finish(self) -> None:
        self.write()
        summary = self.summary()
        plot_accuracy([summary], self.dir / "accuracy.png", committed_curves(summary))
        print(summary_table(summary), flush=True)
        print(
            f"results: {self.results_path} (per round: rounds.csv; plot: accuracy.png)",
            flush=True,
        )


CSV_COLUMNS = (
    "round",
    "accuracy_mean",
    "accuracy_pooled",
    "loss_mean",
    "train_loss_mean",
    "bytes_up",
    "bytes_down",
    "seconds",
)


def encode_round(record: dict[str, Any]) -> str:
    """One round's record as an item of results.json's ``rounds`` (indent 2, at depth 2)."""
    return textwrap.indent(json.dumps(record, indent=2, default=_jsonable), "    ")


def scored_rounds(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The round records with an accuracy (``evaluate-every`` leaves others unscored)."""
    return [r for r in rounds if "accuracy_mean" not in r or r["accuracy_mean"] is not None]


def write_rounds_csv(rounds: list[dict[str, Any]], path: Path) -> None:
    """One row per round, the columns a spreadsheet wants first."""
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in rounds:
            writer.writerow(["" if r.get(c) is None else r.get(c) for c in CSV_COLUMNS])
    os.replace(tmp, path)


def git_commit(where: Path) -> str:
    """The checkout's HEAD (with '+dirty' for uncommitted changes); '' elsewhere."""
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def git_commit_once(where: Path) -> str:
    """``git_commit`` looked up once per process. A simulation calls it before Ray
    starts: run_simulation builds the ServerApp in a thread while the main thread forks
    Ray's processes with a Python ``preexec_fn``, and a ``git`` child forked at that
    moment left Ray's child spinning before its exec (a hang seen in CI's tests)."""
    return git_commit(where)


def provenance() -> dict[str, str]:
    """What produced a run: versions, the checkout's commit and the command. Under
    ``flwr run`` the ServerApp runs from an installed copy: the commit is looked up
    where the SuperLink was started, and ``bash scripts/dev.sh run`` fills in the
    commit and the command the user typed when the run ends (pflower.cli)."""
    return {
        "flwr": installed("flwr"),
        "torch": installed("torch"),
        "python": platform.python_version(),
        "git_commit": git_commit_once(Path.cwd()),
        "command": redacted_command(sys.argv),
    }


# Flags whose values are secrets: Flower's flwr-serverapp gets its run token on the
# command line (seen in a docker deployment's results.json before this was added).
SECRET_FLAGS = ("--token", "--auth-supernode-private-key")


def redacted_command(argv: list[str]) -> str:
    """The command line with the value of every secret flag replaced by ``***``."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            if "=" in arg:
                out.append(f"{flag}=***")
            else:
                out.append(arg)
                hide = True
            continue
        out.append(arg)
    return " ".join(out)


def tensorboard_writer(run_dir: Path) -> Any:
    """TensorBoard event files under ``<run dir>/tensorboard`` (needs the optional
    ``tensorboard`` package: ``pip install -e '.[tensorboard]'``)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "config key 'tensorboard': true needs the tensorboard package "
            "(pip install -e '.[tensorboard]')"
        ) from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GB"


def summary_table(summary: dict[str, Any]) -> str:
    """A short terminal table of one run; each mean says over how many clients."""
    rounds = scored_rounds(summary["rounds"])
    scored = {r.get("round"): len(r.get("per_client_accuracy") or {}) for r in rounds}
    last = rounds[-1].get("round") if rounds else None
    best, final = scored.get(summary["best_round"]), scored.get(last)
    counts = sorted(set(scored.values()))
    rows = [
        ("method", summary["method"]),
        ("rounds", str(len(summary["rounds"]))),
        (
            f"best accuracy (mean over {best or 'the'} clients)",
            f"{summary['best_accuracy_mean']:.4f} (round {summary['best_round']})",
        ),
        (
            f"final accuracy (mean over {final or 'the'} clients)",
            f"{summary['final_accuracy_mean']:.4f}",
        ),
        ("final accuracy (pooled)", f"{summary['final_accuracy_pooled']:.4f}"),
        ("best accuracy (pooled)", f"{summary['best_accuracy_pooled']:.4f}"),
        (
            "bytes up / down (fit)",
            f"{human_bytes(summary['total_bytes_up'])} / {human_bytes(summary['total_bytes_down'])}",
        ),
        ("wall time", f"{summary['total_seconds']:.1f}s"),
    ]
    if len(counts) > 1 and 0 not in counts:  # late joiners or drop-outs: not one population
        rows.insert(2, ("clients scored a round", f"{counts[0]} to {counts[-1]}"))
    from pflower.results.reference import reference_rows

    size = summary.get("federation_size") or 0
    method, final = summary["method"], summary["final_accuracy_mean"]
    rows += reference_rows(summary["config"], size, len(summary["rounds"]), method, final)
    if "dp_epsilon" in summary:
        eps = summary["dp_epsilon"]
        spent = "no guarantee (no noise)" if eps is None else f"epsilon {eps:.3g}"
        rows.append(("privacy spent", f"{spent} at delta {summary['dp_delta']:g}"))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 30)
    return "\n".join([line, *(f"{k.ljust(width)}  {v}" for k, v in rows), line])


def committed_curves(summary: dict[str, Any]) -> list[tuple[str, list[list[float]]]]:
    """The committed curves of the other methods on this run's data, federation and
    rounds (pflower/results/reference.py), for its plot."""
    from pflower.results.reference import reference_curves

    size = summary.get("federation_size") or 0
    rounds = len(scored_rounds(summary["rounds"]))
    return reference_curves(summary["config"], size, rounds, summary["method"])


SERIES_KEY = "pflower:series"  # the PNG text chunk with the lines a plot draws


def plot_accuracy(
    summaries: list[dict[str, Any]],
    path: Path,
    committed: Sequence[tuple[str, list[list[float]]]] = (),
) -> None:
    """Mean per-client accuracy per round, one line per run; ``committed``: other
    methods' runs on the same data (label, each seed's accuracy per round), drawn as
    their mean over the seeds with the range between the lowest and highest seed.
    The lines drawn are stored in the PNG (``SERIES_KEY``: label -> rounds, values),
    read back from the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for s in summaries:
        scored = scored_rounds(s["rounds"])
        seed = f", seed {s['config'].get('seed', 0)}" if committed else ""
        ax.plot(
            [r["round"] for r in scored],
            [r["accuracy_mean"] for r in scored],
            marker="o",
            ms=3,
            lw=2 if committed else 1.5,
            label=f"{s['method']} (this run{seed})" if committed else s["method"],
            zorder=3,
        )
    for label, curves in committed:
        values = np.array(curves, dtype=float)
        x = np.arange(1, values.shape[1] + 1)
        (line,) = ax.plot(x, values.mean(axis=0), ls="--", lw=1.3, label=f"{label}: mean")
        ax.fill_between(
            x, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.15
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (mean over clients)")
    if len(summaries) == 1:
        cfg = summaries[0]["config"]
        ax.set_title(
            f"{cfg['method']} on {Path(str(cfg['dataset'])).name} ({cfg['model']})", fontsize=10
        )
        if committed:
            ax.set_title(
                ax.get_title() + "; shaded: the range over the committed seeds", fontsize=9
            )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8 if committed else None)
    fig.tight_layout()
    series = {
        str(line.get_label()): [
            [float(v) for v in line.get_xdata()],
            [float(v) for v in line.get_ydata()],
        ]
        for line in ax.get_lines()
    }
    fig.savefig(path, dpi=120, metadata={SERIES_KEY: json.dumps(series)})
    plt.close(fig)


def plotted_series(path: Path) -> dict[str, list[list[float]]]:
    """The lines a plot of ``plot_accuracy`` drew: label -> [rounds, values]."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text[SERIES_KEY])  # type: ignore[attr-defined]
