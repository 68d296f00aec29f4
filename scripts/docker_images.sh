#!/usr/bin/env bash
# Build the registry-free image pflower/app:<version> (docker/app.Dockerfile):
#   1. a base image from Debian's packages (debootstrap + docker import), unless
#      BASE_IMAGE names one the daemon already has (any Debian-like image with
#      python3 >= 3.11 and venv);
#   2. the wheelhouse (PFLOWER_WHEELHOUSE, default ~/.cache/pflower/wheelhouse, kept
#      between clones): every Python package the app needs at the tested versions
#      (constraints.txt), from the package index this machine can reach; an
#      air-gapped site copies this folder instead (docs/DOCKER.md);
#   3. docker build with the wheelhouse mounted (no index, no registry).
# Each step is skipped when its output exists for the same inputs.
# PFLOWER_FLOWER=1.42 builds pflower/app:<version>-flwr142 from constraints-flwr142.txt
# (its own wheelhouse, seeded with links to the 1.39 one's wheels: four pins differ).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
BASE_IMAGE="${BASE_IMAGE:-pflower/base:bookworm}"
PY="${PYTHON:-.venv/bin/python}"
WORK="${PFLOWER_DOCKER_WORK:-/var/tmp/pflower-docker}"
WHEELS="${PFLOWER_WHEELHOUSE:-${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/pflower/wheelhouse}"
case "${PFLOWER_FLOWER:-1.39}" in
    1.39) CONSTRAINTS=constraints.txt TAG="$VERSION" ;;
    1.42) CONSTRAINTS=constraints-flwr142.txt TAG="$VERSION-flwr142" SEED="$WHEELS" WHEELS="$WHEELS-flwr142" ;;
    *) echo "docker_images: PFLOWER_FLOWER=$PFLOWER_FLOWER is not a supported Flower line (1.39, 1.42)" >&2; exit 2 ;;
esac
APP_IMAGE="${APP_IMAGE:-pflower/app:$TAG}"

need() { command -v "$1" >/dev/null || { echo "docker_images: '$1' is missing ($2)" >&2; exit 1; }; }
need docker "install Debian's docker.io"
docker info >/dev/null 2>&1 || { echo "docker_images: no Docker daemon answers (start dockerd)" >&2; exit 1; }

t0=$(date +%s)
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    [ "$BASE_IMAGE" = pflower/base:bookworm ] || { echo "docker_images: base image $BASE_IMAGE is not here" >&2; exit 1; }
    need debootstrap "install Debian's debootstrap, or set BASE_IMAGE to an image you have"
    rm -rf "$WORK/rootfs" && mkdir -p "$WORK"
    echo "docker_images: debootstrap bookworm (python3, venv) into $WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$WORK/rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log"
    rm -rf "$WORK/rootfs"/var/cache/apt/archives/*.deb "$WORK/rootfs"/var/lib/apt/lists/*
    tar -C "$WORK/rootfs" -c . | docker import - "$BASE_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
fi
t1=$(date +%s)
# the wheelhouse's inputs, by content (a fresh clone's files are all new by mtime):
# the pins and the project's dependencies, not the rest of pyproject.toml
inputs=$({ cat "$CONSTRAINTS"; "$PY" -c "import json, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(json.dumps([p.get(k) for k in ('requires-python', 'dependencies', 'optional-dependencies')]))"; } \
    | sha256sum | cut -d' ' -f1)
if [ "$(cat "$WHEELS/.complete" 2>/dev/null)" != "$inputs" ]; then
    echo "docker_images: filling $WHEELS ($CONSTRAINTS)"
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    if [ -n "${SEED:-}" ] && [ -d "$SEED" ]; then  # pip keeps a wheel already there
        cp -l "$SEED"/*.whl "$WHEELS"/ 2>/dev/null || cp "$SEED"/*.whl "$WHEELS"/
        # less the wheels of the packages whose pins differ between the two lines
        for pin in $(diff <(grep -v '^#' constraints.txt) <(grep -v '^#' "$CONSTRAINTS") | sed -n 's/^< //p'); do
            name=$(echo "${pin%%==*}" | tr '.-' '__') version=${pin#*==}
            rm -f "$WHEELS/$name-$version-"*.whl
        done
    fi
    "$PY" -m pip download -q -d "$WHEELS" -c "$CONSTRAINTS" . hatchling 2>&1 \
        | grep -v "is ignored: it is neither" || true
    [ -n "$(ls "$WHEELS"/torch-*.whl 2>/dev/null)" ] || { echo "docker_images: pip download failed" >&2; exit 1; }
    echo "$inputs" >"$WHEELS/.complete"
fi
t2=$(date +%s)
echo "docker_images: building $APP_IMAGE on $BASE_IMAGE"
# the build context: the app's packages (those the wheel carries) and its pins
ctx="$WORK/context" && rm -rf "$ctx" && mkdir -p "$ctx/app"
packages=$("$PY" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['hatch']['build']['targets']['wheel']['packages']))")
cp "$CONSTRAINTS" "$ctx/constraints.txt"
"$PY" scripts/wheel_hashes.py "$WHEELS" >"$ctx/wheel-hashes.txt"  # what the build may install
cp pyproject.toml README.md "$ctx/app/"
for pkg in $packages; do cp -r "$pkg" "$ctx/app/"; done
find "$ctx/app" -name __pycache__ -prune -exec rm -rf {} +
# the wheelhouse, served on the Docker bridge for the build only (stopped by its pid)
bridge=$(docker network inspect bridge --format '{{(index .IPAM.Config 0).Gateway}}')
if [ -z "$bridge" ]; then
    # a daemon's first start leaves the default bridge's IPAM without its gateway: read
    # the bridge interface's own address instead
    ifname=$(docker network inspect bridge --format '{{index .Options "com.docker.network.bridge.name"}}')
    bridge=$(ip -4 -o addr show dev "${ifname:-docker0}" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)
fi
[ -n "$bridge" ] || { echo "docker_images: no address found for Docker's default bridge" >&2; exit 1; }
# a fixed port: the URL is a build argument, and a new value would rebuild every layer
port="${PFLOWER_WHEELS_PORT:-38419}"
"$PY" -m http.server --bind "$bridge" --directory "$WHEELS" "$port" >"$WORK/wheels-http.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
# the server on that port must be this one (a failed bind would leave another's there)
served=""
for _ in $(seq 50); do
    kill -0 "$server" 2>/dev/null || break
    served=$("$PY" -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=2).read().decode().strip())" \
        "http://$bridge:$port/.complete" 2>/dev/null) && break
    sleep 0.1
done
if ! kill -0 "$server" 2>/dev/null || [ "$served" != "$inputs" ]; then
    echo "docker_images: could not serve the wheelhouse on $bridge:$port (port in use? set" \
        "PFLOWER_WHEELS_PORT): $(tail -1 "$WORK/wheels-http.log" 2>/dev/null)" >&2
    exit 1
fi
previous=$(docker image inspect -f '{{.Id}}' "$APP_IMAGE" 2>/dev/null || true)
DOCKER_BUILDKIT=0 docker build -q -f docker/app.Dockerfile --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "WHEELS_URL=http://$bridge:$port/" --build-arg "WHEELS_HOST=$bridge" \
    -t "$APP_IMAGE" "$ctx" >/dev/null
kill $server 2>/dev/null || true
rm -rf "$ctx"
# the image this build replaced, if nothing else uses it
current=$(docker image inspect -f '{{.Id}}' "$APP_IMAGE")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    docker image rm "$previous" >/dev/null 2>&1 || true
fi
t3=$(date +%s)
echo "docker_images: $APP_IMAGE ready (base $((t1 - t0)) s, wheelhouse $((t2 - t1)) s, build $((t3 - t2)) s)"
