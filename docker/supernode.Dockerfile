# SuperNode: Flower's official image, pinned to the 1.39 line. In `--isolation process`
# the ClientApp runs in the SuperExec container (superexec.Dockerfile) next to it.
# deploy/fast_supernode.py and pflower/patches (flwr only) are added: the compose files start the SuperNode
# through it, as deploy.site does (an idle poll that backs off, docs/PERFORMANCE.md).
FROM flwr/supernode:1.39.0
COPY deploy/__init__.py deploy/fast_supernode.py /opt/pflower/deploy/
COPY pflower/__init__.py /opt/pflower/pflower/
COPY pflower/patches /opt/pflower/pflower/patches
ENV FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    PYTHONPATH=/opt/pflower
ENTRYPOINT ["flower-supernode"]
