#!/usr/bin/env bash
# CI's reduced job on the second Flower line, flwr 1.42 (issue #64): this checkout in
# a 1.42 environment made as a layer over the 1.39 one (scripts/dev.sh,
# PFLOWER_FLOWER_BASE), then the fast suite, one SecAgg+ round (secure against plain,
# in Flower's simulation) and the README's main job through `flwr run`.
# Not yet on 1.42: a deployment (HTTP Fleet; docs/FLOWER_VERSIONS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PFLOWER_FLOWER=1.42 PFLOWER_FLOWER_BASE="${PFLOWER_FLOWER_BASE:-.venv}"
export VENV="${VENV142:-.venv-flwr142}"
bash scripts/dev.sh check >/dev/null  # makes the layer, then validates the default config
"$VENV/bin/python" -c 'import sys; from importlib.metadata import version
found = version("flwr"); sys.exit(0 if found.startswith("1.42.") else "flwr " + found)'
case "$VENV" in /*) bin="$VENV/bin" ;; *) bin="$PWD/$VENV/bin" ;; esac
export PATH="$bin:$PATH"  # flwr's own commands: 1.42's
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" "$@"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    "tests/test_secure_aggregation.py::test_secure_runs_equal_plain_runs_up_to_quantization[fedavg]" \
    tests/test_flwr_run.py::test_the_readme_main_job_runs_offline
echo "flwr 1.42: the reduced job passed"
