"""Harnesses for tests and benchmarks: a loopback deployment, the soak, a two-node Ray
cluster. Not in the wheel: a site installs none of this (pyproject.toml)."""
