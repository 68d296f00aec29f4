#!/usr/bin/env bash
# The GPU kit (benchmarks/gpu_kit.py; docs/PERFORMANCE.md, "On a lent GPU"):
#   bash scripts/gpu_kit.sh prepare          # here: wheels into .whl/, data into .gpu-kit/, sizes
#   bash scripts/gpu_kit.sh device [PRESET...] [--seconds N]   # on the device machine
#   bash scripts/gpu_kit.sh dry-run [PRESET...]                # here: device's steps, CPU, 1 round
# The device call: carry .whl and .gpu-kit; what it writes under $OUT comes back.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    prepare | dry-run)
        cmd="$1"
        shift
        PY="${VENV:-.venv}/bin/python"
        [ -x "$PY" ] || PY=python3
        exec "$PY" -m benchmarks.gpu_kit "$cmd" "$@"
        ;;
    device)
        shift
        site="${TMPDIR:-/tmp}/pflower-site"
        # the image's own python3 (PyTorch, CUDA) with the carried wheels in front of it
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$site" .whl/*.whl
        export PYTHONPATH="$site:$PWD" PFLOWER_DATA_DIR="$PWD/.gpu-kit/data" PYTHONUNBUFFERED=1
        export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
        exec python3 -m benchmarks.gpu_kit device "$@"
        ;;
    *)
        echo "usage: bash scripts/gpu_kit.sh prepare | device [PRESET...] | dry-run [PRESET...]" >&2
        exit 2
        ;;
esac
