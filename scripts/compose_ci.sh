#!/usr/bin/env bash
# CI's container stage (run by `bash scripts/dev.sh test` when CI=true or
# PFLOWER_COMPOSE_TEST=1): makes sure Debian's container engine is here, starts a
# Docker daemon if none answers (and stops that one, by its pid, on exit), then runs
# the compose end-to-end (scripts/compose_test.sh). What cannot be provided fails with
# one line saying what is missing; it never passes without running the containers.
# The image and the wheelhouse stay as the cache for the next run on this machine.
# `compose_ci.sh images` stops after the image (dev.sh test builds it beside the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "compose_ci: FAILED: $*" >&2; exit 1; }
say() { echo "compose_ci: $*"; }

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "needs root to install ${missing[*]} (or install them first)"
    command -v apt-get >/dev/null || fail "${missing[*]} missing and no apt-get to install them"
    say "installing ${missing[*]} from the distribution"
    t0=$(date +%s)
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || fail "apt-get update (is the Debian mirror reachable?)"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || fail "apt-get install ${missing[*]}"
    say "installed in $(($(date +%s) - t0)) s"
fi

started=""
stop_daemon() {
    if [ -n "$started" ]; then
        kill "$started" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$started" 2>/dev/null || break; sleep 1; done
    fi
}
trap stop_daemon EXIT
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "no Docker daemon answers, and starting one needs root"
    log="${TMPDIR:-/tmp}/pflower-dockerd.log"
    dockerd >"$log" 2>&1 &
    started=$!
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$started" 2>/dev/null || fail "dockerd exited: $(tail -3 "$log" | tr '\n' ' ')"
        sleep 1
    done
    docker info >/dev/null 2>&1 || fail "dockerd did not answer in 60 s ($log)"
    say "started dockerd (pid $started; stopped on exit)"
fi
if [ "${1:-}" = images ]; then
    bash scripts/docker_images.sh
    exit 0
fi
bash scripts/compose_test.sh
