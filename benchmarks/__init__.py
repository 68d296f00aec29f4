"""Benchmarks as data: presets (benchmarks/presets/*.toml), one runner, one report.

    python -m benchmarks list
    python -m benchmarks run PRESET [--seeds 0 1] [--rounds N] [--rows LABEL ...]

Every cell (setting x row x seed) runs in its own process and is reused when its
results.json is complete for the same config; the report goes to
docs/results/<preset>.md with its plots and the command that made it.
"""
