"""Real deployment on loopback: SuperLink + SuperNodes over gRPC, TLS, SuperNode
authentication, restart-safe personal state, the client boundary, a Ray cluster.

Both deployments (plain and secure) are started once per module, by the first
test that needs them, and run concurrently; the restart test kills a SuperNode right
after round 1, so it must be the first of them. All processes are started by the
test, bounded in time and killed by pid in the fixture's teardown.
"""

from __future__ import annotations

import fnmatch
import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import yaml
from flwr.client import ClientApp
from flwr.common import (
    Context,
    EvaluateIns,
    FitIns,
    Message,
    MessageType,
    Metadata,
    RecordDict,
    parameters_to_ndarrays,
)
from flwr.compat.common.recorddict_compat import (
    evaluateins_to_recorddict,
    fitins_to_recorddict,
    recorddict_to_evaluateres,
    recorddict_to_fitres,
)

import methods
from client_app.app import build_client
from deploy.site import main as site_main
from deploy.site_guard import fab_hash, installed_app_hash, ledger_table, read_ledger
from deploy.warm_superexec import own_flags
from harness.loopback import BIN, REPO, LoopbackFederation, descendants, free_ports
from methods import parse_run_config
from models.wire import Wire
from pflower.data import data_info
from pflower.engine.inprocess import run_inprocess
from pflower.engine.simulate import simulate
from pflower.flower_lines import fleet_over_http
from server_app.app import build_server
from tests.test_wire_audit import check_values

pytestmark = pytest.mark.slow

SITES = ["site-a", "site-b", "site-c"]
ROUNDS = 3
RUN_TIMEOUT = 900  # seconds; a loaded 2-core machine needs ~1 min a round, an idle one ~10 s
SMALL = {"sim-samples": 120, "hidden-dim": 32, "sim-dim": 20}


def _run_config(root: Path, method: str) -> dict[str, Any]:
    return {
        "method": method,
        "num-server-rounds": ROUNDS,
        "output-dir": str(root / "out"),
        "run-name": "deploy",
    }


def _results(root: Path) -> dict[str, Any] | None:
    path = root / "out" / "deploy" / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def _rounds_done(root: Path) -> int:
    res = _results(root)
    return len(res["rounds"]) if res else 0


def _state_file(root: Path, site: str) -> Path:
    return root / f"state-{site}" / "deploy" / f"{site}.npz"


@pytest.fixture(scope="module")
def federations(tmp_path_factory: pytest.TempPathFactory):
    """Start a plain (insecure, process isolation) and a secure (TLS + SuperNode auth)
    loopback deployment, 3 SuperNodes each, and submit one 3-round run to each."""
    # plain also runs the docker/ topology: a separate SuperExec next to each SuperLink
    # and SuperNode (--isolation process, SuperExec secret), the sites' being the warm
    # one (deploy/warm_superexec.py, deploy/fast_supernode.py); secure uses the default
    plain = LoopbackFederation(tmp_path_factory.mktemp("plain"), isolation="process", warm=True)
    secure = LoopbackFederation(tmp_path_factory.mktemp("secure"), tls=True, auth=True)
    try:
        secure.make_certs([*SITES, "intruder"])
        plain.start_superlink()
        secure.start_superlink()
        node_ids = {site: secure.register(site) for site in SITES}
        for fed in (plain, secure):
            fed.nodes = {
                site: fed.start_supernode(
                    site,
                    i,
                    len(SITES),
                    fed.root / f"state-{site}",
                    key=fed.key(site) if fed.auth else None,
                )
                for i, site in enumerate(SITES)
            }
        # a key the SuperLink never registered
        secure.intruder = secure.start_supernode(
            "intruder", 0, len(SITES), secure.root / "state-intruder", key=secure.key("intruder")
        )
        for fed in (plain, secure):
            for site, proc in fed.nodes.items():
                fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 120, site, proc)
        plain.run_id = plain.run(_run_config(plain.root, "fedper"))
        secure.run_id = secure.run(_run_config(secure.root, "fedper"))
        secure.node_ids = node_ids
        yield {"plain": plain, "secure": secure}
    finally:
        secure.close()
        plain.close()


# ---- what leaves a client: captured by a client mod, for every registered method ----------


@pytest.mark.parametrize("method", methods.method_names())
def test_only_the_shared_spec_leaves_the_client(method: str, tmp_path: Path) -> None:
    cfg = {**SMALL, "method": method, "output-dir": str(tmp_path), "run-name": "wire"}
    cfg["local-epochs"] = (
        2  # some schedules have phases (FedDecomp: feddecomp.lora-epochs <= local-epochs)
    )
    strategy = build_server(Context(0, 0, {}, RecordDict(), {}), cfg).strategy
    outgoing: list[Message] = []

    def capture(msg: Message, ctx: Context, call_next: Any) -> Message:
        reply = call_next(msg, ctx)
        outgoing.append(reply)  # exactly what the SuperNode would send back
        return reply

    app = ClientApp(client_fn=lambda ctx: build_client(ctx, cfg), mods=[capture])
    node = {"partition-id": 1, "num-partitions": 3, "site": "site-b"}
    ctx = Context(1, 7, node, RecordDict(), {})
    payload = strategy.payload_for(None, 1)
    client_config = {"server-round": 1, **strategy.client_config(None, 1)}
    for message_type, content in (
        (MessageType.TRAIN, fitins_to_recorddict(FitIns(payload, client_config), True)),
        (
            MessageType.EVALUATE,
            evaluateins_to_recorddict(EvaluateIns(payload, client_config), True),
        ),
    ):
        meta = Metadata(1, "m", 1, 7, "", "1", time.time(), 3600.0, message_type)
        app(Message(content=content, metadata=meta), ctx)  # as the SuperNode delivers it
    train, evaluate = outgoing

    # The upload spec names model tensors only (an encoding may split one: 'name#idx'); a
    # method without its own upload spec sends exactly the shared tensors. (Factorized-FL
    # uploads v^{L-1} for similarity matching, dynamic FedFac whole Lambda layers for factor
    # analysis: their papers' protocols, declared in their wires' up_spec.)
    method_ = methods.get_method(method)
    parsed = parse_run_config(cfg)
    roles = method_.roles(method_.build_model(parsed, data_info(parsed)), parsed)
    spec = strategy.wire.up_spec()
    assert {s.name.split("#")[0] for s in spec} <= set(roles.shared) | set(roles.personal)
    if type(strategy.wire).up_spec is Wire.up_spec:
        assert [s.name for s in spec] == list(roles.shared)

    fit = recorddict_to_fitres(train.content, keep_input=True)
    sent = parameters_to_ndarrays(fit.parameters)
    assert len(sent) == len(spec)
    for s, array in zip(spec, sent):
        assert s.matches(array) is None, s.matches(array)
    wire = sum(len(t) for t in fit.parameters.tensors)
    assert wire <= sum(a.nbytes for a in sent) + 200 * len(sent)  # tensor bytes + headers only
    assert fit.metrics["client-key"] == "site-b"
    check_values("fit reply", fit.metrics)  # numbers and short ids: no smuggled tensors
    # an evaluation reply carries no tensors at all, and the same kind of metrics
    assert not evaluate.content.array_records
    check_values("evaluate reply", recorddict_to_evaluateres(evaluate.content).metrics)


# ---- the per-site launcher -------------------------------------------------------------------


def test_site_launcher_builds_the_supernode_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:  # it prints the command, then what would stop it
        site_main(
            [
                "--superlink=10.1.2.3:9092",
                "--site=hospital-a",
                "--data-path=/data/site",
                "--device=cuda:0",
                "--state-dir=/var/lib/pflower",
                "--root-certificates=ca.crt",
                "--auth-key=keys/hospital-a",
                "--roster=roster.toml",
                "--dry-run",
            ]
        )
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert "--root-certificates ca.crt: not a readable PEM certificate" in err
    assert "--data-path /data/site: does not exist" in err
    superexec, line = out.strip().splitlines()
    # warm by default: Flower's SuperNode (idle poll backing off) with process isolation,
    # and the warm SuperExec beside it on the site-local Runtime API, sharing a secret
    assert "-m deploy.fast_supernode --superlink 10.1.2.3:9092" in line
    assert "--isolation process --superexec-auth-secret-file /var/lib/pflower/superexec." in line
    assert "--root-certificates ca.crt" in line and "--port 9094" in line
    assert "-m deploy.warm_superexec --runtime-api-address 127.0.0.1:9094 --insecure" in superexec
    assert "--superexec-auth-secret-file /var/lib/pflower/superexec.secret" in superexec
    assert "--task-timeout=900 --max-tasks=1" in superexec  # a hung task is killed
    assert "--auth-supernode-private-key keys/hospital-a" in line
    assert "--insecure" not in line
    assert (
        """'site="hospital-a" state-dir="/var/lib/pflower" data-path="/data/site" """
        """device="cuda:0" accept-disclosures="" require-secure-aggregation="false" """
        """allowed-methods="all" min-secagg-sites=3 secagg-roster=""" in line
    )  # the site's policy: shared tensors only unless the operator says otherwise
    # the site's own roster, and its SuperNode key signs its SecAgg+ keys
    assert f'secagg-roster="{os.path.abspath("roster.toml")}"' in line
    assert f'identity-key="{os.path.abspath("keys/hospital-a")}"' in line
    site_main(
        ["--superlink=h:1", "--site=a", "--state-dir=s", "--insecure", "--dry-run"]
        + ["--accept-disclosures=head-blend", "--require-secure-aggregation"]
        + ["--unverified-secagg-keys"]
    )
    policy = capsys.readouterr().out.strip().splitlines()[-1]
    assert 'accept-disclosures="head-blend" require-secure-aggregation="true"' in policy
    assert 'secagg-unverified-keys="true"' in policy  # the SuperNode's opt-in (below)
    with pytest.raises(SystemExit):  # a site that requires SecAgg+ checks its neighbours
        site_main(
            ["--superlink=h:1", "--site=a", "--state-dir=s", "--insecure", "--dry-run"]
            + ["--require-secure-aggregation"]
        )
    assert "needs --roster" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # and signs its own keys
        site_main(
            ["--superlink=h:1", "--site=a", "--state-dir=s", "--insecure", "--dry-run"]
            + ["--roster=r.toml"]
        )
    assert "--roster needs --auth-key" in capsys.readouterr().err
    site_main(
        ["--superlink=h:1", "--site=a", "--state-dir=s", "--insecure", "--no-warm", "--dry-run"]
    )
    superexec, cold = capsys.readouterr().out.strip().splitlines()
    # Flower's own SuperNode, ClientApps started cold, still by the site's own SuperExec
    assert "flower-supernode --superlink h:1 --isolation process" in cold
    assert "-m deploy.warm_superexec" in superexec and "--no-preload" in superexec
    assert "--approved-apps" not in superexec  # default: the build installed here
    with pytest.raises(SystemExit):  # neither TLS nor an explicit --insecure
        site_main(["--superlink=h:1", "--site=a", "--state-dir=s", "--dry-run"])
    with pytest.raises(SystemExit):  # authentication over plain text is refused
        site_main(["--superlink=h:1", "--site=a", "--state-dir=s", "--insecure", "--auth-key=k"])


# ---- Ray: the simulation joins an existing cluster --------------------------------------------


def test_waiting_for_a_run_asks_the_cli_rarely_while_its_serverapp_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each status is a ``flwr`` CLI process (about 1 s of CPU): while a ServerApp
    process of the harness is alive, wait_run asks for it every STATUS_WHILE_SERVING
    s, not every STATUS_EVERY s, and once that process ends it finds the end soon."""
    from harness import loopback

    monkeypatch.setattr(loopback, "STATUS_EVERY", 0.2)
    monkeypatch.setattr(loopback, "WATCH_EVERY", 0.05)
    # no backstop within the 30 s the wait is given: only the watch can find the end
    monkeypatch.setattr(loopback, "STATUS_WHILE_SERVING", 1e6)

    class Watched(loopback.FlwrCli):
        def __init__(self) -> None:
            self.root, self.procs, self.asked = tmp_path, [], []

        def status(self, run_id: int) -> str:
            self.asked.append(time.monotonic())
            return "running" if self.serverapp_running() else "finished:completed"

    fed = Watched()
    # a ServerApp for 2 s, a child of a process the harness started (as a SuperExec's)
    fed._spawn("superexec", ["bash", "-c", "(exec -a flwr-serverapp sleep 2); sleep 60"], tmp_path)
    try:
        fed.wait_for(fed.serverapp_running, 10, "the ServerApp")
        assert fed.wait_run(1, timeout=30) == "finished:completed"  # the ServerApp: 2 s
    finally:
        fed.close()
    assert len(fed.asked) <= 2  # asked every 0.2 s, as without a ServerApp: about 10
    assert not fed.serverapp_running()  # the harness's processes are gone


def test_simulation_joins_an_existing_ray_cluster(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    temp = Path(f"/tmp/pflr{port}")  # Ray's socket paths must stay short
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    try:
        if ray.is_initialized():
            ray.shutdown()
        deadline = time.monotonic() + 120
        while not list(temp.glob("session_*/logs/gcs_server.out")):
            assert head.poll() is None and time.monotonic() < deadline, "Ray head did not start"
            time.sleep(1)
        cfg = {
            **SMALL,
            "method": "fedper",
            "num-server-rounds": 2,
            "output-dir": str(tmp_path),
            "run-name": "ray",
        }
        results = simulate(cfg, 2, ray_init_args={"address": address})
        assert [r["round"] for r in results["rounds"]] == [1, 2]
        assert sorted(results["rounds"][-1]["per_client_accuracy"]) == ["client-0", "client-1"]
        ray.shutdown()
        # The cluster numbers its drivers: the simulation was job 1 on this head, so a
        # new driver is job 2 (a simulation that had started its own Ray would leave 1).
        ray.init(address=address, logging_level="ERROR")
        assert ray.get_runtime_context().get_job_id() == ray.JobID.from_int(2).hex()
        assert ray.cluster_resources().get("CPU") == 2.0
    finally:
        if ray.is_initialized():
            ray.shutdown()
        family = descendants(head.pid)
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in family:  # never `ray stop`: it would stop other users' Ray on this machine
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)  # the head's session files


# ---- the deployments --------------------------------------------------------------------------


@pytest.mark.flower142
def test_secure_supernode_restart_restores_personal_state(federations) -> None:
    fed: LoopbackFederation = federations["secure"]
    path = _state_file(fed.root, "site-b")
    # site-b trained once (eval-in-fit records round 1 only with round 2's replies)
    fed.wait_for(path.exists, RUN_TIMEOUT, "site-b's first fit (secure)")
    time.sleep(1)  # the atomic rename is done; let the reply go out
    with np.load(path) as saved:
        digest = str(saved["__sha256__"])
        head = {k: saved[k] for k in saved.files if not k.startswith("__")}
    assert set(head) == {"head.weight", "head.bias"}

    assert _rounds_done(fed.root) < ROUNDS, "the run ended before the restart could be tested"
    old = fed.nodes["site-b"]
    old_id = re.search(r"SuperNode ID: (\d+)", old.text()).group(1)
    fed.stop(old, signal.SIGTERM)  # the site goes down (its ClientApp with it)
    assert not old.alive()
    new = fed.start_supernode(
        "site-b", 1, len(SITES), fed.root / "state-site-b", key=fed.key("site-b"), name="b-again"
    )
    fed.nodes["site-b"] = new
    fed.wait_for(lambda: "restored personal state" in new.text(), RUN_TIMEOUT, "restore", new)
    # the registered key gives the restarted SuperNode its old identity back ...
    assert re.search(r"SuperNode ID: (\d+)", new.text()).group(1) == old_id
    assert int(old_id) == fed.node_ids["site-b"]
    # ... and its first ClientApp restored exactly the tensors saved before the kill
    first = re.search(r"restored personal state from (\S+) \(sha256 (\w+)\)", new.text())
    assert Path(first.group(1)) == path and first.group(2) == digest

    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    res = _results(fed.root)
    assert [r["round"] for r in res["rounds"]] == [1, 2, 3]
    assert "site-b" in res["rounds"][-1]["per_client_accuracy"]
    with np.load(path) as after:  # training went on from the restored head
        assert not np.array_equal(after["head.weight"], head["head.weight"])


@pytest.mark.flower142
def test_secure_deployment_refuses_an_unregistered_supernode(federations) -> None:
    fed: LoopbackFederation = federations["secure"]
    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    fed.wait_for(lambda: not fed.intruder.alive(), 120, "the intruder to be refused")
    assert fed.intruder.popen.returncode != 0
    assert "SuperNode ID" not in fed.intruder.text()
    assert "Failed to activate SuperNode" in fed.intruder.text()
    superlink = next(p for p in fed.procs if p.name == "superlink").text()
    assert "No SuperNode found with the given public key" in superlink
    assert "https://127.0.0.1" in superlink  # TLS on the SuperLink's HTTP API
    if fleet_over_http():  # flwr 1.42: the sites came in over HTTP on that port
        assert '"POST /v1/fleet/activate-node HTTP/1.1" 412' in superlink  # the intruder
        assert '"POST /v1/fleet/get-run HTTP/1.1" 200' in superlink  # pulls are not logged
    res = _results(fed.root)
    assert sorted(res["rounds"][-1]["per_client_accuracy"]) == SITES
    listed = fed.flwr("supernode", "list", "loopback", "--format", "json").stdout
    assert all(str(i) in listed for i in fed.node_ids.values())


def test_plain_deployment_completes_and_keeps_personal_state_on_each_site(federations) -> None:
    fed: LoopbackFederation = federations["plain"]
    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    res = _results(fed.root)
    assert [r["round"] for r in res["rounds"]] == [1, 2, 3]
    assert all(r["replies"] == 3 and not r["rejected"] for r in res["rounds"])
    assert sorted(res["rounds"][-1]["per_client_accuracy"]) == SITES
    heads = []
    for site in SITES:
        with np.load(_state_file(fed.root, site)) as z:
            assert sorted(k for k in z.files if not k.startswith("__")) == [
                "head.bias",
                "head.weight",
            ]
            heads.append(z["head.weight"])
    # personal heads are per site (each trained on its own partition)
    assert not np.array_equal(heads[0], heads[1]) and not np.array_equal(heads[1], heads[2])
    # and the shared body was aggregated: bytes went both ways every round
    assert all(r["bytes_up"] > 0 and r["bytes_down"] > 0 for r in res["rounds"])
    # the ClientApps ran in each site's own warm SuperExec, forked (no fresh interpreter,
    # no flwr-clientapp process), and read their state from disk
    for site in SITES:
        superexec = next(p for p in fed.procs if p.name == f"superexec-supernode-{site}")
        assert "warm superexec: " in superexec.text() and "(torch: True)" in superexec.text()
        assert f"restored personal state from {_state_file(fed.root, site)}" in superexec.text()
        assert "ClientApp task failed" not in superexec.text()
        # the class-list query before round 1 (the run gives no class-names), a fit
        # message a round (eval-in-fit) and the closing evaluate message: the first
        # forks a worker, which serves the rest (the same app build)
        assert superexec.text().count("forked as pid") == 1
        assert superexec.text().count("to worker pid") == ROUNDS + 1


def test_a_deployment_trains_what_the_in_process_engine_trains_for_sites_of_those_names(
    federations, tmp_path: Path
) -> None:
    """The same code in both: a client's random stream is seeded by its name, so the
    in-process engine given the sites' names ends every round where the deployment
    did, site by site (named by partition instead, it draws other batches)."""
    fed: LoopbackFederation = federations["plain"]
    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    deployed = _results(fed.root)["rounds"]
    local = run_inprocess(
        _run_config(tmp_path, "fedper"), len(SITES), node_configs=[{"site": s} for s in SITES]
    )["rounds"]
    assert [r["per_client_accuracy"] for r in local] == [r["per_client_accuracy"] for r in deployed]
    for mine, theirs in zip(local, deployed):
        assert mine["per_client_train_loss"] == pytest.approx(theirs["per_client_train_loss"])


def test_the_ledger_lists_every_message_a_site_answered(federations) -> None:
    """Each site's own SuperExec writes one ledger line per reply: the class-list
    query, a fit a round and the closing evaluate, with what each carried."""
    fed: LoopbackFederation = federations["plain"]
    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    app = installed_app_hash()
    for site in SITES:
        lines = [e for e in read_ledger(fed.root / f"state-{site}") if e["run"] == fed.run_id]
        assert [e["type"] for e in lines] == ["get_properties"] + ["train"] * ROUNDS + ["evaluate"]
        fits = [e for e in lines if e["type"] == "train"]
        assert [e["round"] for e in fits] == [str(r) for r in range(1, ROUNDS + 1)]
        assert all(e["app"] == app and e["method"] == "fedper" and not e["refused"] for e in lines)
        # what went up: each array's key, shape, dtype and bytes
        assert all(e["arrays"] and e["bytes"] == sum(a["bytes"] for a in e["arrays"]) for e in fits)
        assert all("fitres.metrics.client-key" in e["metrics"] for e in fits)
        assert all(a["shape"] and a["dtype"] == "float32" for e in fits for a in e["arrays"])
        # named in the method's wire order: FedPer's body, never its personal head
        names = {a["tensor"] for e in fits for a in e["arrays"]}
        assert names and all(n.startswith("features.") for n in names), names
        assert all(e["disclosures"] == [] for e in lines)
        table = ledger_table(lines)
        assert table.count("\n") == len(lines) and "fedper" in table


@pytest.mark.flower142
def test_a_site_refuses_an_app_it_did_not_approve_before_running_any_of_it(
    federations, tmp_path: Path
) -> None:
    """A run ships a modified ClientApp that drops the site policy: every site's own
    SuperExec refuses its FAB by hash before unpacking it; none of its code runs,
    the run fails naming the hash, and each ledger records the refusal."""
    from flwr.cli.build import build_fab_from_disk

    fed: LoopbackFederation = federations["plain"]
    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    modified = tmp_path / "modified-app"
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(REPO))) as fab:
        fab.extractall(modified, [n for n in fab.namelist() if not n.startswith(".info/")])
    marker = tmp_path / "modified-app-imported"
    app_py = modified / "client_app" / "app.py"
    code = app_py.read_text().replace(
        "mods=[phases_mod, policy_mod, dropout_mod, secure_mod]",
        "mods=[phases_mod, dropout_mod]",  # no policy, no SecAgg+
    )
    app_py.write_text(f"open({str(marker)!r}, 'w').close()\n" + code)
    digest = fab_hash(build_fab_from_disk(modified))
    cfg = {**_run_config(fed.root, "fedcp"), **SMALL, "num-server-rounds": 1}
    run_id = fed.run({**cfg, "run-name": "modified-app"}, app=modified)
    assert fed.wait_run(run_id, RUN_TIMEOUT) == "finished:failed"
    assert not marker.exists()  # not one line of the modified app ran at any site
    for site in SITES:
        text = _superexec_log(fed, f"supernode-{site}")
        assert f"site '{site}' refuses this run by its policy: site policy 'approved-apps' " in text
        assert f"does not include this run's app {digest}" in text
        entries = [e for e in read_ledger(fed.root / f"state-{site}") if e["run"] == run_id]
        assert entries and all(e["refused"] and not e["arrays"] for e in entries)
        assert all(digest in e["error"] for e in entries)
    assert (
        not (fed.root / "out" / "modified-app" / "results.json").exists()
        or not json.loads((fed.root / "out" / "modified-app" / "results.json").read_text())[
            "rounds"
        ]
    )


def _superexec_log(fed: LoopbackFederation, name: str) -> str:
    return next(p for p in fed.procs if p.name == f"superexec-{name}").text()


REFUSED_RUNS = {  # each needs a disclosure the default site policy does not accept
    "fedcp": ({"method": "fedcp"}, "head-blend"),
    "alpha": ({"method": "factorized-fl-alpha"}, "matching-vector"),
    "dynamic": ({"method": "fedfac-dynamic"}, "personal-rows"),
    "ensemble": (
        {
            "method": "fedfac-static",
            "fedfac.new-client-sites": "site-c",
            "fedfac.new-client-mode": "ensemble",
            "fedfac.ensemble-share-models": True,
        },
        "whole-model",
    ),
    # consent to share models with no held-out site listed: a hostile site could still
    # claim to be new, so this too needs every site's 'whole-model'
    "ensemble-no-new-sites": (
        {
            "method": "fedfac-static",
            "fedfac.new-client-mode": "ensemble",
            "fedfac.ensemble-share-models": True,
        },
        "whole-model",
    ),
}


def test_each_site_enforces_its_own_policy(federations) -> None:
    """Sites with the default policy (shared tensors only) refuse every disclosing run
    before any tensor leaves; once the sites accept FedCP's disclosures, FedCP runs,
    and a site that requires SecAgg+ sits out the plain run and joins the secure one.
    Runs after the plain federation's other tests: it replaces the SuperNodes."""
    fed: LoopbackFederation = federations["plain"]
    assert fed.wait_run(fed.run_id, RUN_TIMEOUT) == "finished:completed"
    small = {**SMALL, "num-server-rounds": 2}
    for name, (extra, kind) in REFUSED_RUNS.items():
        cfg = {**_run_config(fed.root, extra["method"]), **small, **extra}
        run_id = fed.run({**cfg, "run-name": f"refused-{name}"})
        assert fed.wait_run(run_id, RUN_TIMEOUT) == "finished:failed", name
        results = fed.root / "out" / f"refused-{name}" / "results.json"
        assert not results.exists() or not json.loads(results.read_text())["rounds"]
        for site in SITES:
            text = _superexec_log(fed, f"supernode-{site}")
            assert f"site '{site}' refuses this run by its policy: site policy " in text
            assert f"'accept-disclosures' does not include '{kind}'" in text, (name, site)
    # the sites change their policy (a restart with a new node config)
    policies = {
        "site-a": {
            "accept-disclosures": "head-blend,head-sum",
            "require-secure-aggregation": "true",
            "secagg-unverified-keys": "true",  # no roster in this test (development)
        },
        "site-b": {"accept-disclosures": "head-blend,head-sum"},
        "site-c": {"accept-disclosures": "head-blend,head-sum"},
    }
    for site in SITES:
        fed.stop(fed.nodes[site])
    for i, site in enumerate(SITES):
        state = fed.root / f"state-{site}"
        name = f"{site}-policy"
        fed.nodes[site] = fed.start_supernode(
            site, i, len(SITES), state, None, name, policies[site]
        )
        fed.wait_for(lambda p=fed.nodes[site]: "SuperNode ID" in p.text(), 120, site)
    for secure in (False, True):
        run_name = f"fedcp-secure-{secure}"
        cfg = {**_run_config(fed.root, "fedcp"), **small, "run-name": run_name}
        run_id = fed.run({**cfg, "secure-aggregation": secure})
        assert fed.wait_run(run_id, RUN_TIMEOUT) == "finished:completed"
        res = json.loads((fed.root / "out" / run_name / "results.json").read_text())
        # site-a sits out the plain run; in the secure one its masked upload counts,
        # but it sends no score (it has not accepted 'metrics')
        assert sorted(res["rounds"][-1]["per_client_accuracy"]) == ["site-b", "site-c"]
        assert all(r["replies"] == (3 if secure else 2) for r in res["rounds"])
        if secure:
            fits = [  # the SecAgg+ stage that carries the fit's own reply
                {k for k in e["metrics"] if k.startswith("fitres.metrics.")}
                for e in read_ledger(fed.root / "state-site-a")
                if e["method"] == "fedcp" and e["type"] == "train" and not e["refused"]
            ]
            assert [k for k in fits if k] and all(k <= {"fitres.metrics.client-key"} for k in fits)
    refusal = "site policy 'require-secure-aggregation' refuses run key secure-aggregation=false"
    assert refusal in _superexec_log(fed, "site-a-policy")


def test_a_site_that_trusts_only_signed_apps_refuses_an_app_submitted_from_a_directory(
    federations, tmp_path: Path
) -> None:
    """Flower 1.39's --trusted-entities (docs/SITE.md, approved apps): signatures
    come only with apps fetched from Flower Hub, so a `flwr run .` app is refused.
    Runs after the policy test, on the same federation: it replaces the SuperNodes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    fed: LoopbackFederation = federations["plain"]
    public = Ed25519PrivateKey.generate().public_key()
    openssh = public.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    trusted = tmp_path / "trusted-entities.yaml"
    trusted.write_text(yaml.safe_dump({"fpk_site_reviewer": openssh.decode() + " reviewer"}))
    for proc in list(fed.nodes.values()):
        if proc.alive():
            fed.stop(proc)
    node = fed.start_supernode(
        "site-a", 0, 1, fed.root / "state-signed", name="signed-only",
        extra_args=["--trusted-entities", str(trusted)],
    )  # fmt: skip
    fed.nodes = {"site-a": node}
    fed.wait_for(lambda: "SuperNode ID" in node.text(), 120, "signed-only")
    cfg = {**_run_config(fed.root, "fedper"), **SMALL, "num-server-rounds": 1}
    run_id = fed.run({**cfg, "run-name": "unsigned"})
    fed.wait_run(run_id, RUN_TIMEOUT)
    assert "The FAB could not be verified" in node.text()
    results = fed.root / "out" / "unsigned" / "results.json"
    # no site trained: a round, if recorded, is recorded with no reply and no score
    rounds = json.loads(results.read_text())["rounds"] if results.exists() else []
    assert all(not r.get("replies") and r["accuracy_mean"] is None for r in rounds), rounds


def test_a_hung_clientapp_is_killed_after_its_timeout_and_the_round_goes_on(
    tmp_path: Path,
) -> None:
    """Two warm sites; site-b's ClientApp hangs on every fit (tests/apps/hang). Its
    SuperExec kills the task after --task-timeout, the server's round-timeout ends the
    wait, and both rounds complete with site-a's replies; the run then ends failed,
    naming site-b's node, which never contributed (strategies/outcome.py)."""
    hang_app = Path(__file__).parent / "apps" / "hang"
    hang = installed_app_hash(hang_app)  # the sites approve this test app's build
    with LoopbackFederation(tmp_path, isolation="process", warm=True) as fed:
        fed.start_superlink()
        nodes = {
            site: fed.start_supernode(
                site,
                i,
                2,
                tmp_path / f"state-{site}",
                superexec_args=["--task-timeout=5", f"--approved-apps={hang}"],
            )
            for i, site in enumerate(["site-a", "site-b"])
        }
        for site, proc in nodes.items():
            fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 120, site, proc)
        cfg = {**_run_config(tmp_path, "fedper"), **SMALL, "num-server-rounds": 2}
        run_id = fed.run({**cfg, "round-timeout": 20.0}, app=hang_app)
        assert fed.wait_run(run_id, RUN_TIMEOUT) == "finished:failed"
        res = _results(tmp_path)
        assert [r["round"] for r in res["rounds"]] == [1, 2]
        assert all(r["replies"] == 1 for r in res["rounds"])  # site-a's
        assert "site-a" in res["rounds"][-1]["per_client_accuracy"]
        assert res["outcome"]["participants"] == {"1": ["site-a"], "2": ["site-a"]}
        (problem,) = res["outcome"]["problems"]
        assert "(asked in 2 rounds) never contributed" in problem, problem
        killed = _superexec_log(fed, "supernode-site-b")
        assert "ran past --task-timeout 5s: killed" in killed


# ---- docker/: syntax, files, and every flag checked against the installed 1.39 CLIs ------------

DOCKER = Path(__file__).resolve().parents[1] / "docker"
ENTRYPOINTS = {
    "superlink": "flower-superlink",
    "supernode": "flower-supernode",
    "superexec": "flower-superexec",
}


@functools.cache
def _cli_help(binary: str) -> str:
    out = subprocess.run([str(BIN / binary), "--help"], capture_output=True, text=True, timeout=180)
    return out.stdout + out.stderr


@pytest.mark.parametrize("compose", sorted(p.name for p in DOCKER.glob("compose*.yml")))
def test_compose_file_is_valid_against_flower_1_39(compose: str) -> None:
    doc = yaml.safe_load((DOCKER / compose).read_text())
    override = re.search(r"\.(gpu|secagg)\.yml$", compose)
    if override:  # checked merged onto its base file, as compose merges it
        base = yaml.safe_load((DOCKER / compose.replace(override.group(0), ".yml")).read_text())
        assert set(doc["services"]) <= set(base["services"])
        for name, svc in doc["services"].items():
            for key, value in svc.items():
                merged = base["services"][name].get(key) if key == "volumes" else None
                base["services"][name][key] = (merged or []) + value if merged else value
        doc = base
    named_volumes = set(doc.get("volumes") or {})
    assert doc["services"]
    for name, svc in doc["services"].items():
        dockerfile = (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve()
        text = dockerfile.read_text()
        base = re.search(r"^FROM (\S+)$", text, re.M).group(1)
        kind = re.fullmatch(r"flwr/(superlink|supernode|superexec):1\.39\.\d+", base).group(1)
        entry = re.search(r'^ENTRYPOINT \["([\w-]+)"\]$', text, re.M).group(1)
        assert entry == ENTRYPOINTS[kind], name
        ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
        lines = ignore.read_text().splitlines() if ignore.exists() else []
        kept = [p[1:] for p in lines if p.startswith("!")]
        for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
            for path in src.split():
                assert (DOCKER.parent / path).exists(), (dockerfile.name, path)
                # BuildKit reads the Dockerfile's own .dockerignore: what it leaves out
                # of the build context, a COPY cannot find
                if ignore.exists():
                    assert any(fnmatch.fnmatch(path + "/x", k) or path == k for k in kept), path
        # a compose entrypoint `python -m M` (Flower's CLI wrapped): M is in the image
        if svc.get("entrypoint", [])[:2] == ["python", "-m"] and kind != "superexec":
            module = svc["entrypoint"][2].replace(".", "/") + ".py"
            assert module in re.findall(r"^COPY (.+) \S+$", text, re.M)[0].split(), name
        help_text = _cli_help(entry)
        own = set()  # the warm SuperExec's own flags, taken out before Flower's CLI reads
        if svc.get("entrypoint", [])[2:] == ["deploy.warm_superexec"]:
            own = {"--" + k.replace("_", "-") for k in vars(own_flags([])[0])}
        for arg in svc["command"]:
            assert arg.startswith("--"), (name, arg)
            if arg.split("=")[0] not in own:
                assert re.search(rf"{re.escape(arg.split('=')[0])}\b", help_text), (name, arg)
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(("./", "${")) or source in named_volumes, (name, volume)
        depends = svc.get("depends_on", [])
        for dep in depends:
            assert dep in doc["services"], (name, dep)
            # waiting for a healthy dependency needs the dependency's health check
            if isinstance(depends, dict) and depends[dep] == {"condition": "service_healthy"}:
                check = doc["services"][dep]["healthcheck"]["test"]
                assert check[:2] == ["CMD", "python"], (dep, check)
    # TLS everywhere a SuperNode or the CLI talks to the SuperLink
    for svc in doc["services"].values():
        cmd = " ".join(svc["command"])
        if "--superlink=" in cmd:
            assert "--root-certificates=" in cmd and "--auth-supernode-private-key=" in cmd
        if "--fleet-api-address" in cmd:
            assert "--ssl-certfile=" in cmd and "--enable-supernode-auth" in cmd
            assert "--insecure" not in cmd


def test_the_site_compose_file_carries_the_sites_policy() -> None:
    """compose.client.yml's node config, with its variables at their defaults, is the
    default policy (shared tensors only); set, they are the site's own choice."""
    from flwr.common.config import parse_config_args

    from methods import disclosure_kinds, method_names
    from pflower.privacy.policy import SitePolicy

    METHODS = method_names()

    doc = yaml.safe_load((DOCKER / "compose.client.yml").read_text())
    (arg,) = [a for a in doc["services"]["supernode"]["command"] if "--node-config=" in a]
    template = arg.removeprefix("--node-config=")

    def node(env: dict[str, str]) -> dict:
        def value(m: re.Match) -> str:
            return env.get(m.group(1), m.group(3) or "")

        text = re.sub(r"\$\{(\w+)(:-([^}]*))?\}", value, template)
        return parse_config_args([text])

    default = node({"SITE": "hospital-a"})
    assert default["site"] == "hospital-a"
    assert SitePolicy.of_node(default, METHODS, disclosure_kinds()) == SitePolicy()
    chosen = node(
        {"SITE": "h", "ACCEPT_DISCLOSURES": "head-blend", "REQUIRE_SECURE_AGGREGATION": "true"}
    )
    policy = SitePolicy.of_node(chosen, METHODS, disclosure_kinds())
    assert policy.accept == {"head-blend"} and policy.require_secure_aggregation
    # #62: no roster in a compose site, so its SuperNode refuses to start requiring SecAgg+
    from deploy.fast_supernode import secagg_refusal

    def start(env: dict[str, str]) -> str | None:
        text = re.sub(
            r"\$\{(\w+)(:-([^}]*))?\}", lambda m: env.get(m.group(1), m.group(3) or ""), template
        )
        return secagg_refusal(["--node-config=" + text])

    assert "needs a roster" in str(start({"SITE": "h", "REQUIRE_SECURE_AGGREGATION": "true"}))
    assert start({"SITE": "h"}) is None
    assert doc["services"]["supernode"]["entrypoint"][-1] == "deploy.fast_supernode"
    # the site's SuperExec runs only the builds the operator approved: no default there
    superexec = doc["services"]["superexec-clientapp"]["command"]
    (approved,) = [a for a in superexec if a.startswith("--approved-apps=")]
    assert approved.startswith("--approved-apps=${APPROVED_APPS:?")


def test_superexec_image_carries_every_app_package() -> None:
    text = (DOCKER / "superexec.Dockerfile").read_text()
    project = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())
    for package in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        assert f"COPY {package} ./{package}" in text
    # that the Dockerfile's own .dockerignore keeps each COPY's source (deploy/ was once
    # left out) is checked for every image in test_compose_file_is_valid_against_flower_1_39


def _tools_without_docker(tmp_path: Path) -> Path:
    """A PATH with what scripts/docker_images.sh needs before docker, and no docker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sed", "head", "date", "dirname"):
        found = next(Path(d) / tool for d in ("/usr/bin", "/bin") if (Path(d) / tool).exists())
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def test_image_script_says_what_is_missing(tmp_path: Path) -> None:
    script = DOCKER.parent / "scripts" / "docker_images.sh"
    bin_dir = _tools_without_docker(tmp_path)
    run = functools.partial(
        subprocess.run, ["/bin/bash", str(script)], capture_output=True, text=True, timeout=60
    )
    out = run(env={"PATH": str(bin_dir)})
    assert out.returncode == 1
    assert out.stderr.strip() == "docker_images: 'docker' is missing (install Debian's docker.io)"
    # a docker client whose daemon does not answer
    fake = bin_dir / "docker"
    fake.write_text("#!/bin/bash\nexit 1\n")
    fake.chmod(0o755)
    out = run(env={"PATH": str(bin_dir)})
    assert out.returncode == 1
    assert out.stderr.strip() == "docker_images: no Docker daemon answers (start dockerd)"


def test_compose_test_says_what_is_missing(tmp_path: Path) -> None:
    """Without a container engine the end-to-end fails with one line; it never passes."""
    script = DOCKER.parent / "scripts" / "compose_test.sh"
    bin_dir = _tools_without_docker(tmp_path)
    out = subprocess.run(
        ["/bin/bash", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir)},
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "compose_test: FAILED: docker-compose is missing (Debian: apt-get install docker-compose)"
    )


def test_ci_container_stage_says_what_is_missing(tmp_path: Path) -> None:
    """CI's container stage installs or starts what is missing, or fails with one line."""
    script = DOCKER.parent / "scripts" / "compose_ci.sh"
    bin_dir = _tools_without_docker(tmp_path)
    for tool in ("id", "seq", "sleep", "tail", "tr"):
        found = next(Path(d) / tool for d in ("/usr/bin", "/bin") if (Path(d) / tool).exists())
        (bin_dir / tool).symlink_to(found)
    run = functools.partial(
        subprocess.run,
        ["/bin/bash", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "TMPDIR": str(tmp_path)},
    )
    root = os.geteuid() == 0
    out = run()  # no engine, and no apt-get here
    assert out.returncode == 1
    missing = "docker.io docker-compose debootstrap"
    assert out.stderr.strip() == "compose_ci: FAILED: " + (
        f"{missing} missing and no apt-get to install them"
        if root
        else f"needs root to install {missing} (or install them first)"
    )
    # the tools are here, no daemon answers, and the one it starts dies at once
    for tool, body in (
        ("dockerd", "echo 'failed to start daemon: no cgroups'; exit 1"),
        ("docker", "exit 1"),
        ("docker-compose", "exit 0"),
        ("debootstrap", "exit 0"),
    ):
        (bin_dir / tool).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    out = run()
    assert out.returncode == 1
    assert out.stderr.strip() == "compose_ci: FAILED: " + (
        "dockerd exited: failed to start daemon: no cgroups"
        if root
        else "no Docker daemon answers, and starting one needs root"
    )


def test_ci_container_stage_builds_only_the_image_when_asked(tmp_path: Path) -> None:
    """`compose_ci.sh images` (dev.sh test runs it beside the tests) builds the image and
    stops; without it the stage goes on to the compose end-to-end."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(DOCKER.parent / "scripts" / "compose_ci.sh", repo / "scripts")
    for step in ("docker_images", "compose_test"):
        (repo / "scripts" / f"{step}.sh").write_text(f"echo ran {step}\n")
    bin_dir = _tools_without_docker(tmp_path)
    (bin_dir / "bash").symlink_to("/bin/bash")
    for tool in ("dockerd", "docker", "docker-compose", "debootstrap"):  # a daemon answers
        (bin_dir / tool).write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    ran = {}
    for args in ([], ["images"]):
        out = subprocess.run(
            ["/bin/bash", str(repo / "scripts" / "compose_ci.sh"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": str(bin_dir)},
        )
        assert out.returncode == 0, out.stderr
        ran[" ".join(args)] = out.stdout.split()
    assert ran == {"": ["ran", "compose_test"], "images": ["ran", "docker_images"]}


def test_a_supernode_that_requires_secagg_without_a_roster_refuses_to_start() -> None:
    """#62: a compose site (its SuperNode started with a node config, not deploy.site)
    with require-secure-aggregation=true and no roster stops with one line; a roster,
    or the development opt-in, lets it start."""
    import subprocess

    from deploy.fast_supernode import secagg_refusal

    policy = 'site="a" data-path="/data" require-secure-aggregation="true" allowed-methods="all"'
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "deploy.fast_supernode", "--superlink=127.0.0.1:1",
         f"--node-config={policy}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("supernode: site policy 'require-secure-aggregation' needs a roster")
    assert secagg_refusal(["--node-config", policy + ' secagg-roster="/r.toml"']) is None
    assert secagg_refusal([f"--node-config={policy} secagg-unverified-keys=true"]) is None
    assert secagg_refusal(['--node-config=require-secure-aggregation="false"']) is None


def test_a_compose_site_requiring_secure_aggregation_starts_with_its_roster() -> None:
    """compose.client.secagg.yml: the base file's SuperNode command with the roster and
    the signing key added to its node config, and both mounted where the ClientApp (in
    the SuperExec) reads them; with it a site requiring SecAgg+ starts, without it not."""
    from flwr.common.config import parse_config_args

    from deploy.fast_supernode import secagg_refusal

    base = yaml.safe_load((DOCKER / "compose.client.yml").read_text())["services"]
    over = yaml.safe_load((DOCKER / "compose.client.secagg.yml").read_text())["services"]
    plain, secagg = base["supernode"]["command"], over["supernode"]["command"]
    added = ' secagg-roster="/app/certs/roster.toml" identity-key="/app/certs/keys/${SITE}"'
    assert [a for a in secagg if "--node-config=" not in a] == [
        a for a in plain if "--node-config=" not in a
    ]
    (node_plain,) = [a for a in plain if "--node-config=" in a]
    (node_secagg,) = [a for a in secagg if "--node-config=" in a]
    assert node_secagg == node_plain + added  # the same node config, two keys more

    def filled(arg: str, env: dict[str, str]) -> str:
        return re.sub(
            r"\$\{(\w+)(:-([^}]*))?\}", lambda m: env.get(m.group(1), m.group(3) or ""), arg
        )

    env = {"SITE": "hospital-a", "REQUIRE_SECURE_AGGREGATION": "true"}
    assert "needs a roster" in str(secagg_refusal([filled(node_plain, env)]))
    assert secagg_refusal([filled(node_secagg, env)]) is None
    node = parse_config_args([filled(node_secagg, env).removeprefix("--node-config=")])
    mounted = {
        filled(v.split(":")[-2], env) for v in over["superexec-clientapp"]["volumes"]
    }  # the targets, where the ClientApp reads them
    assert {node["secagg-roster"], node["identity-key"]} == mounted
    assert all(v.endswith(":ro") for v in over["superexec-clientapp"]["volumes"])


def _marked_flower142(path: Path) -> set[str]:
    """Names of the test functions in ``path`` marked flower142, on the function or on
    one of its parameters (pytest.param(..., marks=pytest.mark.flower142))."""
    import ast

    marker = "pytest.mark.flower142"
    return {
        node.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and any(marker in ast.unparse(d) for d in node.decorator_list)
    }


def test_flowers_142_job_runs_what_its_issue_asks_of_it() -> None:
    """scripts/flower142_ci.sh runs the slow tests marked flower142 with the fast ones:
    the main job through `flwr run`, a SecAgg+ round, a loopback deployment with TLS,
    authentication and a restart, the approved-app refusal (issue #64), a bare
    `flwr run .` on Flower's default federation (#95), and every marked file is one
    the script hands to pytest."""
    marked = {
        f.name: names
        for f in sorted((REPO / "tests").glob("test_*.py"))
        if (names := _marked_flower142(f))
    }
    assert marked == {
        "test_deployment.py": {
            "test_secure_supernode_restart_restores_personal_state",
            "test_secure_deployment_refuses_an_unregistered_supernode",
            "test_a_site_refuses_an_app_it_did_not_approve_before_running_any_of_it",
        },
        "test_federation_fit.py": {
            "test_a_bare_flwr_run_on_flowers_default_federation_is_refused_in_one_line"
        },
        "test_flwr_run.py": {"test_the_readme_main_job_runs_offline"},
        "test_secagg_protocol.py": {
            "test_a_deployed_secure_run_completes_with_signed_keys_and_an_outsider_is_refused"
        },
        "test_secure_aggregation.py": {"test_secure_runs_equal_plain_runs_up_to_quantization"},
        "test_site_launch.py": {"test_two_sites_train_on_their_own_folders_over_tls_with_auth"},
    }
    script = (REPO / "scripts" / "flower142_ci.sh").read_text()
    assert '-m "not slow or flower142"' in script
    # the files the script searches for: its own grep pattern, read from it
    searched = re.compile(re.search(r'"(\^.*)" tests/test_\*\.py', script)[1], re.M)
    for name in marked:
        found = searched.search((REPO / "tests" / name).read_text())
        assert found or f"tests/{name}::" in script, name
