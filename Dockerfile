# syntax=docker/dockerfile:1
# tfsupervisor image: the daemon as PID 1 (it reaps orphans and drains on SIGTERM), its
# TensorFlow workers beside it, running as an unprivileged user.
#
#   docker build -t tfsupervisor:0.1.0 .                                           # CPU (tensorflow-cpu), x86_64
#   docker build --build-arg TF_EXTRA=tensorflow-cuda -t tfsupervisor:0.1.0-gpu .  # NVIDIA GPU (CUDA wheels)
#   docker build --build-arg TF_EXTRA=tensorflow -t tfsupervisor:0.1.0 .           # linux/arm64 (CPU)
#   docker run --rm -p 127.0.0.1:5555:5555 \
#       -v $PWD/deploy/docker/demo.yaml:/etc/tfsupervisor/config.yaml:ro tfsupervisor:0.1.0
#
# The config is mounted at /etc/tfsupervisor/config.yaml (the demo: deploy/docker/demo.yaml;
# Kubernetes: the ConfigMap in deploy/kubernetes/). None is built in: the demo's plain TCP
# endpoint is for one machine, not a default an image run anywhere should fall back to. The demo model is built into /opt/tfsupervisor/models/demo; bake
# your own models the same way (FROM this image, COPY) or mount them.
# tests/test_container.py checks this file's parts without a Docker engine.

ARG PYTHON_VERSION=3.11

# --- build: a venv with tfsupervisor and TensorFlow ----------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
# An extra of pyproject.toml: tensorflow-cpu (default; x86_64 only, it has no aarch64
# wheels), tensorflow-cuda (NVIDIA GPUs: TensorFlow with the CUDA runtime, cuDNN and cuBLAS
# as wheels, which python:slim lacks), or tensorflow (plain; the CPU build on aarch64).
ARG TF_EXTRA=tensorflow-cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/tfsupervisor
WORKDIR /src
COPY pyproject.toml README.md ./
COPY supervisor ./supervisor
COPY worker ./worker
RUN /opt/tfsupervisor/bin/pip install ".[${TF_EXTRA}]"
# The demo MLP, so that the image serves something as built (deploy/kubernetes/ uses it).
RUN TF_CPP_MIN_LOG_LEVEL=2 /opt/tfsupervisor/bin/tfsupervisor demo-model /opt/tfsupervisor/models/demo

# --- runtime: the venv only, no compilers, no pip cache -------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
ARG TF_EXTRA=tensorflow-cpu
LABEL org.opencontainers.image.title="tfsupervisor" \
      org.opencontainers.image.description="TensorFlow inference workers with memory-aware recycling" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.tfsupervisor.tf-extra="${TF_EXTRA}"
RUN groupadd --system --gid 10001 tfsupervisor \
    && useradd --system --uid 10001 --gid tfsupervisor --home-dir /nonexistent \
       --no-create-home --shell /usr/sbin/nologin tfsupervisor \
    && mkdir -p /etc/tfsupervisor /run/tfsupervisor \
    && chown tfsupervisor:tfsupervisor /run/tfsupervisor \
    && chmod 0750 /run/tfsupervisor
COPY --from=build /opt/tfsupervisor /opt/tfsupervisor
ENV PATH=/opt/tfsupervisor/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
# Jobs (supervisor.endpoints, e.g. tcp://0.0.0.0:5555 with CURVE), Prometheus metrics
# (supervisor.metrics: 0.0.0.0:9464), the HTTP front (supervisor.http.listen:
# 0.0.0.0:8080, with TLS or insecure: true; Open Inference Protocol v2 and TF Serving REST)
# and the gRPC front (supervisor.grpc.listen: 0.0.0.0:8081), on KServe's ports for each.
# EXPOSE opens nothing: the config decides what listens.
EXPOSE 5555 9464 8080 8081
# SIGTERM starts the drain: queued and running jobs are answered, then workers stop.
STOPSIGNAL SIGTERM
# For `docker run`; Kubernetes uses the httpGet probes in deploy/kubernetes/ instead. GET
# /readyz on the metrics port (a config with metrics: 0.0.0.0:9464 or 127.0.0.1:9464), with
# bash's /dev/tcp: no Python start-up per check (tfsupervisor status cost ~0.45 s of CPU and
# ~48 MB each time), and no curl or wget, which the slim base does not have. Healthy: the
# status line says 200 (docs/deployment.md, "Probes").
HEALTHCHECK --interval=10s --timeout=5s --start-period=10m --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && read -r -t 4 _ code _ <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["tfsupervisor", "run"]
CMD ["-c", "/etc/tfsupervisor/config.yaml", "--log-format", "json"]
