#!/usr/bin/env bash
# The multi-machine deployment end to end, in containers: builds the registry-free
# image (scripts/docker_images.sh), makes the demo PKI, brings up the server compose
# file and two site compose stacks (separate projects, networks and state volumes; each
# site's own CIFAR-10 images mounted read-only), registers the sites' keys, submits 5
# rounds of FedPer with `flwr run` from this host over TLS, restarts site-a's stack
# mid-run, and checks: the run finished, every site has an accuracy, each site's
# personal state is in its own volume only, site-a resumed its tensors, an unregistered
# site was refused. Everything it started is removed on exit (not the images: they are
# the cache for the next run; PFLOWER_REMOVE_IMAGES=1 removes them too).
#   bash scripts/dev.sh compose-test [--timing]   (or this script directly, as root)
# --timing: then the same 5 rounds again in the containers, undisturbed, and on loopback
# processes (a SuperLink and two `python -m deploy.site` sites on the same folders, TLS
# and authentication), one after the other; prints the seconds per round of both.
# PFLOWER_FLOWER=1.42: the same on flwr 1.42 (its image pflower/app:<version>-flwr142,
# the sites dialing the SuperLink's HTTP port, the CLI of .venv-flwr142 or VENV142).
set -euo pipefail
TIMING=0
case "${1:-}" in
    --timing) TIMING=1 ;;
    "") ;;
    *) echo "usage: compose_test.sh [--timing]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
REPO=$PWD
case "${PFLOWER_FLOWER:-1.39}" in
    1.39) PY="${PYTHON:-$REPO/.venv/bin/python}" TAG_SUFFIX="" ;;
    1.42) PY="${PYTHON:-${VENV142:-$REPO/.venv-flwr142}/bin/python}" TAG_SUFFIX="-flwr142" ;;
    *) echo "compose_test: PFLOWER_FLOWER=$PFLOWER_FLOWER is not a supported Flower line" >&2; exit 2 ;;
esac
export PYTHON="$PY"  # docker_images.sh's too
fail() { echo "compose_test: FAILED: $*" >&2; exit 1; }
say() { echo "compose_test: $*"; }
command -v docker-compose >/dev/null || fail "docker-compose is missing (Debian: apt-get install docker-compose)"
command -v docker >/dev/null || fail "docker is missing (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || fail "no Docker daemon answers (start dockerd)"
[ "$(id -u)" = 0 ] || fail "run as root: the certificates and outputs must belong to the images' user (uid 49999)"
DEV_DATA="${PFLOWER_DEV_DATA:-$REPO/../shared/data/cifar10-dev-12k.parquet}"
[ -f "$DEV_DATA" ] || fail "no CIFAR-10 dev data at $DEV_DATA (set PFLOWER_DEV_DATA)"

t_start=$(date +%s)
bash scripts/docker_images.sh
t_images=$(date +%s)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)$TAG_SUFFIX
export PFLOWER_SUPERLINK_IMAGE="pflower/app:$VERSION" PFLOWER_SUPERNODE_IMAGE="pflower/app:$VERSION" \
    PFLOWER_SUPEREXEC_IMAGE="pflower/app:$VERSION"
# where the sites dial: the gRPC Fleet port (1.39) or the SuperLink's HTTP port (1.42),
# which the server compose file then binds beyond 127.0.0.1 for them
FLEET_PORT=$("$PY" -c "from pflower.flower_lines import default_fleet_port as p; print(p())")
[ "$FLEET_PORT" = 8000 ] && export HTTP_API_BIND=0.0.0.0
W=$(mktemp -d /var/tmp/pflower-compose.XXXXXX)
P="pflct$$"  # compose project prefix, unique to this run
SITES=(site-a site-b)
compose_server() { docker-compose -p "$P-server" -f "$W/server/compose.server.yml" "$@"; }
compose_site() {  # SITE ARGS...: a site's stack, with its own data, certificates and volume
    local site=$1; shift
    SITE=$site SUPERLINK="host.docker.internal:$FLEET_PORT" DATA_DIR="$W/data/$site" \
        CERTS_DIR="$W/$site/certs" docker-compose -p "$P-$site" -f "$W/compose.client.yml" "$@"
}
cleanup() {
    for site in "${SITES[@]}" site-x; do compose_site "$site" down -v >/dev/null 2>&1 || true; done
    compose_server down -v >/dev/null 2>&1 || true
    if [ "${PFLOWER_REMOVE_IMAGES:-}" = 1 ]; then
        docker image rm "pflower/app:$VERSION" pflower/base:bookworm >/dev/null 2>&1 || true
    fi
    rm -rf "$W"
}
trap cleanup EXIT

say "PKI, data and compose files under $W"
mkdir -p "$W/server/outputs" "$W/data" "$W/cli"
bash deploy/make_certs.sh "$W/server/certs" host.docker.internal superlink --nodes site-a,site-b,site-x >/dev/null
for site in "${SITES[@]}" site-x; do  # what a site receives: the CA, its key; its own secret
    mkdir -p "$W/$site/certs/keys"
    cp "$W/server/certs/ca.crt" "$W/$site/certs/"
    cp "$W/server/certs/keys/$site" "$W/server/certs/keys/$site.pub" "$W/$site/certs/keys/"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/$site/certs/superexec.secret"
done
"$PY" - "$DEV_DATA" "$W/data" <<'EOF'
"""Image folders (one sub-folder a class): 300 images per site, 20 for the server."""
import io
import sys
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

table = pq.read_table(sys.argv[1])
images, labels = table.column("img").to_pylist(), table.column("label").to_pylist()
names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
for folder, rows in (("site-a", range(0, 300)), ("site-b", range(300, 600)),
                     ("site-x", range(600, 700)), ("reference", range(700, 720))):
    for i in rows:
        out = Path(sys.argv[2]) / folder / names[labels[i]]
        out.mkdir(parents=True, exist_ok=True)
        Image.open(io.BytesIO(images[i]["bytes"])).save(out / f"{i}.png")
EOF
cp docker/compose.server.yml "$W/server/" && cp docker/compose.client.yml "$W/"
mv "$W/data/reference" "$W/server/reference"
chown -R 49999:49999 "$W/server" "$W"/site-*/certs
cat >"$W/cli/config.toml" <<EOF
[superlink]
default = "compose"
[superlink.compose]
address = "127.0.0.1:8000"
root-certificates = "$W/server/certs/ca.crt"
EOF
flwr() { FLWR_HOME="$W/cli" FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 "$(dirname "$PY")/flwr" "$@"; }
wait_for() {  # SECONDS WHAT COMMAND...: poll until the command succeeds
    local limit=$1 what=$2; shift 2
    local deadline=$(($(date +%s) + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${limit}s waiting for $what"
        sleep 2
    done
}

say "server up"
compose_server up -d --no-build
# grep reads the whole log (grep -q would stop early, and pipefail would then see
# docker-compose's SIGPIPE as a failure)
server_log() { compose_server logs "$1" 2>/dev/null | grep -- "$2" >/dev/null; }
site_log() { compose_site "$1" logs "$2" 2>/dev/null | grep -- "$3" >/dev/null; }
wait_for 120 "the SuperLink" server_log superlink "Uvicorn running"
for site in "${SITES[@]}"; do
    flwr supernode register "$W/server/certs/keys/$site.pub" compose --format json | grep '"success": true' >/dev/null \
        || fail "registering $site"
done
# the build each site approves: this tree, as `flwr run "$REPO"` submits it
APPROVED_APPS=$("$PY" -m deploy.site --print-app-hash)
export APPROVED_APPS
say "sites up (site-x's key is not registered), approving $APPROVED_APPS"
for site in "${SITES[@]}" site-x; do compose_site "$site" up -d --no-build; done
t_up=$(date +%s)
for site in "${SITES[@]}"; do
    wait_for 180 "$site's SuperNode" site_log "$site" supernode "SuperNode ID"
done
healthy() {  # PROJECT SERVICE: the service's container passes its health check
    local id
    id=$(docker ps -q --filter "label=com.docker.compose.project=$1" --filter "label=com.docker.compose.service=$2")
    [ -n "$id" ] && [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ]
}
wait_for 60 "the SuperLink's health check" healthy "$P-server" superlink
for site in "${SITES[@]}"; do
    wait_for 60 "$site's SuperNode health check" healthy "$P-$site" supernode
done

say "secrets: each container holds only what it needs; telemetry off"
container() { docker ps -q --filter "label=com.docker.compose.project=$1" --filter "label=com.docker.compose.service=$2"; }
files_in() { docker exec "$(container "$1" "$2")" find /app/certs -type f | sort | tr '\n' ' '; }
mounted() { docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' "$(container "$1" "$2")"; }
got=$(files_in "$P-server" superexec-serverapp)
[ "$got" = "/app/certs/ca.crt /app/certs/superexec.secret " ] || fail "the ServerApp container holds: $got"
! mounted "$P-server" superexec-serverapp | grep -E 'ca\.key|/keys/' >/dev/null \
    || fail "the ServerApp container mounts a private key: $(mounted "$P-server" superexec-serverapp)"
! files_in "$P-server" superlink | grep -E 'ca\.key|/keys/' >/dev/null || fail "the SuperLink holds a CA or site key"
for site in "${SITES[@]}"; do
    got=$(files_in "$P-$site" superexec-clientapp)
    [ "$got" = "/app/certs/superexec.secret " ] || fail "$site's ClientApp container holds: $got"
done
secrets=$(for d in server "${SITES[@]}"; do sha256sum <"$W/$d/certs/superexec.secret"; done | sort -u | wc -l)
[ "$secrets" = $((1 + ${#SITES[@]})) ] || fail "the server and the sites do not each have their own SuperExec secret"
for pair in "$P-server superlink" "$P-server superexec-serverapp" "$P-site-a supernode" "$P-site-a superexec-clientapp"; do
    # shellcheck disable=SC2086
    [ "$(docker exec "$(container $pair)" printenv FLWR_TELEMETRY_ENABLED)" = 0 ] || fail "telemetry is on in $pair"
done
say "checked: the ServerApp holds only ca.crt and its secret, each ClientApp only its site's secret, secrets differ, telemetry off"

say "flwr run: FedPer, 5 rounds, 2 sites"
cat >"$W/cli/run.toml" <<EOF
method = "fedper"
model = "cnn4"
dataset = "/app/reference"
num-server-rounds = 5
min-available-clients = 2
output-dir = "/app/outputs"
run-name = "compose"
EOF
t_run=$(date +%s)
flwr run "$REPO" compose --run-config "$W/cli/run.toml" --format json | grep '"success": true' >/dev/null \
    || fail "flwr run was refused"
state_file() {  # SITE: the site's personal state file, read from its own volume
    docker run --rm -v "$P-$1_state:/state:ro" "pflower/app:$VERSION" test -f "/state/compose/$1.npz"
}
wait_for 600 "site-a's first personal state" state_file site-a
run_status() { flwr list --format json | "$PY" -c "import json, sys; print(json.load(sys.stdin)['runs'][0]['status'])"; }
[ "$(run_status)" = running ] || fail "the run was $(run_status) before site-a's restart could be tested"
say "restarting site-a's containers mid-run (min-available-clients=2: the rounds wait for it)"
compose_site site-a restart
t_restart=$(date +%s)
finished() { run_status | grep '^finished' >/dev/null; }
wait_for 900 "the run to finish" finished
t_done=$(date +%s)
[ "$(run_status)" = "finished:completed" ] || fail "the run ended as $(run_status)"

say "checks"
"$PY" - "$W/server/outputs/compose/results.json" <<'EOF' || fail "results.json"
import json
import sys

res = json.load(open(sys.argv[1]))
rounds = res["rounds"]
assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5], [r["round"] for r in rounds]
assert sorted(rounds[-1]["per_client_accuracy"]) == ["site-a", "site-b"], rounds[-1]
print("compose_test: accuracy per site, round 5:", rounds[-1]["per_client_accuracy"])
EOF
for site in "${SITES[@]}"; do
    state_file "$site" || fail "$site's state is not in its own volume"
done
other() { [ "$1" = site-a ] && echo site-b || echo site-a; }
for site in "${SITES[@]}"; do  # nowhere else: not in the other site's volume, not on the server
    ! docker run --rm -v "$P-$(other "$site")_state:/state:ro" "pflower/app:$VERSION" \
        test -f "/state/compose/$site.npz" || fail "$site's state is in $(other "$site")'s volume"
    [ -z "$(find "$W/server" -name "$site.npz")" ] || fail "$site's state is on the server"
done
if ! site_log site-a superexec-clientapp "restored personal state"; then
    compose_site site-a logs --tail 30 2>&1 | cut -c1-200 >&2
    fail "site-a did not restore its personal state after the restart"
fi
server_log superlink "No SuperNode found with the given public key" \
    || fail "the SuperLink did not refuse site-x"
! site_log site-x supernode "SuperNode ID" || fail "site-x was let in"
say "passed: images $((t_images - t_start)) s, stack up $((t_run - t_up)) s (after images and PKI), run $((t_done - t_run)) s for 5 rounds (site-a restarted at +$((t_restart - t_run)) s)"

[ "$TIMING" = 1 ] || exit 0

say "timing: the same 5 rounds in the containers (no restart), then on loopback processes"
compose_site site-x down -v >/dev/null 2>&1 || true  # refused, it restarts in a loop: CPU
sed -i 's/^run-name = .*/run-name = "compose-timing"/' "$W/cli/run.toml"
echo "log-phases = true" >>"$W/cli/run.toml"  # where each ClientApp message's time goes
flwr run "$REPO" compose --run-config "$W/cli/run.toml" --format json | grep '"success": true' >/dev/null \
    || fail "flwr run (timing) was refused"
timing_done() { flwr list --format json | "$PY" -c "import json, sys; r = json.load(sys.stdin)['runs']; \
sys.exit(not all(x['status'].startswith('finished') for x in r))"; }
wait_for 900 "the timing run to finish" timing_done
cp "$W/server/outputs/compose-timing/results.json" "$W/containers.json"
for site in "${SITES[@]}"; do
    compose_site "$site" logs --no-color superexec-clientapp 2>/dev/null | grep -o "pflower-phases .*" || true
done >"$W/containers-phases.txt"
compose_site site-a down -v >/dev/null 2>&1 || true  # the cores go to the loopback run
compose_site site-b down -v >/dev/null 2>&1 || true
compose_server down -v >/dev/null 2>&1 || true
(cd "$REPO" && "$PY" - "$W" <<'EOF') || fail "the loopback timing run"
"""The same run on loopback processes: SuperLink (process isolation, TLS, node
authentication) and two sites launched with `python -m deploy.site` on the same folders."""
import json
import statistics
import sys
from pathlib import Path

from client_app.timing import median_phases
from harness.loopback import LoopbackFederation

w = Path(sys.argv[1])
sites = ["site-a", "site-b"]
with LoopbackFederation(w / "loopback", tls=True, auth=True, isolation="process") as fed:
    fed.make_certs(sites)
    fed.start_superlink()
    for site in sites:
        fed.register(site)
        fed.start_site(site, w / "data" / site)
    for site, proc in fed.nodes.items():
        fed.wait_for(lambda p=proc: "SuperNode ID" in p.text(), 180, site, proc)
    config = {
        "method": "fedper", "model": "cnn4", "dataset": str(w / "server" / "reference"),
        "num-server-rounds": 5, "min-available-clients": 2,
        "output-dir": str(w / "loopback-out"), "run-name": "loopback", "log-phases": True,
    }
    status = fed.wait_run(fed.run(config), 900)
    assert status == "finished:completed", status + fed.tail()
    loopback_logs = [ln for proc in fed.procs for ln in proc.text().splitlines()]
phases = {
    "containers": median_phases((w / "containers-phases.txt").read_text().splitlines()),
    "loopback processes": median_phases(loopback_logs),
}
runs = {
    "containers": json.loads((w / "containers.json").read_text()),
    "loopback processes": json.loads((w / "loopback-out/loopback/results.json").read_text()),
}
for name, res in runs.items():
    seconds = [r["seconds"] for r in res["rounds"]]
    print(
        f"compose_test: timing, {name}: median {statistics.median(seconds[1:]):.2f} s a round "
        f"after round 1 (rounds: {', '.join(f'{s:.2f}' for s in seconds)})"
    )
    median = dict(phases[name])
    count = median.pop("messages")
    print(
        f"compose_test: timing, {name}: median ClientApp message over {count}: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in median.items())
    )
EOF
