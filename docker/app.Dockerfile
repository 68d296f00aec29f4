# The registry-free image: one image for every role (flower-superlink, the sites'
# SuperNode and warm SuperExec, the ServerApp's SuperExec), on any Debian-like base
# with python3 >= 3.11 and venv, its Python packages at exactly the tested versions
# (constraints.txt) from a wheelhouse, not from a package index or a registry.
# `bash scripts/docker_images.sh` makes the base (debootstrap), fills the wheelhouse,
# serves it to this build on the Docker bridge (WHEELS_URL), so that the wheels never
# become a layer of the image, and builds with Debian's docker.io as it is (no BuildKit).
ARG BASE_IMAGE=pflower/base:bookworm
FROM ${BASE_IMAGE}
ARG WHEELS_URL
ARG WHEELS_HOST
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1
# every distribution of the wheelhouse, pinned by sha256 (scripts/wheel_hashes.py): pip
# installs these bytes or fails, whoever serves WHEELS_URL (plain HTTP on the bridge, so
# --trusted-host; the hashes, not the host, are what is trusted). A layer that survives
# changes to the app's code.
COPY wheel-hashes.txt /opt/wheel-hashes.txt
RUN pip install --find-links "$WHEELS_URL" --trusted-host "$WHEELS_HOST" \
        --require-hashes --no-deps -r /opt/wheel-hashes.txt
COPY constraints.txt /opt/constraints.txt
COPY app /src
# the app itself, from the build context, with what is installed (no index, no links)
RUN pip install --no-deps --no-build-isolation /src \
    && pip check \
    && rm -rf /src
# an unprivileged user (uid 49999, as in Flower's images) owns the state and outputs
RUN useradd --uid 49999 --create-home --shell /usr/sbin/nologin app \
    && mkdir -p /app/state /app/outputs /state /outputs \
    && chown -R app:app /app /state /outputs
WORKDIR /app
USER app
