"""A server under test: started, ready (a real request answered through its transport),
stopped with its whole process tree; that tree's CPU and memory read with psutil."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.harness.transport import Inputs, Transport
from supervisor.testing import Supervisor, start_supervisor

START_TIMEOUT = 300.0
MIB = 2**20
# The machine counts as settled once its CPU use over half a second is below this; a server
# that was just stopped (LitServe's and Ray's process trees take seconds to go) must not
# share the cores with the next one's round.
SETTLED_PCT = 15.0
SETTLE_MAX_S = 30.0


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu(pid: int) -> dict[tuple[int, float], float]:
    """User + system CPU seconds of each live process of the tree, keyed by (pid, start)."""
    seconds = {}
    for proc in tree(pid):
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                seconds[proc.pid, proc.create_time()] = times.user + times.system
        except psutil.Error:
            pass
    return seconds


def cpu_between(before: dict[tuple[int, float], float],
                after: dict[tuple[int, float], float]) -> float:
    """CPU seconds spent between two reads by the processes present in both (a child that
    starts or exits in between is left out)."""
    return sum(after[key] - before[key] for key in before.keys() & after.keys())


def memory(pid: int) -> dict[str, float]:
    """The tree's resident memory: all of it, and its largest process (a worker)."""
    sizes = []
    for proc in tree(pid):
        with suppress(psutil.Error):
            sizes.append(proc.memory_info().rss)
    return {"tree_mib": round(sum(sizes) / MIB, 1),
            "largest_mib": round(max(sizes, default=0) / MIB, 1)}


def kill_leftovers(family: list[psutil.Process]) -> None:
    for proc in family:
        with suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(family, timeout=10)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM the server, then SIGKILL its process group after ``timeout`` (or at once if
    it exited), and any descendant that left the group (a daemon calling setsid)."""
    family = tree(proc.pid)[1:]
    if proc.poll() is None:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_leftovers(family)


def tail(log: Path | None, chars: int = 1500) -> str:
    text = log.read_text(errors="replace") if log and log.exists() else ""
    return text[-chars:].strip()


def installed(modules: tuple[str, ...]) -> bool:
    """Whether TensorFlow is installed and ``modules`` import (in a subprocess: the bench
    itself imports none of them, and the servers run with the same Python)."""
    if importlib.util.find_spec("tensorflow") is None:
        return False
    if not modules:
        return True
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    try:
        done = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True,
                              timeout=180)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def settle() -> float:
    """Wait (at most SETTLE_MAX_S) until the whole machine is nearly idle; its CPU use over
    the last half second, in percent of all cores, is returned and kept with the round."""
    deadline = time.monotonic() + SETTLE_MAX_S
    while (busy := psutil.cpu_percent(interval=0.5)) > SETTLED_PCT and \
            time.monotonic() < deadline:
        pass
    return busy


@dataclass
class Server:
    """A started server: its root process, how clients reach it, how to stop it."""

    name: str
    pid: int
    transport: Transport
    stop: Callable[[], None]
    log: Path | None = None
    status: Callable[[], dict[str, Any]] | None = None  # tfsupervisor's `status`

    def cpu(self) -> dict[tuple[int, float], float]:
        return tree_cpu(self.pid)

    def memory(self) -> dict[str, float]:
        return memory(self.pid)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_answering(self, probe: Inputs, check: Callable[[np.ndarray], None],
                       exited: Callable[[], int | None] = lambda: None) -> None:
        """Until a real request is answered right (stopping the server if it never is)."""
        call = self.transport.connect()
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                if (code := exited()) is not None:
                    raise RuntimeError(f"{self.name} exited {code} while starting: "
                                       + tail(self.log))
                try:
                    check(call(probe))
                    return
                except Exception as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.name} not answering after "
                                           f"{START_TIMEOUT:.0f} s ({exc}): "
                                           + tail(self.log)) from None
                    time.sleep(0.5)
        except BaseException:
            self.stop()
            raise


def supervisor_stopper(sup: Supervisor) -> Callable[[], None]:
    """Stops the supervisor, then kills whatever of its process tree is left."""
    def stop() -> None:
        family = tree(sup.process.pid)[1:]
        try:
            sup.stop(timeout=30)
        finally:
            kill_leftovers(family)
    return stop


def start_tfsupervisor(name: str, config: dict[str, Any],
                       transport: Callable[[Supervisor], Transport]) -> Server:
    """tfsupervisor on ``config``, once ready; ``transport(sup)`` says how clients reach it."""
    sup: Supervisor = start_supervisor(config)
    stop = supervisor_stopper(sup)
    try:
        sup.wait_ready(timeout=START_TIMEOUT)
    except BaseException:
        stop()
        raise
    return Server(name, sup.process.pid, transport(sup), stop, sup.log_path, sup.status)


def start_process(name: str, command: list[str], cwd: Path, env: dict[str, str],
                  transport: Transport) -> tuple[Server, subprocess.Popen[bytes]]:
    """``command`` in its own process group, its output in ``cwd/NAME.log``."""
    log = cwd / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return Server(name, proc.pid, transport, lambda: stop_group(proc), log), proc
