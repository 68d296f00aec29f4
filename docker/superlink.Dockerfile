# SuperLink: Flower's official image, pinned to the 1.39 line. In `--isolation process`
# (see the compose files) it runs no app code. deploy/fast_superlink.py and
# pflower/patches (flwr only) are added: the compose files start the SuperLink through
# it, a Fleet API that long-polls (docs/DEPLOYMENT.md, docs/PERFORMANCE.md).
FROM flwr/superlink:1.39.0
COPY deploy/__init__.py deploy/fast_superlink.py /opt/pflower/deploy/
COPY pflower/__init__.py /opt/pflower/pflower/
COPY pflower/patches /opt/pflower/pflower/patches
# offline sites: never `uv sync` an app's dependencies at run time
ENV FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    PYTHONPATH=/opt/pflower
ENTRYPOINT ["flower-superlink"]
