# syntax=docker/dockerfile:1
# TogetherLink's image: the gateway (`link serve`, the default command) and the engine (`link engine serve`).
#
#   docker build -t togetherlink .                                        # CPU PyTorch (the default)
#   docker build -t togetherlink:cuda --build-arg TORCH_VARIANT=cuda .     # CUDA PyTorch and Triton (`gpu` extra)
#   docker run -p 8000:8000 -e LINK_MASTER_KEY=... togetherlink           # the gateway on :8000
#   docker run togetherlink engine serve --host 0.0.0.0 --port 8001       # one engine replica
#   docker run --gpus all togetherlink:cuda engine serve --host 0.0.0.0   # the CUDA image needs the NVIDIA toolkit
#
# The install is `make install`, the Makefile target that `make test` (what CI's .ci/run runs) builds first: the
# image installs exactly what CI installs for the servers, by the same recipe, never a second one. Its torch pin
# (TORCH_SPEC, torch==2.13.0) is the Makefile's. CPU: PyTorch's CPU wheel index is added for that one pin, so
# pip picks torch 2.13.0+cpu, not the multi-GB CUDA build PyPI serves on Linux. CUDA: PyPI's own torch wheel,
# which carries its CUDA libraries (the host needs only the NVIDIA driver and container toolkit).
# Guide: docs/deployment.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VARIANT=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# make runs the install; g++ builds whatever ships as source
RUN apt-get update && apt-get install -y --no-install-recommends make g++ && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN case "$TORCH_VARIANT" in \
      cpu) export PIP_EXTRA_INDEX_URL="$TORCH_CPU_INDEX" EXTRA="" ;; \
      cuda) export EXTRA=gpu ;; \
      *) echo "TORCH_VARIANT must be cpu or cuda, got $TORCH_VARIANT" >&2; exit 1 ;; \
    esac \
    && make install PYTHON=python3 GPU_EXTRA="$EXTRA" \
    && rm -rf /root/.cache

FROM ${PYTHON_IMAGE} AS runtime
# g++ (optional): the engine builds its CPU kernels on first use (kernels/native/), Triton its launchers on a GPU
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --home-dir /data --create-home --shell /usr/sbin/nologin link
# the code and the virtual environment, owned by root and read-only to the server; its state lives in /data
COPY --from=build /app /app
ENV PATH=/app/.venv/bin:$PATH \
    LINK_HOME=/data \
    LINK_HOST=0.0.0.0 \
    LINK_PORT=8000 \
    PYTHONUNBUFFERED=1
WORKDIR /app
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000
# SIGTERM drains (protocol/drain.py): /health turns 503, requests in flight finish within LINK_DRAIN_TIMEOUT_S
# (default 30 s), then exit 0; give `docker stop` more than that: `docker stop -t 40`.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('LINK_PORT', '8000')}/health/live\", timeout=2)"]
ENTRYPOINT ["link"]
CMD ["serve"]
