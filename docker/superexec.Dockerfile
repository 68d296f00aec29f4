# SuperExec with this app installed: runs the ServerApp (server side) or the ClientApp
# (site side, with the GPU and the site's data). Built from the repository root:
#   docker build -f docker/superexec.Dockerfile -t pflower/superexec:1.39.0 .
FROM flwr/superexec:1.39.0
WORKDIR /app
COPY pyproject.toml README.md ./
COPY client_app ./client_app
COPY server_app ./server_app
COPY strategies ./strategies
COPY models ./models
COPY methods ./methods
COPY pflower ./pflower
COPY deploy ./deploy
# flwr is in the base image already: install the app's other dependencies (torch from
# PyPI ships its CUDA runtime) without replacing Flower.
RUN sed -i 's/.*flwr\[simulation\].*//' pyproject.toml \
    && python -m pip install --no-cache-dir .
ENV FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0
ENTRYPOINT ["flower-superexec"]
