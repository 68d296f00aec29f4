# SuperLink: Flower's official image, pinned to the 1.39 line. In `--isolation process`
# (see the compose files) it runs no app code, so it needs nothing of this project.
FROM flwr/superlink:1.39.0
# offline sites: never `uv sync` an app's dependencies at run time
ENV FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0
ENTRYPOINT ["flower-superlink"]
