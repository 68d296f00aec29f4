#!/usr/bin/env bash
# Set-up and the two everyday commands, on a fresh machine:
#   bash scripts/dev.sh run [flwr run options]   # the main job (offline, embedded default data)
#   bash scripts/dev.sh check [--run-config ...] # validate a run config in about a second
#   bash scripts/dev.sh test                     # lint, format check, import contracts, all tests;
#                                                # with CI=true also flwr 1.42's reduced job
#                                                # and the compose end-to-end
#   bash scripts/dev.sh images                   # the registry-free docker image (docs/DOCKER.md)
#   bash scripts/dev.sh compose-test [--timing]  # server + two sites in containers, end to end
# `run` and `check` exit 0 on success, 2 on a bad config, 1 on a failed run.
#
# The Flower line: PFLOWER_FLOWER=1.39 (the default: gRPC Fleet) or 1.42 (HTTP Fleet),
# each in its own environment (.venv, .venv-flwr142) pinned by its constraints file
# (docs/FLOWER_VERSIONS.md). PFLOWER_FLOWER_BASE=<a 1.39 venv> makes the 1.42 one a
# thin layer over it: the four packages that differ installed on top (CI does this).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${PFLOWER_FLOWER:-1.39}" in
    1.39) VENV="${VENV:-.venv}" CONSTRAINTS=constraints.txt ;;
    1.42) VENV="${VENV:-.venv-flwr142}" CONSTRAINTS=constraints-flwr142.txt ;;
    *) echo "dev.sh: PFLOWER_FLOWER=${PFLOWER_FLOWER} is not a supported Flower line (1.39, 1.42)" >&2; exit 2 ;;
esac

# the 1.42 environment as a layer over a 1.39 one: its site-packages (and the
# project's editable install) under the layer's own, which holds flwr 1.42 and the
# three packages whose pins differ (constraints-flwr142.txt)
layer_over() {
    local base site
    base="$(cd "$1" && pwd)"
    python3 -m venv "$VENV"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$base/bin/python" -c "import sysconfig; print('import site; site.addsitedir(%r)' % sysconfig.get_paths()['purelib'])" \
        > "$site/pflower-base-env.pth"
    "$VENV/bin/pip" install -q --no-deps -c "$CONSTRAINTS" flwr certifi cryptography uv
    touch "$VENV/.installed"
}

setup() {
    [ "${PFLOWER_SKIP_SETUP:-}" = 1 ] && return 0  # the environment is ready (tests)
    if [ -n "${PFLOWER_FLOWER_BASE:-}" ] && [ ! -x "$VENV/bin/python" ]; then
        layer_over "$PFLOWER_FLOWER_BASE"
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    # find_spec, not import: importing torch alone takes seconds, and `check` must not
    if ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None \
            for m in ('flwr', 'torch', 'torchvision', 'pflower.data', 'pflower.cli')))" 2>/dev/null \
        || { [ -z "${PFLOWER_FLOWER_BASE:-}" ] && { [ pyproject.toml -nt "$VENV/.installed" ] \
            || [ "$CONSTRAINTS" -nt "$VENV/.installed" ]; }; }; then
        "$VENV/bin/pip" install -q --upgrade pip
        "$VENV/bin/pip" install -q -e ".[dev]" -c "$CONSTRAINTS"  # the tested versions
        touch "$VENV/.installed"
    fi
    # Flower's warnings a user cannot act on, dropped in the processes that log them
    # (Flower's simulation, Ray's workers) by a start-up line: pflower/flower_notes.py
    "$VENV/bin/python" -m pflower.flower_notes >/dev/null
}

# flwr starts `flower-superlink` and `flower-supernode` by name: the venv's
# bin/ must be on PATH even when the venv is not activated (CI).
use_venv_path() {
    case "$VENV" in /*) export PATH="$VENV/bin:$PATH" ;; *) export PATH="$PWD/$VENV/bin:$PATH" ;; esac
    # the scripts started from here (docker_images.sh, compose_test.sh) use this line's
    export PYTHON="${PYTHON:-$(cd "$VENV/bin" && pwd)/python}"
}

case "${1:-}" in
    run)
        shift
        setup
        # flwr 1.39 would otherwise install the app's dependencies into a fresh
        # environment per run (needs the internet); this environment already has them.
        export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
        # no usage events to Flower's telemetry server (the run, its local SuperLink)
        export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
        # flwr keeps its SuperLink connections (federation size, client resources)
        # in $FLWR_HOME/config.toml: start from the project's.
        export FLWR_HOME="${FLWR_HOME:-$PWD/.flwr}"
        if [ ! -f "$FLWR_HOME/config.toml" ] || [ scripts/flower-config.toml -nt "$FLWR_HOME/config.toml" ]; then
            mkdir -p "$FLWR_HOME"
            cp scripts/flower-config.toml "$FLWR_HOME/config.toml"
        fi
        use_venv_path
        # pre-flight, `flwr run . --stream`, then the exit status from the run's results
        exec "$VENV/bin/python" -m pflower.cli run "$@"
        ;;
    check)
        shift
        setup
        exec "$VENV/bin/python" -m pflower.cli check "$@"
        ;;
    test)
        shift
        setup
        use_venv_path
        # the tests read the shared data (the CIFAR-10 dev set, Fed-Heart-Disease): one
        # line naming what is missing, not a failure in every test that reads it
        "$VENV/bin/python" -c "from benchmarks.presets import require_shared_data as r; r()"
        # the container stage's image is built beside the tests (3.4 minutes alone; beside
        # them pytest took no longer: docs/USAGE.md), its log shown after them
        images_pid="" images_log=""
        if [ "${CI:-}" = true ] || [ "${PFLOWER_COMPOSE_TEST:-}" = 1 ]; then
            images_log="$(mktemp "${TMPDIR:-/tmp}/pflower-images.XXXXXX")"
            bash scripts/compose_ci.sh images >"$images_log" 2>&1 &
            images_pid=$!
        fi
        # and the second Flower line's reduced job (flwr 1.42, a layer over this venv), on
        # one worker: alone it left half the 2 cores idle; beside the suite it fills them
        # (the suite takes longer, the whole less: docs/notes/2026-12-06-where-the-test-
        # commands-time-goes.md)
        flwr142_pid="" flwr142_log=""
        if [ "${PFLOWER_FLOWER:-1.39}" = 1.39 ] && { [ "${CI:-}" = true ] || [ "${PFLOWER_FLOWER142_TEST:-}" = 1 ]; }; then
            flwr142_log="$(mktemp "${TMPDIR:-/tmp}/pflower-flwr142.XXXXXX")"
            PFLOWER_FLOWER_BASE="$VENV" PFLOWER_TEST_WORKERS="${PFLOWER_FLOWER142_WORKERS:-1}" \
                bash scripts/flower142_ci.sh >"$flwr142_log" 2>&1 &
            flwr142_pid=$!
        fi
        # a failed test ends this script: the jobs beside it finish first (the image's
        # build stops its daemon; the 1.42 job's log, not printed yet, is), logs removed
        trap 'for p in $images_pid $flwr142_pid; do wait "$p" 2>/dev/null || true; done
              [ -n "$flwr142_log" ] && [ -f "$flwr142_log" ] && cat "$flwr142_log"
              rm -f $images_log $flwr142_log' EXIT
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        "$VENV/bin/lint-imports"  # the directions of dependency (pyproject.toml)
        # two workers, a test file each at a time (pytest-xdist; a file's module fixtures
        # start once): much of the suite waits on processes it starts, so two overlap
        # on CI's 2 cores. PFLOWER_TEST_WORKERS=0 runs it in this process, one by one
        "$VENV/bin/python" -m pytest -q -rs --durations=40 \
            -n "${PFLOWER_TEST_WORKERS:-2}" --dist loadfile "$@"  # the slowest 40 named
        # then the 1.42 job's result
        if [ -n "$flwr142_pid" ]; then
            if wait "$flwr142_pid"; then flwr142_status=passed; else flwr142_status=FAILED; fi
            echo "dev.sh: flwr 1.42's reduced job, run beside the tests: $flwr142_status"
            cat "$flwr142_log" && rm -f "$flwr142_log"
            [ "$flwr142_status" = passed ] || exit 1
        fi
        # then the deployment in containers (root, Docker; installs Debian's if missing)
        if [ -n "$images_pid" ]; then
            if wait "$images_pid"; then images_status=built; else images_status="failed (retried below)"; fi
            trap - EXIT
            echo "dev.sh: the container image, built beside the tests: $images_status"
            cat "$images_log" && rm -f "$images_log"
            exec bash scripts/compose_ci.sh  # on this line (PFLOWER_FLOWER)
        fi
        echo "dev.sh: the compose end-to-end did not run (CI=true or PFLOWER_COMPOSE_TEST=1 runs it)"
        ;;
    images)
        shift
        setup
        use_venv_path
        exec bash scripts/docker_images.sh "$@"
        ;;
    compose-test)
        shift
        setup
        use_venv_path
        exec bash scripts/compose_test.sh "$@"
        ;;
    *)
        echo "usage: bash scripts/dev.sh run|check|test|images|compose-test [args]" >&2
        exit 2
        ;;
esac
