"""`tfsupervisor check --load`: each model loaded as `run` loads it, and the error `run`
would report for it.

`run` starts ``python -m worker`` with a spec built from the config and the model's
environment, and the worker sets TensorFlow up, loads the model (the highest version of a
TF Serving layout), checks the padding against the model's inputs and outputs, proves it
harmless, warms every shape and says READY, or says why not (ERROR, exit LOAD_ERROR). This
module does exactly that, one model at a time: the same spec (``build_spec``), command
(``worker_command``) and environment (``worker_env``), only the backend socket is a
temporary one of its own, bound here. So whatever makes `run` report a model
``unavailable`` (a truncated ``saved_model.pb``, a deleted ``variables/``, a padding that
names an input the model does not have, a handler that raises) fails here, with `run`'s
words. The command itself never imports TensorFlow; each load costs what a worker's start
costs (seconds for a TensorFlow model), which is why it is an option and not the default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from supervisor.config import worker_spec
from supervisor.config.keys import Config
from supervisor.shared.exitcodes import describe_exit
from supervisor.shared.protocol import (
    ERROR,
    INTERNAL_HOP,
    READY,
    ProtocolError,
    decode,
    signed_by,
)

WORKER_ID = "check"
STOP_GRACE = 10.0  # seconds a loaded worker has to exit on SIGTERM before it is killed
LATE_MESSAGE = 1.0  # seconds to wait for the ERROR of a worker that has just exited


@dataclass(frozen=True)
class LoadResult:
    model: str
    error: str | None  # what `run` would report the model unavailable with; None: loaded
    seconds: float
    version: int | None = None  # the version directory loaded (TF Serving's layout)


def load_model(config: Config, model: str, timeout: float) -> LoadResult:
    """Start one worker of ``model`` as `run` would and wait up to ``timeout`` seconds for
    it to be ready; then stop it."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="tfs-check-"))  # short: ipc paths are <108 bytes
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    process: subprocess.Popen[bytes] | None = None
    output = workdir / "output"
    try:
        endpoint = f"ipc://{workdir}/backend.sock"
        sock.bind(endpoint)
        secret = secrets.token_hex(16)
        try:
            spec = dataclasses.replace(
                worker_spec.build_spec(config, model, WORKER_ID, os.getpid(), "json", secret),
                backend=endpoint)
            env = worker_spec.worker_env(config, spec, os.environ)
        except worker_spec.SpawnError as exc:
            return LoadResult(model, f"worker could not be started: {exc}", 0.0)
        with open(output, "wb") as sink:
            try:
                process = subprocess.Popen(worker_spec.worker_command(spec), env=env,
                                           stdin=subprocess.DEVNULL, stdout=sink,
                                           stderr=subprocess.STDOUT, process_group=0)
            except OSError as exc:
                return LoadResult(model, f"worker could not be started: {exc}", 0.0)
        error, version = _wait(sock, process, secret, started + timeout, timeout, output)
        return LoadResult(model, error, time.monotonic() - started, version)
    finally:
        if process is not None:
            _stop(process)
        sock.close()
        context.term()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait(sock: zmq.Socket[bytes], process: subprocess.Popen[bytes], secret: str,
          deadline: float, timeout: float, output: Path) -> tuple[str | None, int | None]:
    """(None, version) once READY; else (the error `run` would report, None)."""
    exited_at: float | None = None
    while True:
        if sock.poll(100):
            frames = sock.recv_multipart()
            try:
                msg = decode(frames[1:], INTERNAL_HOP)
            except ProtocolError:
                continue
            if not signed_by(msg, secret):
                continue
            if msg.kind == READY:
                version = msg.header.get("version")
                return None, version if type(version) is int else None
            if msg.kind == ERROR:
                return str(msg.header.get("message")), None
            continue  # heartbeats
        now = time.monotonic()
        code = process.poll()
        if code is not None:
            # Its ERROR, sent just before it exited, may still be on its way.
            exited_at = exited_at if exited_at is not None else now
            if now - exited_at >= LATE_MESSAGE:
                last = _last_line(output)
                told = f"; its last output: {last}" if last else ""
                return f"worker {WORKER_ID} exited before ready: {describe_exit(code)}" \
                       f"{told}", None
        elif now >= deadline:
            return f"worker {WORKER_ID} not ready after {timeout:g}s (loading and warm-up; " \
                   "supervisor.start_timeout is what `run` allows): killed", None


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a ready worker finishes and exits), then its whole process group killed."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its own group (process_group=0)
    process.wait()


def _last_line(output: Path) -> str:
    """The last non-empty line the worker wrote (TensorFlow's and Python's errors end
    there), at most 300 characters."""
    try:
        with open(output, "rb") as stream:
            stream.seek(max(0, os.fstat(stream.fileno()).st_size - 8192))
            lines = [x.strip() for x in stream.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    last = next((x for x in reversed(lines) if x), "")
    return last[:300]
