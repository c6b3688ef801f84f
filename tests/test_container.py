"""The container image, without a Docker engine.

- The Dockerfile is read for what the image must be: multi-stage on a slim Python base, TF
  CPU by default and a build argument for the GPU wheel, a non-root user, STOPSIGNAL
  SIGTERM, `tfsupervisor run` as the entrypoint reading the mounted config, and a
  HEALTHCHECK that GETs /readyz on the metrics port the manifests' config names (bash, no
  Python start-up).
  Every file it copies exists and is not excluded by .dockerignore.
- The daemon as a container's PID 1, in a PID namespace of its own (`unshare --pid --fork
  --mount-proc`, as root; with a user namespace otherwise): an orphaned grandchild of a
  worker is re-parented to it and reaped (no zombie), SIGTERM drains (the job in flight is
  answered), it exits 0, and nothing is left running in the namespace.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import signal
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from bench.dockerfile import DOCKERFILE, exec_form, instructions, stages
from supervisor.cli.commands import build_parser
from supervisor.client import Client
from tests.conftest import stand_in_saved_model, start_supervisor
from tests.test_kubernetes import config_mount, config_of, container, one, rendered

REPO = Path(__file__).resolve().parent.parent


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path (or a parent) decides."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatch(c, pattern) or fnmatch.fnmatch(c, f"**/{pattern}")
               for c in candidates):
            ignored = not negate
    return ignored


def test_the_dockerfile_builds_the_image_the_manifests_expect() -> None:
    text = DOCKERFILE.read_text()
    build, runtime = stages(text)  # multi-stage: the runtime has no pip cache or compilers
    for stage in (build, runtime):
        assert "slim" in stage[0][1], stage[0]  # a slim Python base
    assert build[0][1].endswith(" AS build")
    runtime_words = [w for w, _ in runtime]
    assert ("COPY", "--from=build /opt/tfsupervisor /opt/tfsupervisor") in runtime
    # TF CPU by default; the GPU wheel by a build argument naming the extra.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert ("ARG", "TF_EXTRA=tensorflow-cpu") in build
    assert {"tensorflow", "tensorflow-cpu", "tensorflow-cuda"} <= set(extras)
    assert any(w == "RUN" and 'pip install ".[${TF_EXTRA}]"' in r for w, r in build)
    # A non-root user, created with that uid, and the manifests run as the same one.
    users = [r for w, r in runtime if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    uid = users[-1].split(":")[0]
    assert any(w == "RUN" and f"--uid {uid}" in r for w, r in runtime)
    pod = rendered("base")
    security = one(pod, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert str(security["runAsUser"]) == uid and security["runAsNonRoot"] is True
    assert ("STOPSIGNAL", "SIGTERM") in runtime
    # The entrypoint is the daemon itself (PID 1): `tfsupervisor run`, the config mounted.
    (entrypoint,) = [exec_form(r) for w, r in runtime if w == "ENTRYPOINT"]
    (cmd,) = [exec_form(r) for w, r in runtime if w == "CMD"]
    assert entrypoint == ["tfsupervisor", "run"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tfsupervisor"] == "supervisor.cli.commands:main"
    args = build_parser().parse_args([*entrypoint[1:], *cmd])
    assert args.command == "run" and args.config == f"{config_mount(pod)}/config.yaml"
    k8s = build_parser().parse_args([*entrypoint[1:], *container(pod)["args"]])
    assert k8s.command == "run" and k8s.config == args.config
    # The health check starts no Python: GET /readyz on the metrics port the config names
    # (tests/test_health.py runs it against a live daemon).
    assert healthcheck_port(runtime) == int(config_of(pod).supervisor.metrics.rpartition(":")[2])
    exposed = {int(p) for w, r in runtime if w == "EXPOSE" for p in r.split()}
    assert exposed == {p["containerPort"] for p in container(pod)["ports"]}
    assert "HEALTHCHECK" in runtime_words


def healthcheck_port(runtime: list[tuple[str, str]]) -> int:
    """The port the HEALTHCHECK asks: bash's /dev/tcp to 127.0.0.1, GET /readyz, healthy on a
    200 status line; no Python start-up, no curl or wget (the slim base has neither)."""
    (health,) = [r for w, r in runtime if w == "HEALTHCHECK"]
    command = exec_form(health.partition(" CMD ")[2])
    assert command[:2] == ["bash", "-c"], command
    found = re.fullmatch(r"exec 3<>/dev/tcp/127\.0\.0\.1/(\d+) && printf 'GET /readyz "
                         r"HTTP/1\.0\\r\\n\\r\\n' >&3 && read -r -t \d+ _ code _ <&3 && "
                         r'\[ "\$code" = 200 \]', command[2])
    assert found, command[2]
    return int(found[1])


def gpu_build_extras() -> list[tuple[str, str]]:
    """(where a GPU build is spelt out, the extra it installs)."""
    found = []
    for name in ("Dockerfile", "docs/deployment.md", "README.md"):
        text = (REPO / name).read_text()
        found += [(name, extra) for extra in
                  re.findall(r"--build-arg TF_EXTRA=([\w-]+)[^\n]*(?:-gpu|GPUs)", text)]
    overlay = (REPO / "deploy/kubernetes/overlays/gpu/kustomization.yaml").read_text()
    gpu = re.search(r"TF_EXTRA=([\w-]+)\)", overlay)
    assert gpu, "the GPU overlay names the build argument of its image"
    found.append(("overlays/gpu", gpu.group(1)))
    makefile = (REPO / "Makefile").read_text()
    nvidia = re.search(r"nvidia-smi[^\n]*&& echo ([\w-]+) \|\|", makefile)
    assert nvidia, "the Makefile picks an extra on an nvidia host"
    found.append(("Makefile", nvidia.group(1)))
    return found


def test_the_gpu_image_and_an_nvidia_host_get_tensorflow_with_cuda() -> None:
    """python:slim has no CUDA: the plain tensorflow wheel would find no GPU and run every
    worker on the CPU, silently. The GPU build installs TensorFlow's and-cuda extra (the
    CUDA runtime, cuDNN, cuBLAS as wheels), in the Dockerfile, the docs and the Makefile."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    found = gpu_build_extras()
    assert {"Dockerfile", "docs/deployment.md", "README.md", "overlays/gpu", "Makefile"} <= \
        {where for where, _ in found}, found
    for where, extra in found:
        assert extra in extras, (where, extra)
        assert any(re.match(r"tensorflow\[and-cuda\]", r) for r in extras[extra]), (where, extra)
    # The CPU image stays CPU-only.
    assert extras["tensorflow-cpu"] == ["tensorflow-cpu>=2.16"]


def test_what_the_dockerfile_copies_exists_and_is_in_the_build_context() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = []
    for word, rest in instructions(DOCKERFILE.read_text()):
        if word in ("COPY", "ADD") and not rest.startswith("--from"):
            *sources, _ = rest.split()
            copied += sources
    assert copied
    for source in copied:
        path = REPO / source
        assert path.exists(), source
        files = [p for p in path.rglob("*.py")] if path.is_dir() else [path]
        for file in files:
            relative = str(file.relative_to(REPO))
            assert not dockerignored(relative, patterns), relative
    # What must stay out of the context does.
    for leftover in (".venv/bin/python", "tests/conftest.py", "models/demo/saved_model.pb",
                     ".git/HEAD", "supervisor/__pycache__/x.pyc"):
        assert dockerignored(leftover, patterns), leftover
    # pip builds the package from these: the sources setuptools finds, and the readme.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["readme"] in copied


# --- the daemon as PID 1 ---------------------------------------------------------------------

def namespace_wrapper() -> list[str]:
    """unshare as root (CI); a user namespace maps this user to root otherwise."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare (util-linux) is missing: the PID 1 test needs it")
    base = [unshare, "--pid", "--fork", "--mount-proc"]
    return base if os.geteuid() == 0 else [unshare, "--user", "--map-root-user", *base[1:]]


def pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def in_namespace(namespace: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if pid_namespace(process.pid) == namespace:
                found.append(process)
        except (OSError, psutil.Error):
            pass
    return found


def inner_pid(pid: int) -> int:
    """The pid as the process's own namespace sees it (the last NSpid field)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {pid}")


def wait_until(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


SLOW = -2.0
ORPHAN = 3.0


def test_the_daemon_as_pid_1_reaps_orphans_drains_and_exits_clean() -> None:
    sup = start_supervisor(
        {"models": {"m": {"handler": "tests.live_handlers:orphans", "workers": 1,
                          "options": {"sleep_on": SLOW, "sleep_seconds": 3.0,
                                      "orphan_seconds": 1.5}}}},
        wrapper=namespace_wrapper(), env={"PYTHONPATH": str(REPO)})
    daemon: psutil.Process | None = None
    try:
        unshare = psutil.Process(sup.process.pid)
        daemon = wait_until(lambda: (unshare.children() or [None])[0], 30, "the daemon")
        assert daemon is not None
        namespace = pid_namespace(daemon.pid)
        assert namespace != pid_namespace(os.getpid())
        assert inner_pid(daemon.pid) == 1  # the container's PID 1
        sup.wait_ready(timeout=120)
        with Client(sup.endpoint, timeout=60) as client:
            out = client.infer("m", {"x": np.full((1, 4), ORPHAN, np.float32)})
        orphan_inner = int(out["orphan"][0])

        def orphan() -> psutil.Process | None:
            for process in in_namespace(namespace):
                try:
                    if inner_pid(process.pid) == orphan_inner:
                        return process
                except OSError:
                    pass
            return None

        # Re-parented to the daemon (its shell parent is gone) while it sleeps ...
        found = orphan()
        if found is not None:  # not already gone on a slow machine
            try:
                parent = found.ppid()
                assert parent == daemon.pid or not found.is_running(), (parent, daemon.pid)
            except psutil.NoSuchProcess:
                pass
        # ... and reaped once it exits: no zombie is left in the namespace.
        def reaped() -> bool:
            zombies = [p for p in in_namespace(namespace)
                       if p.status() == psutil.STATUS_ZOMBIE]
            return orphan() is None and not zombies

        try:
            wait_until(reaped, 20, "the orphan reaped")
        except AssertionError:
            raise AssertionError(
                "an orphan re-parented to the daemon (PID 1) was never reaped: "
                + ", ".join(f"{p.pid} {p.name()} {p.status()} ppid {p.ppid()}"
                            for p in in_namespace(namespace))) from None

        # SIGTERM (what the runtime sends) drains: the job in flight is answered.
        result: dict[str, Any] = {}

        def slow_job() -> None:
            with Client(sup.endpoint, timeout=60) as client:
                result["x"] = client.infer("m", {"x": np.full((1, 4), SLOW, np.float32)})["x"]

        job = threading.Thread(target=slow_job)
        job.start()
        sup.wait_for(lambda s: s["models"]["m"]["in_flight"] == 1, timeout=30,
                     what="job running")
        daemon.send_signal(signal.SIGTERM)
        job.join(60)
        assert result["x"].tolist() == [[SLOW] * 4]
        assert sup.process.wait(60) == 0  # unshare exits with the daemon's status
        assert in_namespace(namespace) == []  # nothing left running
        events = [json.loads(line) for line in sup.log().splitlines()
                  if line.startswith("{")]
        names = [e["event"] for e in events]
        assert "shutdown_started" in names and "shutdown_jobs_abandoned" not in names
    finally:
        if daemon is not None and daemon.is_running():
            daemon.kill()
        sup.stop()
        shutil.rmtree(sup.config_path.parent, ignore_errors=True)


# --- the demo config for `docker run` --------------------------------------------------------

DEMO = REPO / "deploy" / "docker" / "demo.yaml"


def documented_docker_run() -> list[str]:
    """The `docker run` of docs/deployment.md, continuation lines joined, split in words."""
    text = (REPO / "docs" / "deployment.md").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("docker run ")]
    return line.split()


def test_the_documented_docker_run_serves_the_demo_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """deploy/docker/demo.yaml, as `docker run` mounts it: the daemon's loader and `check`
    accept it with the image's paths laid out (the demo model where the Dockerfile builds it,
    the runtime directory it creates), its endpoint is a port the image exposes and the
    command publishes on the host's loopback only, and the HEALTHCHECK asks its metrics
    port. (The repository's config.yaml, which the docs mounted before, names a model
    relative to itself and ipc endpoints that no published port reaches.)"""
    from supervisor.cli.commands import main as cli_main
    from supervisor.config.loading import load_config, parse_config

    words = documented_docker_run()
    runtime = stages(DOCKERFILE.read_text())[-1]
    (cmd,) = [exec_form(r) for w, r in runtime if w == "CMD"]
    config_path = cmd[cmd.index("-c") + 1]
    volumes = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
    assert f"$PWD/{DEMO.relative_to(REPO)}:{config_path}:ro" in volumes, volumes
    published = [words[i + 1] for i, w in enumerate(words) if w == "-p"]
    assert published and all(p.startswith("127.0.0.1:") for p in published), published
    config = parse_config(DEMO.read_text(), Path(config_path))
    sup = config.supervisor
    (endpoint,) = sup.endpoints
    assert endpoint.startswith("tcp://0.0.0.0:")  # reachable through the published port
    port = int(endpoint.rpartition(":")[2])
    exposed = {int(p) for w, r in runtime if w == "EXPOSE" for p in r.split()}
    assert port in exposed and f"127.0.0.1:{port}:{port}" in published
    assert sup.metrics and int(sup.metrics.rpartition(":")[2]) in exposed
    # The runtime directory is the one the image creates for its user, and the health check
    # asks the metrics port, on an address 127.0.0.1 reaches.
    assert str(config.runtime_dir) == "/run/tfsupervisor"
    (make_dirs,) = [r for w, r in runtime if w == "RUN" and "mkdir" in r]
    assert f"chown tfsupervisor:tfsupervisor {config.runtime_dir}" in make_dirs
    assert sup.metrics and healthcheck_port(runtime) == int(sup.metrics.rpartition(":")[2])
    assert sup.metrics.rpartition(":")[0] in ("0.0.0.0", "127.0.0.1")  # 127.0.0.1 reaches it
    # The model is the one the image builds.
    for model in config.models.values():
        assert model.saved_model == "/opt/tfsupervisor/models/demo"
    assert "demo-model /opt/tfsupervisor/models/demo" in DOCKERFILE.read_text()
    # `check` in the image's layout, every absolute path moved under a temporary root.
    root = Path(f"/tmp/tfs-docker-{os.getpid()}")  # short: ipc paths are bounded
    shutil.rmtree(root, ignore_errors=True)
    try:
        stand_in_saved_model(root / "opt/tfsupervisor/models/demo")
        (root / "run").mkdir()
        (root / "etc/tfsupervisor").mkdir(parents=True)
        text = re.sub(r"(?<![\w/])(/run|/opt/tfsupervisor)(?=/)", lambda m: f"{root}{m[1]}",
                      DEMO.read_text())
        file = root / config_path.lstrip("/")
        file.write_text(text)
        assert cli_main(["check", "-c", str(file)]) == 0, capsys.readouterr().err
        assert "OK" in capsys.readouterr().out
        assert str(load_config(file).runtime_dir) == f"{root}/run/tfsupervisor"
    finally:
        shutil.rmtree(root, ignore_errors=True)
