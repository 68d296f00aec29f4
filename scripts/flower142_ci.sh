#!/usr/bin/env bash
# CI's reduced job on the second Flower line, flwr 1.42 (issue #64): this checkout in
# a 1.42 environment made as a layer over the 1.39 one (scripts/dev.sh,
# PFLOWER_FLOWER_BASE), then the fast tests of every test file that reaches Flower,
# one SecAgg+ round (secure against plain, in Flower's simulation), the README's main
# job through `flwr run`, a bare `flwr run .` on Flower's own default federation (2
# SuperNodes) refused where the data have 4 sites, and loopback deployments over
# 1.42's HTTP Fleet: three sites with TLS and SuperNode authentication, one restarted
# (its personal state restored), an unregistered node refused, SecAgg+ between three
# roster sites with signed keys, a modified app refused by hash at every site, and
# two sites started by deploy.site on their own folders.
set -euo pipefail
cd "$(dirname "$0")/.."
export PFLOWER_FLOWER=1.42 PFLOWER_FLOWER_BASE="${PFLOWER_FLOWER_BASE:-.venv}"
export VENV="${VENV142:-.venv-flwr142}"
bash scripts/dev.sh check >/dev/null  # makes the layer, then validates the default config
"$VENV/bin/python" -c 'import sys; from importlib.metadata import version
found = version("flwr"); sys.exit(0 if found.startswith("1.42.") else "flwr " + found)'
case "$VENV" in /*) bin="$VENV/bin" ;; *) bin="$PWD/$VENV/bin" ;; esac
export PATH="$bin:$PATH"  # flwr's own commands: 1.42's
# the tests that reach Flower (the rest is the same code on both lines, run by the
# 1.39 suite): a file that imports it, asks which line is installed, or starts a
# loopback deployment; their fast tests and the slow ones marked flower142, in one
# pytest (dev.sh test runs it on one worker, beside the 1.39 suite)
mapfile -t flower_tests < <(grep -l -E \
    "^\s*(import|from) (flwr|pflower\.flower_lines)|LoopbackFederation" tests/test_*.py)
marked=(  # files with a flower142 test that the search above does not find
    tests/test_secure_aggregation.py::test_secure_runs_equal_plain_runs_up_to_quantization
    tests/test_flwr_run.py::test_the_readme_main_job_runs_offline
)
workers=(-n "${PFLOWER_TEST_WORKERS:-2}" --dist loadfile)  # as dev.sh test
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${workers[@]}" \
    -m "not slow or flower142" "${flower_tests[@]}" "${marked[@]}" "$@"
echo "flwr 1.42: the reduced job passed"
