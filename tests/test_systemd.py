"""The systemd unit and what the daemon tells systemd.

- The unit verifies, and `systemd-analyze security` rates it under 2.0, with and without the
  GPU drop-in, while keeping what the product needs.
- Its system call filter (SystemCallFilter=@system-service, SystemCallErrorNumber=EPERM) is
  real: tests/syscall_filter.py installs what systemd would, a probe shows calls outside it
  refused, and a real TensorFlow worker loads and answers under it.
- While draining on SIGTERM the daemon asks systemd for more time (EXTEND_TIMEOUT_USEC),
  never past its own shutdown deadline; workers never see systemd's variables.

A host without systemd-analyze or libseccomp fails these tests (it never skips them): on
Debian/Ubuntu `apt-get install systemd` brings both (libseccomp2 comes with apt itself).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config.loading import parse_config
from supervisor.config.worker_spec import SYSTEMD_ONLY
from supervisor.core.core import EXIT_MARGIN, Core
from supervisor.core.lifecycle import STOP_GRACE
from supervisor.daemon.notify import Notifier
from supervisor.daemon.reporting import EXTEND_AHEAD, EXTEND_EVERY, Reporter
from tests import syscall_filter
from tests.conftest import echo_model, start_supervisor
from tests.test_operations import NotifySocket

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "tfsupervisor.service"
DROP_IN = REPO / "systemd" / "tfsupervisor.service.d"
FILTER = Path(syscall_filter.__file__).resolve()
# What the unit's exposure must stay under (`systemd-analyze security`: 0 safe .. 10 exposed).
MAX_EXPOSURE = 2.0


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is not installed: these tests check the unit with it "
                    "(Debian/Ubuntu: apt-get install systemd)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True,
                          timeout=120)


def unit_copy(directory: Path, drop_in: bool) -> Path:
    """The unit (and its GPU drop-in) where `systemd-analyze` looks, ExecStart= pointing at
    this venv's CLI so that `verify` finds it."""
    venv_cli = Path(sys.executable).parent / "tfsupervisor"
    assert venv_cli.exists()
    path = directory / UNIT.name
    path.write_text(UNIT.read_text().replace("/opt/tfsupervisor/bin/tfsupervisor",
                                             str(venv_cli)))
    if drop_in:
        shutil.copytree(DROP_IN, directory / DROP_IN.name)
    return path


# --- the unit ------------------------------------------------------------------------------

@pytest.mark.parametrize("drop_in", [False, True], ids=["cpu", "gpu-drop-in"])
def test_unit_file_verifies_without_warnings(tmp_path: Path, drop_in: bool) -> None:
    path = unit_copy(tmp_path, drop_in)
    out = systemd_analyze("verify", str(path))
    ours = [line for line in (out.stdout + out.stderr).splitlines() if "tfsupervisor" in line]
    assert out.returncode == 0 and ours == [], out.stdout + out.stderr
    unit = UNIT.read_text()
    for key in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "ExecReload=",
                "KillMode=mixed", "OOMPolicy=continue", "Restart=on-failure",
                "RuntimeDirectory=", "NoNewPrivileges=yes", "ProtectSystem=strict",
                "CapabilityBoundingSet=\n", "SystemCallFilter=@system-service\n",
                "SystemCallErrorNumber=EPERM\n", "SystemCallArchitectures=native\n"):
        assert key in unit, key


@pytest.mark.parametrize("drop_in", [False, True], ids=["cpu", "gpu-drop-in"])
def test_unit_exposure_is_under_two(tmp_path: Path, drop_in: bool) -> None:
    path = unit_copy(tmp_path, drop_in)
    out = systemd_analyze("security", "--offline=yes", "--no-pager", str(path))
    found = re.search(r"Overall exposure level for tfsupervisor\.service: (\d+\.\d+)",
                      out.stdout)
    assert found, out.stdout + out.stderr
    assert float(found.group(1)) < MAX_EXPOSURE, out.stdout


def test_hardening_keeps_what_the_product_needs() -> None:
    """What each setting left off would break (the unit says why, one line each)."""
    settings = syscall_filter.service_settings(UNIT.read_text())

    def last(key: str, default: str = "") -> str:
        return (settings.get(key) or [default])[-1]

    assert last("MemoryDenyWriteExecute", "no") == "no"  # TF/oneDNN/XLA JIT: W+X memory
    assert last("ProcSubset", "all") == "all"  # /proc/meminfo: min_available_memory
    assert last("PrivateDevices", "no") == "no"  # /dev/nvidia*
    assert last("PrivateUsers", "no") == "no"  # socket_group's chown
    assert last("PrivateNetwork", "no") == "no" and "IPAddressDeny" not in settings  # TCP
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(" ".join(
        settings["RestrictAddressFamilies"]).split())
    assert last("ProtectProc") == "invisible"  # the service's own processes stay visible
    spec = syscall_filter.unit_spec(UNIT.read_text())
    allowed = set(spec["allow"])
    # socket_group (chown), numpy's OpenBLAS (mbind, sched_setscheduler), the subreaper
    # and parent-death signal (prctl), reading workers' /proc (openat), binding (bind).
    assert {"chown", "fchownat", "mbind", "sched_setscheduler", "prctl", "openat",
            "bind", "listen", "clone", "clone3", "execve", "kill", "wait4"} <= allowed
    assert not {"reboot", "swapon", "kexec_load", "mount", "ptrace", "init_module",
                "settimeofday", "mincore"} & allowed
    # A drain that fits the default shutdown deadline never needs EXTEND_TIMEOUT_USEC.
    stop = re.search(r"^TimeoutStopSec=(\d+)s$", UNIT.read_text(), re.M)
    assert stop and int(stop.group(1)) >= 30 + STOP_GRACE + EXIT_MARGIN


# --- the system call filter, applied without systemd ----------------------------------------

@pytest.fixture(scope="module")
def seccomp_spec() -> dict[str, Any]:
    """The unit's filters, checked to be installable here."""
    try:
        syscall_filter.libseccomp()
    except OSError as exc:
        pytest.fail(f"libseccomp.so.2 is missing ({exc}): the unit's system call filter cannot "
                    "be tested (Debian/Ubuntu: apt-get install libseccomp2)")
    systemd_analyze("--version")
    return syscall_filter.unit_spec(UNIT.read_text())


def under_filter(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(FILTER), json.dumps(spec), "--"]


PROBE = r"""
import ctypes, ctypes.util, errno, json, mmap, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
seccomp = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
page = mmap.mmap(-1, mmap.PAGESIZE)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
vec = ctypes.create_string_buffer(1)

def call(name, *args):
    number = seccomp.seccomp_syscall_resolve_name(name.encode())
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *args)
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]

def family(name):
    try:
        socket.socket(getattr(socket, name), socket.SOCK_DGRAM).close()
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]

out = {"mincore": call("mincore", ctypes.c_void_p(address), ctypes.c_size_t(mmap.PAGESIZE),
                       vec),
       "clone3": call("clone3", None, ctypes.c_size_t(0)),
       "getpid": call("getpid"), "AF_UNIX": family("AF_UNIX")}
if sys.argv[1] == "filtered":  # calls that only the filter makes harmless
    out.update({
        "reboot": call("reboot", 0, 0, 0, None),
        "swapon": call("swapon", b"/nonexistent", 0),
        "kexec_load": call("kexec_load", ctypes.c_ulong(0), ctypes.c_ulong(0), None,
                           ctypes.c_ulong(0)),
        "unshare_user": call("unshare", 0x10000000),
        "AF_PACKET": family("AF_PACKET")})
print(json.dumps(out))
"""


def probe(wrapper: list[str], mode: str) -> dict[str, str]:
    out = subprocess.run([*wrapper, sys.executable, "-c", PROBE, mode], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, str] = json.loads(out.stdout)
    return result


def test_the_filter_refuses_calls_outside_the_set(seccomp_spec: dict[str, Any]) -> None:
    """Proof that the filter the TF test runs under is real: mincore() works without it and
    gets EPERM (SystemCallErrorNumber=) under it; privileged calls get EPERM before any
    capability check; the namespace and address-family rules answer as systemd's do."""
    assert seccomp_spec["errno"] == 1  # EPERM, as the unit says
    free = probe([], "free")
    assert free == {"mincore": "ok", "clone3": "EINVAL", "getpid": "ok", "AF_UNIX": "ok"}
    filtered = probe(under_filter(seccomp_spec), "filtered")
    assert filtered == {"mincore": "EPERM", "clone3": "ENOSYS", "getpid": "ok",
                        "AF_UNIX": "ok", "reboot": "EPERM", "swapon": "EPERM",
                        "kexec_load": "EPERM", "unshare_user": "EPERM",
                        "AF_PACKET": "EAFNOSUPPORT"}


@pytest.mark.tf
def test_a_tensorflow_worker_serves_under_the_units_syscall_filter(
        seccomp_spec: dict[str, Any], models_dir: Path) -> None:
    """A whole supervisor, a TF SavedModel worker and a handler worker run under the unit's
    filters: the model loads, answers a real job, memory and host memory are read, metrics
    are served on TCP, and the daemon shuts down cleanly. Were a call TF needs outside the
    set, it would get EPERM and the load or the job would fail."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    threads = {"intra_op_threads": 1, "inter_op_threads": 1}
    sup = start_supervisor({
        "supervisor": {"metrics": f"127.0.0.1:{port}", "min_available_memory": "1MiB"},
        "models": {"sm": {"saved_model": str(models_dir / "demo_sm"), "workers": 1,
                          "tf": threads},
                   "h": echo_model(1)}}, wrapper=under_filter(seccomp_spec))
    try:
        sup.wait_ready(timeout=180)
        mode, inherited = syscall_filter.seccomp_mode("self")
        inherited = inherited if mode == 2 else 0  # a container may filter pytest itself
        pids = [sup.process.pid, *(w["pid"] for m in ("sm", "h") for w in sup.workers(m))]
        for pid in pids:  # the supervisor and both workers, all under the three filters
            assert syscall_filter.seccomp_mode(pid) == (2, inherited + 3), pid
        batch = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
        with sup.client(timeout=60) as client:
            out = client.infer("sm", {"features": batch})["output_0"]
            echoed = client.infer("h", {"x": np.ones((2, 4), np.float32)})["x"]
        assert out.shape == (4, 1) and np.all((out >= 0) & (out <= 1)), out  # sigmoid
        assert len({float(v) for v in out.ravel()}) > 1  # real inference, not a constant
        assert echoed.tolist() == [[1.0] * 4] * 2
        sup.wait_for(lambda s: all(w["jobs"] == 1 and w["memory"] for m in ("sm", "h")
                                   for w in s["models"][m]["workers"]),
                     timeout=30, what="jobs counted and memory read from /proc")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
        jobs = {s.labels["model"]: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "tfsupervisor_jobs_total"
                and s.labels.get("outcome") == "ok"}
        assert jobs == {"sm": 1, "h": 1}, jobs
        assert sup.stop() == 0
        events = [json.loads(line) for line in sup.log().splitlines()
                  if line.startswith("{")]
        assert not [e for e in events if e["event"] in (
            "worker_died", "housekeeping_failed", "message_handling_failed")], events
    finally:
        sup.stop()
        shutil.rmtree(sup.config_path.parent, ignore_errors=True)


# --- sd_notify while stopping ---------------------------------------------------------------

def test_extend_timeout_goes_over_the_notify_socket(tmp_path: Path) -> None:
    listener = NotifySocket(str(tmp_path / "notify.sock"))
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        assert notifier.extend_timeout(15_000_000)
        listener.wait_for("EXTEND_TIMEOUT_USEC=", timeout=5)
        assert listener.messages[-1][1] == "EXTEND_TIMEOUT_USEC=15000000"
        with pytest.raises(ValueError):
            notifier.extend_timeout(0)
    finally:
        notifier.close()
        listener.sock.close()
    assert not Notifier({}).extend_timeout(1)  # outside systemd: nothing sent, no error


CORE_CONFIG = """
supervisor:
  runtime_dir: /tmp/tfs-systemd-test
  shutdown_timeout: 120s
models:
  a: {handler: "mod:a", workers: 1}
"""


def test_extensions_come_while_draining_and_stop_at_the_daemons_own_deadline(
        tmp_path: Path) -> None:
    """A drain allowed 120 s (beyond TimeoutStopSec=60s): systemd is asked for EXTEND_AHEAD
    more every EXTEND_EVERY seconds while the loop runs, and never past the moment the
    daemon will be gone by its own rules (shutdown_timeout + STOP_GRACE + EXIT_MARGIN)."""
    core = Core(parse_config(CORE_CONFIG, Path("/tmp/tfs-systemd-test/config.yaml")))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify.sock"))
    listener.setblocking(False)
    reporter = Reporter(core.pool, core.router, 0.0)
    reporter.notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    settings = core.config.supervisor

    def extensions(at: float, deadline: float | None) -> list[int]:
        reporter.report(at, settings, deadline is not None, deadline)
        sent: list[int] = []
        while True:
            try:
                message = listener.recv(4096).decode()
            except BlockingIOError:
                return sent
            sent += [int(line.split("=")[1]) for line in message.splitlines()
                     if line.startswith("EXTEND_TIMEOUT_USEC=")]

    try:
        assert core.shutdown_deadline() is None
        assert all(extensions(t, None) == [] for t in (0.0, 10.0, 20.0))  # serving: none
        core.shutdown(100.0, "SIGTERM")
        deadline = core.shutdown_deadline()
        assert deadline == 100.0 + 120.0 + STOP_GRACE + EXIT_MARGIN
        sent: list[tuple[float, int]] = []
        for step in range(int((deadline - 100.0 + 20) / 0.25)):
            now = 100.0 + step * 0.25
            sent += [(now, usec) for usec in extensions(now, deadline)]
        times = [t for t, _ in sent]
        assert times[0] == 100.0  # at once
        assert all(math.isclose(b - a, EXTEND_EVERY) for a, b in pairwise(times))
        assert all(usec <= EXTEND_AHEAD * 1e6 for _, usec in sent)
        assert all(t + usec / 1e6 <= deadline + 1e-6 for t, usec in sent)  # never past it
        assert math.isclose(times[-1] + sent[-1][1] / 1e6, deadline)  # but right up to it
        assert times[-1] < deadline and len(sent) == math.ceil((deadline - 100) / EXTEND_EVERY)
    finally:
        reporter.notifier.close()
        listener.close()


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def notify_socket() -> Iterator[tuple[str, NotifySocket]]:
    directory = Path(f"/tmp/tfs-notify-{os.getpid()}-{time.monotonic_ns()}")
    directory.mkdir()
    listener = NotifySocket(str(directory / "notify.sock"))
    yield str(directory / "notify.sock"), listener
    listener.sock.close()
    shutil.rmtree(directory, ignore_errors=True)


SLEEP = -2.0  # the echo handler's marker for a slow job


def test_a_drain_on_sigterm_extends_systemds_stop_timeout(
        supervisor_factory: Any, notify_socket: tuple[str, NotifySocket]) -> None:
    path, notify = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "LISTEN_FDS": "1",
           "LISTEN_FDNAMES": "x"}
    sup = supervisor_factory({"models": {"m": echo_model(1, sleep_on=SLEEP, sleep_seconds=3.0)}},
                             env=env)
    notify.wait_for("READY=1")
    worker = sup.workers("m")[0]["pid"]
    assert {"NOTIFY_SOCKET", "WATCHDOG_USEC"} <= set(proc_environ(sup.process.pid))
    assert not set(SYSTEMD_ONLY) & set(proc_environ(worker))  # only the supervisor's
    result: dict[str, Any] = {}

    def slow_job() -> None:
        with sup.client(timeout=60) as client:
            result["x"] = client.infer("m", {"x": np.full((1, 4), SLEEP, np.float32)})["x"]
        result["done_at"] = time.monotonic()

    job = threading.Thread(target=slow_job)
    job.start()
    sup.wait_for(lambda s: s["models"]["m"]["in_flight"] == 1, timeout=30, what="job running")
    sup.process.send_signal(signal.SIGTERM)
    try:
        notify.wait_for("EXTEND_TIMEOUT_USEC=", timeout=10)
    finally:
        job.join(60)
    assert sup.process.wait(30) == 0
    notify.pump(time.monotonic() + 0.3)
    extended = [(t, int(m.split("EXTEND_TIMEOUT_USEC=")[1])) for t, m in notify.messages
                if m.startswith("EXTEND_TIMEOUT_USEC=")]
    assert extended[0][0] < result["done_at"]  # asked for while the job was still running
    assert result["x"].tolist() == [[SLEEP] * 4]  # the drain finished the job
    bound = min(EXTEND_AHEAD, 30 + STOP_GRACE + EXIT_MARGIN) * 1e6
    assert all(0 < usec <= bound for _, usec in extended), extended
    assert notify.index("STOPPING=1") < notify.index("EXTEND_TIMEOUT_USEC=")
    assert "EXTEND_TIMEOUT_USEC=" not in "".join(m for _, m in notify.messages[
        :notify.index("STOPPING=1")])  # only while stopping
