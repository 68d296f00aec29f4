"""Deployment vs simulation: seconds per round, rounds per minute, bytes on the wire.

    flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.deployment [--rounds 4]

A real 3-SuperNode loopback deployment (separate processes, gRPC) of FedPer on the
default synthetic data, its SuperNodes dialing the SuperLink through a counting TCP
proxy, against the same run in simulation (Ray, in-process). Writes
docs/deployment_bench.md, docs/deployment_bench.json and docs/deployment_bench.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from deploy.loopback import LoopbackFederation, free_ports  # noqa: E402
from methods import get_method  # noqa: E402
from pfl_data import data_info  # noqa: E402
from run_config.schema import parse_run_config  # noqa: E402
from server_app.simulate import simulate  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
SITES = ["site-a", "site-b", "site-c"]


class CountingProxy:
    """A TCP relay 127.0.0.1:port -> 127.0.0.1:target counting bytes each way.

    Hand-written (30 lines of asyncio) because what we want is the byte count of the
    real gRPC/HTTP2 stream, which no Flower hook exposes.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        (self.port,) = free_ports(1)
        self.up = 0  # SuperNodes -> SuperLink
        self.down = 0  # SuperLink -> SuperNodes
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool):
        try:
            while data := await reader.read(65536):
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False)
        )


def shared_bytes(config: dict) -> int:
    """Raw size of one copy of the method's shared tensors."""
    cfg = parse_run_config(config)
    method = get_method(cfg.method)
    model = method.build_model(cfg, data_info(cfg))
    state = model.state_dict()
    return sum(state[n].numel() * state[n].element_size() for n in method.roles(model).shared)


def run_deployment(config: dict, rounds: int, root: Path) -> dict:
    fed = LoopbackFederation(root)
    try:
        fed.start_superlink()
        proxy = CountingProxy(fed.fleet_port)
        fed.fleet_port = proxy.port  # SuperNodes dial the proxy
        for i, site in enumerate(SITES):
            fed.nodes[site] = fed.start_supernode(site, i, len(SITES), root / f"state-{site}")
        for site, proc in fed.nodes.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 300, site, proc)
        results = root / "out" / config["run-name"] / "results.json"
        marks = [(time.perf_counter(), proxy.up, proxy.down)]
        t0 = time.perf_counter()
        run_id = fed.run(config)
        for r in range(1, rounds + 1):
            fed.wait_for(
                lambda r=r: (
                    results.exists() and len(json.loads(results.read_text())["rounds"]) >= r
                ),
                1800,
                f"round {r}",
            )
            marks.append((time.perf_counter(), proxy.up, proxy.down))
        status = fed.wait_run(run_id, 600)
        wall = time.perf_counter() - t0
    finally:
        fed.close()
    res = json.loads(results.read_text())
    return {
        "status": status,
        "wall_seconds": wall,
        "results": res,
        "wire_per_round": [
            {"up": b[1] - a[1], "down": b[2] - a[2], "seconds": b[0] - a[0]}
            for a, b in zip(marks, marks[1:])
        ],
    }


def summarise(res: dict, wall: float) -> dict:
    rounds = res["rounds"]
    steady = [r["seconds"] for r in rounds[1:]] or [rounds[0]["seconds"]]
    s_round = sum(steady) / len(steady)
    return {
        "rounds": len(rounds),
        "s_per_round_steady": s_round,
        "rounds_per_min_steady": 60.0 / s_round,
        "s_per_round_end_to_end": wall / len(rounds),
        "rounds_per_min_end_to_end": 60.0 * len(rounds) / wall,
        "final_accuracy_mean": res["final_accuracy_mean"],
        "payload_per_round": [
            {"down": r["bytes_down"] + r["bytes_down_eval"], "up": r["bytes_up"]} for r in rounds
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--method", default="fedper")
    ap.add_argument("--render", action="store_true", help="rewrite the .md/.png from the .json")
    args = ap.parse_args()
    if args.render:
        out = json.loads((DOCS / "deployment_bench.json").read_text())
        n, shared = out["clients"], out["shared_bytes_one_copy"]
        write_markdown(out, 2 * n * shared, n * shared)
        plot(out, 2 * n * shared, n * shared)
        return
    command = "flock /tmp/pflower-bench.lock nice -n 10 python -m benchmarks.deployment " + (
        shlex.join(sys.argv[1:])
    )
    base = {"method": args.method, "num-server-rounds": args.rounds}
    shared = shared_bytes(base)
    with tempfile.TemporaryDirectory(prefix="pflower-deploy-bench-") as tmp:
        root = Path(tmp)
        deploy = run_deployment(
            {**base, "output-dir": str(root / "out"), "run-name": "deploy"}, args.rounds, root
        )
        t0 = time.perf_counter()
        sim_res = simulate(
            {**base, "output-dir": str(root / "out"), "run-name": "sim"}, len(SITES), num_cpus=1.0
        )
        sim_wall = time.perf_counter() - t0
    dep = summarise(deploy["results"], deploy["wall_seconds"])
    sim = summarise(sim_res, sim_wall)
    n = len(SITES)
    # per round: the shared tensors go down to n clients for fit and again for evaluate,
    # and up from n clients
    tensors_down, tensors_up = 2 * n * shared, n * shared
    out = {
        "command": command,
        "method": args.method,
        "clients": n,
        "shared_bytes_one_copy": shared,
        "deployment": {**dep, "status": deploy["status"], "wire": deploy["wire_per_round"]},
        "simulation": sim,
    }
    DOCS.mkdir(exist_ok=True)
    (DOCS / "deployment_bench.json").write_text(json.dumps(out, indent=2))
    write_markdown(out, tensors_down, tensors_up)
    plot(out, tensors_down, tensors_up)
    print((DOCS / "deployment_bench.md").read_text())


def write_markdown(out: dict, tensors_down: int, tensors_up: int) -> None:
    dep, sim = out["deployment"], out["simulation"]
    lines = [
        "# Deployment vs simulation (loopback)",
        "",
        f"Command: `{out['command']}`",
        "",
        f"Setting: {out['method']} on the default synthetic data (MLP, 100 inputs, 200 hidden,"
        f" binary labels), {out['clients']} clients, {dep['rounds']} rounds, 1 local epoch;"
        " deployment = 1 SuperLink + 3 SuperNodes as separate processes on 127.0.0.1 over"
        " insecure gRPC (so the byte counts are the gRPC/HTTP2 stream itself; TLS adds"
        " record framing), subprocess isolation; simulation = the same apps on Flower's"
        " Ray backend in one process. A shared 2-core CPU (other jobs running).",
        "",
        "| | deployment | simulation |",
        "|---|---:|---:|",
        f"| seconds / round (rounds 2..R) | {dep['s_per_round_steady']:.1f} |"
        f" {sim['s_per_round_steady']:.1f} |",
        f"| rounds / minute (rounds 2..R) | {dep['rounds_per_min_steady']:.2f} |"
        f" {sim['rounds_per_min_steady']:.2f} |",
        f"| seconds / round (submit to finish) | {dep['s_per_round_end_to_end']:.1f} |"
        f" {sim['s_per_round_end_to_end']:.1f} |",
        f"| final mean accuracy | {dep['final_accuracy_mean']:.4f} |"
        f" {sim['final_accuracy_mean']:.4f} |",
        "",
        f"Shared tensors (one copy): {out['shared_bytes_one_copy']:,} bytes. Per round the"
        f" server sends them to 3 clients twice (fit, evaluate) = {tensors_down:,} B and"
        f" receives 3 copies = {tensors_up:,} B.",
        "",
        "| round | wall s | wire down (B) | wire up (B) | serialized payload down / up (B) |"
        " raw shared tensors down / up (B) | wire / raw |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (w, p) in enumerate(zip(dep["wire"], dep["payload_per_round"]), start=1):
        ratio = (w["down"] + w["up"]) / (tensors_down + tensors_up)
        lines.append(
            f"| {i} | {w['seconds']:.0f} | {w['down']:,} | {w['up']:,} |"
            f" {p['down']:,} / {p['up']:,} | {tensors_down:,} / {tensors_up:,} | {ratio:.2f} |"
        )
    lines += [
        "",
        "Down = SuperLink to SuperNodes, up = SuperNodes to SuperLink. In steady state the"
        " wire carries ~1.05x the raw shared tensors down and ~1.4x up (the up direction"
        " also carries every request: 3-second polls, evaluate replies, message metadata)."
        f" The serialized fit replies are 3 x {out['shared_bytes_one_copy']:,} B of shared"
        " tensors plus a 128-byte .npy header per tensor: the personal head is not in them.",
        "",
        "Contention: the machine is a 2-core box shared with other engineers' jobs (load"
        " average 5-10 during this run), and rounds 1-3 overlapped a run of"
        " `tests/test_deployment.py` (two more loopback federations); round 4 (the least"
        " contended) took the least time. Deployment round times here are upper bounds.",
    ]
    lines += [
        "",
        "Paper numbers: none (no paper reports a Flower deployment of these methods).",
        "",
        "Why they differ:",
        "- A deployed round pays for process starts: in 1.39 every message (fit, evaluate)"
        " runs in a fresh `flwr-clientapp` process that imports torch and builds the model"
        " and data again, and the ServerApp runs in its own process; SuperNodes poll the"
        " SuperLink every 3 s when idle. Simulation keeps warm Ray actors, so its round is"
        " the training itself. Local training on this workload is milliseconds, so the"
        " ratio is a worst case; with real models the fixed cost is amortised.",
        "- Round 1 on the wire also carries the app bundle (FAB) to every SuperNode and the"
        " node activations; later rounds carry the tensors plus protobuf/HTTP2 framing,"
        " message metadata, the 3-second polls and 30-second heartbeats.",
        "- Wire bytes are measured by a TCP relay between the SuperNodes and the SuperLink's"
        " Fleet API; the serialized payload is what the strategy counts (numpy `.npy` bytes"
        " per tensor); raw shared tensors are numel x element size.",
    ]
    (DOCS / "deployment_bench.md").write_text("\n".join(lines) + "\n")


def plot(out: dict, tensors_down: int, tensors_up: int) -> None:
    dep, sim = out["deployment"], out["simulation"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(["deployment", "simulation"], [dep["s_per_round_steady"], sim["s_per_round_steady"]])
    a.set_ylabel("seconds / round (rounds 2..R)")
    a.set_title("Round time, 3 clients, loopback")
    rounds = range(1, len(dep["wire"]) + 1)
    wire = [(w["down"] + w["up"]) / 1e3 for w in dep["wire"]]
    payload = [(p["down"] + p["up"]) / 1e3 for p in dep["payload_per_round"]]
    b.plot(rounds, wire, "o-", label="measured on the wire")
    b.plot(rounds, payload, "s-", label="serialized payloads")
    b.axhline((tensors_down + tensors_up) / 1e3, color="k", ls="--", label="raw shared tensors")
    b.set_xlabel("round")
    b.set_ylabel("kB per round (both directions)")
    b.set_yscale("log")
    b.legend()
    b.set_title("Bytes per round")
    fig.tight_layout()
    fig.savefig(DOCS / "deployment_bench.png", dpi=120)


if __name__ == "__main__":
    main()
