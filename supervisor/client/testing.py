"""A harness that runs a real `tfsupervisor run` subprocess on ipc sockets in a temporary
directory: used by the test suite and the benchmarks, and usable in your own tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from supervisor.client.client import Client, JobError, control


@dataclass
class Supervisor:
    """A running `tfsupervisor run` subprocess and how to reach it."""

    process: subprocess.Popen[bytes]
    config_path: Path
    runtime_dir: Path
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.runtime_dir}/frontend.sock"

    @property
    def control_endpoint(self) -> str:
        return f"ipc://{self.runtime_dir}/control.sock"

    @property
    def admin_endpoint(self) -> str:
        return f"ipc://{self.runtime_dir}/admin.sock"

    def admin(self, command: str, **fields: Any) -> dict[str, Any]:
        """A command on the admin endpoint (recycle, reload); raises JobError if refused."""
        result: dict[str, Any] = control(self.admin_endpoint, command, timeout=30, **fields)
        return result

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.endpoint, timeout=timeout)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = control(self.control_endpoint, "status", timeout=10)
        return result

    def workers(self, model: str) -> list[dict[str, Any]]:
        workers: list[dict[str, Any]] = self.status()["models"][model]["workers"]
        return workers

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 120.0,
                 what: str = "condition") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"supervisor exited {self.process.returncode}:\n"
                                     f"{self.log()[-4000:]}")
            try:
                last = self.status()
                if predicate(last):
                    return last
            except JobError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status {last}\n"
                             f"{self.log()[-4000:]}")

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        def all_ready(status: dict[str, Any]) -> bool:
            return all(
                sum(w["state"] == "ready" for w in m["workers"]) >= m["configured_workers"]
                for m in status["models"].values())
        return self.wait_for(all_ready, timeout, "all workers ready")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def short_tmpdir() -> Path:
    # ipc socket paths must stay under 107 bytes; pytest's tmp_path can be long.
    # TFS_SHORT_TMPDIR (short too): a test that checks a run leaves nothing behind points
    # the run's directories there, away from those of runs beside it.
    return Path(tempfile.mkdtemp(prefix="tfs-", dir=os.environ.get("TFS_SHORT_TMPDIR", "/tmp")))


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for a metrics, health or HTTP listener)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_supervisor(config: dict[str, Any], workdir: Path | None = None,
                     env: dict[str, str] | None = None,
                     wrapper: Sequence[str] = ()) -> Supervisor:
    """``wrapper``: a command line that runs the supervisor's (a sandbox, say: it ends by
    exec'ing the command it is given after its own arguments)."""
    workdir = workdir or short_tmpdir()
    runtime_dir = workdir / "run"
    config = dict(config)
    config.setdefault("supervisor", {})
    config["supervisor"] = {"runtime_dir": str(runtime_dir), "poll_interval": "0.2s",
                            **config["supervisor"]}
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / "supervisor.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "supervisor", "run", "-c", str(config_path),
             "--log-format", "json"],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return Supervisor(process, config_path, runtime_dir, log_path)
