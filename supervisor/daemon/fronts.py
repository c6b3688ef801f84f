"""The HTTP front processes (supervisor/front/): bound, started, restarted and drained here.

The daemon binds the listening socket itself (a taken port is a start-up error with one
line) and hands it to each front, which accept on it side by side. A front that exits is
started again after a back-off (BACKOFF doubling to MAX_BACKOFF, reset by a front that lived
STEADY seconds), counted and shown in `status`. On SIGTERM the fronts are told at once and
drain; the daemon waits for them (up to its shutdown deadline) before it closes its
sockets. Everything here runs on the main loop and never blocks: exits are polled.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from supervisor.config.keys import GrpcSection, HttpSection
from supervisor.shared import logs
from supervisor.shared.exitcodes import describe_exit

log = logs.get(__name__)

BACKOFF = 0.5  # seconds before the first restart
MAX_BACKOFF = 30.0
STEADY = 60.0  # a front that lived this long starts its back-off afresh
BACKLOG = 1024  # connections waiting to be accepted (capped by somaxconn)
EXIT_GRACE = 5.0  # after the daemon's own drain, how long fronts may take to close
HTTP_MODULES = ("httptools", "orjson")  # what a front imports beyond the daemon's own
GRPC_MODULES = ("grpc", "google.protobuf")  # and with supervisor.grpc


@dataclass
class FrontProcess:
    slot: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures: int = 0  # exits in a row, each before STEADY
    due: float = 0.0  # when it is started (again)
    last_exit: str | None = None


class Fronts:
    def __init__(self, settings: HttpSection, endpoint: str, metrics_dir: Path,
                 log_level: str, log_format: str,
                 curve: tuple[str, str] | None = None,
                 grpc: GrpcSection | None = None, max_message: int = 256 * 1024**2) -> None:
        self.settings, self.endpoint, self.metrics_dir = settings, endpoint, metrics_dir
        self.grpc = grpc if grpc is not None and grpc.listen else None
        self.max_message = max_message
        self.grpc_sock: socket.socket | None = None  # the gRPC port, held, not listened on
        self.curve = curve  # (the daemon's public key, the fronts' secret certificate)
        self.log_settings = {"log_level": log_level, "log_format": log_format}
        self.sock: socket.socket | None = None
        self.token: str | None = None
        self.fronts = [FrontProcess(slot) for slot in range(settings.processes)]
        self.draining = False

    # --- start ---------------------------------------------------------------------------

    def bind(self) -> None:
        """The files (TLS, token, the http extra), then the listening socket, before any
        front starts: a problem with a file is a ValueError naming its setting (a config
        error), one with the address an OSError (the start's)."""
        problems = file_problems(self.settings, self.grpc)
        if problems:
            raise ValueError("; ".join(f"supervisor.{key}: {message}"
                                       for key, message in problems))
        if self.settings.token_file:
            self.token = Path(self.settings.token_file).read_text().strip()
        shutil.rmtree(self.metrics_dir, ignore_errors=True)  # counters of a previous run
        self.metrics_dir.mkdir(mode=0o700, parents=True)

    def listen(self) -> None:
        """The HTTP socket, listening, which the fronts inherit; the gRPC port bound with
        SO_REUSEPORT and never listened on, which keeps it ours while each front's gRPC
        server binds it beside (a taken port fails here, at start, in one line)."""
        if self.settings.listen:
            host, port = _address(self.settings.listen)
            self.sock = socket.create_server((host, port), family=_family(host),
                                             backlog=BACKLOG)
            self.sock.set_inheritable(True)
        if self.grpc is not None and self.grpc.listen:
            host, port = _address(self.grpc.listen)
            self.grpc_sock = socket.socket(_family(host), socket.SOCK_STREAM)
            self.grpc_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self.grpc_sock.bind((host, port))

    def collector(self) -> MultiProcessCollector:
        """The fronts' metrics, added up from their files, for the daemon's registry."""
        return MultiProcessCollector(  # type: ignore[no-untyped-call]
            CollectorRegistry(auto_describe=True), path=str(self.metrics_dir))


    # --- the loop's part -----------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Reap fronts that exited and start those due."""
        for front in self.fronts:
            if front.process is not None:
                self._reap(front, now)
            if front.process is None and not self.draining and now >= front.due:
                self._start(front, now)

    def pids(self) -> set[int]:
        return {f.process.pid for f in self.fronts if f.process is not None}

    def drain(self) -> None:
        """SIGTERM to every front: they stop accepting and finish what is under way."""
        if self.draining:
            return
        self.draining = True
        for front in self.fronts:
            if front.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    front.process.send_signal(signal.SIGTERM)

    def close(self, grace: float = EXIT_GRACE) -> None:
        """At exit: fronts still running get ``grace`` seconds, then SIGKILL; the socket is
        closed."""
        self.drain()
        deadline = time.monotonic() + grace
        for front in self.fronts:
            if front.process is None:
                continue
            try:
                front.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                front.process.kill()
                front.process.wait()
            self._gone(front)
        for sock in (self.sock, self.grpc_sock):
            if sock is not None:
                sock.close()
        self.sock = self.grpc_sock = None

    def facts(self, now: float) -> list[dict[str, Any]]:
        """For `status`: each front's pid, state, age, restarts and last exit."""
        return [{"slot": f.slot, "pid": f.process.pid if f.process else None,
                 "state": "running" if f.process else
                 ("stopped" if self.draining else "restarting"),
                 "age": round(now - f.started_at, 1) if f.process else None,
                 "restarts": f.restarts, "last_exit": f.last_exit} for f in self.fronts]

    # --- one front -----------------------------------------------------------------------

    def _start(self, front: FrontProcess, now: float) -> None:
        fd = self.sock.fileno() if self.sock is not None else -1
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
               "TFS_HTTP_SETTINGS": json.dumps(self._front_settings())}
        if self.token:
            env["TFS_HTTP_TOKEN"] = self.token
        if self.curve is not None:
            env["TFS_FRONT_CURVE"] = json.dumps(self.curve)
        command = [sys.executable, "-m", "supervisor.front", "--fd", str(fd),
                   "--endpoint", self.endpoint, "--slot", str(front.slot),
                   "--parent", str(os.getpid())]
        try:
            front.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                             pass_fds=(fd,) if fd >= 0 else (),
                                             process_group=0)
        except OSError as exc:
            self._failed(front, now, f"could not be started: {exc}")
            return
        front.started_at = now
        log.info("front_started", slot=front.slot, pid=front.process.pid,
                 listen=self.settings.listen, grpc=self.grpc.listen if self.grpc else None)

    def _reap(self, front: FrontProcess, now: float) -> None:
        assert front.process is not None
        code = front.process.poll()
        if code is None:
            return
        pid = front.process.pid
        self._gone(front)
        if self.draining:
            log.info("front_stopped", slot=front.slot, pid=pid, exit=describe_exit(code))
            return
        self._failed(front, now, describe_exit(code), pid, lived=now - front.started_at)

    def _failed(self, front: FrontProcess, now: float, why: str, pid: int | None = None,
                lived: float = 0.0) -> None:
        front.failures = 1 if lived >= STEADY else front.failures + 1
        front.restarts += 1
        front.last_exit = why
        delay = min(MAX_BACKOFF, BACKOFF * 2 ** (front.failures - 1))
        front.due = now + delay
        log.warning("front_exited", slot=front.slot, pid=pid, exit=why,
                    restart_in=round(delay, 2), restarts=front.restarts)

    def _gone(self, front: FrontProcess) -> None:
        if front.process is not None:
            with contextlib.suppress(OSError):
                mark_process_dead(front.process.pid,  # type: ignore[no-untyped-call]
                                  str(self.metrics_dir))
        front.process = None

    def _front_settings(self) -> dict[str, Any]:
        s = self.settings
        grpc = self.grpc
        return {"default_timeout": s.default_timeout, "keepalive_timeout": s.keepalive_timeout,
                "request_timeout": s.request_timeout, "max_body_size": s.max_body_size,
                "max_connections": s.max_connections, "access_log": s.access_log,
                "tls_cert": s.tls_cert, "tls_key": s.tls_key,
                "grpc_listen": grpc.listen if grpc else None,
                "grpc_tls_cert": grpc.tls_cert if grpc else None,
                "grpc_tls_key": grpc.tls_key if grpc else None,
                "max_message_size": self.max_message, **self.log_settings}


def file_problems(settings: HttpSection,
                  grpc: GrpcSection | None = None) -> list[tuple[str, str]]:
    """What `check` and the start both find wrong with the fronts' files and modules:
    (setting, problem), the setting named under supervisor (http.tls_cert, ...)."""
    problems = []
    missing = [m for m in HTTP_MODULES if importlib.util.find_spec(m) is None]
    if grpc is not None and grpc.listen:
        missing += [m for m in GRPC_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        problems.append(("http.listen", f"{', '.join(missing)} not installed: the fronts "
                         "need the http extra (pip install 'tfsupervisor[http]')"))
    problems += _tls_problems("http", settings.tls_cert, settings.tls_key)
    if grpc is not None:
        problems += _tls_problems("grpc", grpc.tls_cert, grpc.tls_key)
    if settings.token_file:
        try:
            token = Path(settings.token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(("http.token_file", f"{settings.token_file}: "
                             f"{getattr(exc, 'strerror', None) or exc}"))
        else:
            if not token or not token.isprintable() or " " in token:
                problems.append(("http.token_file", f"{settings.token_file}: expected one "
                                 "token of printable characters without spaces"))
    return problems


def _tls_problems(section: str, cert: str | None, key: str | None) -> list[tuple[str, str]]:
    if not (cert and key):
        return []
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        setting = "tls_key" if exc.filename == key else "tls_cert"
        return [(f"{section}.{setting}", f"{exc.filename or cert}: no such file")]
    except (OSError, ssl.SSLError) as exc:
        return [(f"{section}.tls_cert", f"{cert} and {key} are not a PEM certificate chain "
                 f"and its private key ({exc})")]
    return []


def _address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
