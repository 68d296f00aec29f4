# SuperNode: Flower's official image, pinned to the 1.39 line. In `--isolation process`
# the ClientApp runs in the SuperExec container (superexec.Dockerfile) next to it.
FROM flwr/supernode:1.39.0
ENV FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0
ENTRYPOINT ["flower-supernode"]
