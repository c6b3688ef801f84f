"""What Kubernetes runs against the daemon: per-model readiness and the preStop drain.

- `status --ready --model NAME` answers for the named models (a probe that names a model the
  daemon does not serve fails), not only for the required ones.
  A probe that fails says why, in one line.
- `drain` (the preStop hook) starts the drain at once: readiness fails, new jobs are
  answered shutting_down (a failover client sends them elsewhere), the job in flight is
  answered, and it returns once no job is left, before the daemon exits. The SIGTERM the
  kubelet sends after the hook then ends the daemon with status 0. A config it cannot read,
  or a daemon of another user, is an error (exit 1), never 'nothing to drain'.
- Every --timeout is a finite number of seconds above 0.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from supervisor.client import JobError, resolve_endpoints
from supervisor.testing import short_tmpdir
from tests.conftest import echo_model

CLI = [sys.executable, "-m", "supervisor"]
SLOW = -2.0  # the echo handler's marker for a slow job


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_ready_per_model(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {
        "m": echo_model(1),
        "optional": {"handler": "worker.handlers:broken", "workers": 1, "required": False}}},
        wait=False)
    sup.wait_for(lambda s: s["ready"] and s["models"]["optional"]["last_error"],
                 timeout=60, what="m ready, optional failing to load")
    config = str(sup.config_path)

    def probe(*models: str) -> subprocess.CompletedProcess[str]:
        return cli("status", "-c", config, "--ready",
                   *[a for m in models for a in ("--model", m)])

    def ready(*models: str) -> int:
        return probe(*models).returncode

    def why(*models: str) -> str:
        out = probe(*models)  # the kubelet shows both streams; stdout stays empty
        assert out.stderr.count("\n") <= 1 and not out.stdout, out
        return out.stderr.strip()

    assert ready() == 0  # the daemon's own answer: 'optional' is not required
    assert ready("m") == 0
    assert ready("optional") == 1  # named: it counts, required or not
    assert ready("m", "optional") == 1
    assert ready("nope") == 1  # a model this daemon does not serve is not ready
    # A failed probe says why, in one line (what the kubelet's event shows).
    assert why("nope") == "not ready: this supervisor does not serve 'nope' (it serves m, " \
        "optional)"
    line = why("m", "optional")
    assert line.startswith("not ready: no ready worker for 'optional' (") and \
        "last error:" in line, line
    assert why("m") == ""  # ready: nothing printed
    sup.stop()
    assert ready("m") != 0
    assert why("m").startswith("not ready: no_reply: no socket at ")


def test_drain_answers_the_job_in_flight_then_lets_the_kubelets_sigterm_end_it(
        supervisor_factory: Any) -> None:
    release = short_tmpdir() / "release"  # the job in flight ends when this file exists
    sup = supervisor_factory({"models": {"m": {
        "handler": "tests.live_handlers:Gated", "workers": 1,
        "options": {"marker": SLOW, "release": str(release)}}},
        "supervisor": {"shutdown_timeout": "30s"}})
    config = str(sup.config_path)
    result: dict[str, Any] = {}

    def slow_job() -> None:
        with sup.client(timeout=60) as client:
            result["x"] = client.infer("m", {"x": np.full((1, 4), SLOW, np.float32)})["x"]
        result["at"] = time.monotonic()

    job = threading.Thread(target=slow_job)
    job.start()
    sup.wait_for(lambda s: s["models"]["m"]["in_flight"] == 1, timeout=30, what="job running")
    drain = subprocess.Popen([*CLI, "drain", "-c", config], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        sup.wait_for(lambda s: not s["serving"], timeout=30, what="drain started")
        probe = cli("status", "-c", config, "--ready", "--model", "m")
        assert probe.returncode == 1  # out of the Service
        assert probe.stderr.startswith("not ready: the supervisor is stopping"), probe
        shown = cli("status", "-c", config).stdout  # and the table says so too
        assert shown.startswith("STOPPING: draining") and "m: DRAINING" in shown, shown
        assert "m: available" not in shown
        with sup.client(timeout=30) as client, pytest.raises(JobError) as refused:
            client.infer("m", {"x": np.ones((1, 4), np.float32)})
        assert refused.value.code == "shutting_down"  # a failover client goes elsewhere
        release.touch()
        out, _ = drain.communicate(timeout=60)
    finally:
        release.touch()
        if drain.poll() is None:
            drain.kill()
        job.join(60)
        shutil.rmtree(release.parent, ignore_errors=True)
    finished = time.monotonic()
    assert drain.returncode == 0, out
    assert result["x"].tolist() == [[SLOW] * 4]  # the job in flight was answered
    assert result["at"] <= finished
    # The kubelet's SIGTERM comes after the hook: the daemon, stopping its idle workers,
    # exits 0. Only a SIGTERM that lands while the interpreter tears down (Python has put
    # the default action back by then) ends it by the signal here; as a container's PID 1
    # the kernel drops a signal whose action is the default (pid_namespaces(7)), so there
    # it exits 0 as well (tests/test_container.py runs it as PID 1).
    if sup.process.poll() is None:
        sup.process.send_signal(signal.SIGTERM)
    assert sup.process.wait(30) in (0, -signal.SIGTERM)
    events = [json.loads(line) for line in sup.log().splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert names.count("shutdown_started") == 1
    assert "shutdown_jobs_abandoned" not in names, events
    # Nothing left to drain, and no daemon at all: both exit 0.
    assert cli("drain", "-c", config).returncode == 0


def test_drain_with_nothing_running(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"supervisor: {{runtime_dir: {tmp_path / 'run'}}}\n"
                      "models: {m: {handler: 'worker.handlers:echo'}}\n")
    out = cli("drain", "-c", str(config))
    assert out.returncode == 0 and "nothing to drain" in out.stdout, out


def test_the_lock_the_daemon_takes_is_the_one_drain_reads(tmp_path: Path) -> None:
    """One owner of the instance lock's format: what InstanceLock writes, holder reads; a
    file left by a supervisor that is gone names nobody."""
    import os

    from supervisor.daemon.instance_lock import AlreadyRunning, InstanceLock, holder

    lock = InstanceLock(tmp_path)
    assert holder(lock.path) is None  # no file
    lock.acquire()
    try:
        assert holder(lock.path) == os.getpid()
        with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}"):
            InstanceLock(tmp_path).acquire()
    finally:
        lock.release()
    lock.path.write_text("4242\n")  # left behind, unlocked
    assert holder(lock.path) is None


def test_a_headless_service_name_resolves_to_one_endpoint_per_pod() -> None:
    """resolve_endpoints gives the client every address behind a name (each pod of a
    headless Service); addresses and ipc endpoints pass through."""
    found = resolve_endpoints("tcp://localhost:5555")
    assert "tcp://127.0.0.1:5555" in found and len(found) == len(set(found))
    assert all(e.startswith("tcp://") and e.endswith(":5555") for e in found)
    assert resolve_endpoints("tcp://10.0.0.7:5555") == ["tcp://10.0.0.7:5555"]
    assert resolve_endpoints("tcp://[::1]:5555") == ["tcp://[::1]:5555"]
    assert resolve_endpoints("ipc:///run/tfsupervisor/frontend.sock") == [
        "ipc:///run/tfsupervisor/frontend.sock"]
    with pytest.raises(ValueError):
        resolve_endpoints("tcp://localhost")
    with pytest.raises(OSError):
        resolve_endpoints("tcp://no-such-service.invalid:5555")


def test_drain_of_an_idle_daemon_ends_it_and_exits_0(supervisor_factory: Any) -> None:
    """Nothing to wait for: the daemon may be gone before drain first looks (docs: the hook
    then returns after it, which the kubelet may report; nothing was lost)."""
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    out = cli("drain", "-c", str(sup.config_path))
    assert out.returncode == 0, out
    assert "stopped answering: drained" in out.stdout or "no job left" in out.stdout, out
    assert sup.process.wait(30) == 0


def test_drain_fails_when_its_config_cannot_be_read(
        supervisor_factory: Any, tmp_path: Path) -> None:
    """A config drain cannot read names no daemon: that is an error (exit 1, with the
    reason), not 'nothing to drain', and the daemon serves on. A config that parses but no
    longer validates still finds the daemon it names, and drains it."""
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    junk = tmp_path / "junk.yaml"
    junk.write_text("{{{\n")
    out = cli("drain", "-c", str(junk))
    assert out.returncode == 1, out
    assert "cannot use" in out.stderr and "not valid YAML" in out.stderr, out
    assert "nothing to drain" not in out.stdout
    out = cli("drain", "-c", str(tmp_path / "absent.yaml"))
    assert out.returncode == 1 and "cannot read" in out.stderr, out
    sup.wait_for(lambda s: s["serving"], timeout=10, what="still serving")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(f"supervisor: {{runtime_dir: {sup.runtime_dir}, poll_interval: -1}}\n"
                       "models: {m: {handler: 'worker.handlers:echo'}}\n")
    out = cli("drain", "-c", str(invalid))
    assert out.returncode == 0, out
    assert "stopped answering: drained" in out.stdout or "no job left" in out.stdout, out
    assert sup.process.wait(30) == 0


def test_drain_not_permitted_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """drain run as another user than the supervisor's: a clear error and exit 1, not a
    traceback. (Run here as whatever user the tests are: the denials are simulated where
    the kernel would give them.)"""
    import fcntl
    import os

    from supervisor.cli.commands import main as cli_main
    from supervisor.daemon.instance_lock import LOCK_NAME

    run = tmp_path / "run"
    run.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"supervisor: {{runtime_dir: {run}}}\n"
                      "models: {m: {handler: 'worker.handlers:echo'}}\n")
    lock = run / LOCK_NAME
    lock.write_text("4242\n")
    held = os.open(lock, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # a live supervisor holds it
    try:
        def kill(pid: int, sig: int) -> None:
            raise PermissionError(1, "Operation not permitted")

        with monkeypatch.context() as patch:
            patch.setattr(os, "kill", kill)
            assert cli_main(["drain", "-c", str(config)]) == 1
        err = capsys.readouterr().err
        assert "not permitted to signal supervisor 4242" in err, err
        real_open = os.open

        def denied(path: Any, *args: Any, **kwargs: Any) -> int:
            if str(path) == str(lock):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(os, "open", denied)
            assert cli_main(["drain", "-c", str(config)]) == 1
        err = capsys.readouterr().err
        assert f"not permitted to read {lock}" in err, err
    finally:
        os.close(held)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "0", "-1", "soon"])
def test_every_timeout_is_a_finite_positive_number_of_seconds(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """nan never runs out, inf and 1e300 overflow the poll (a traceback), 0 or less gives
    up before asking ('reading config took longer than -1s'): argparse refuses them all."""
    from supervisor.cli.commands import build_parser

    commands = [["status"], ["explain", "m"], ["tune"], ["recycle", "m"], ["reload"],
                ["infer", "m"], ["drain"]]
    for command in commands:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([*command, "--timeout", value])
        assert exited.value.code == 2, command
        assert "--timeout" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["top", "--interval", value])
    for command in commands:  # what stays accepted
        assert build_parser().parse_args([*command, "--timeout", "2.5"]).timeout == 2.5


@pytest.mark.parametrize("endpoint", [
    "garbage", "", "udp://host:5555", "TCP://host:5555", "tcp://localhost:\uff15\uff15\uff15\uff15",
    "tcp://::1:5555", "tcp://[::1:5555", "tcp://[nope]:5555", "tcp://host:0", "tcp://host:65536",
    "tcp://host:-1", "tcp://:5555", "tcp://*:5555", "tcp://a b:5555", "ipc://",
    "tcp://" + "a" * 70 + ".example.com:5555", None, 5555])
def test_resolve_endpoints_refuses_what_is_not_an_endpoint(endpoint: Any) -> None:
    """A clear ValueError, never an endpoint handed back unchanged for ZeroMQ to choke on
    later, nor a UnicodeError (a label over 63 characters) or an AttributeError (None)."""
    with pytest.raises(ValueError) as refused:
        resolve_endpoints(endpoint)
    assert "tcp://" in str(refused.value) or "host name" in str(refused.value)


def _ipv6_loopback_port() -> int | None:
    """A free port on ::1, or None where this host has no IPv6 loopback."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            return int(s.getsockname()[1])
    except OSError:
        return None


def _ipv4_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ipv6_endpoints_serve_clients(supervisor_factory: Any) -> None:
    """An IPv6 address in brackets, as resolve_endpoints gives it for an IPv6 pod: the
    daemon binds it (the frontend and a TCP admin socket) and the client's sockets reach it
    (Client, AsyncClient, control), which ZeroMQ does only with its IPV6 option on. IPv4
    beside it is unchanged, and names keep resolving to IPv4 (the option stays off for
    them: with it on, a name with both families would resolve to IPv6 only)."""
    import asyncio

    from supervisor.aclient import AsyncClient
    from supervisor.client import Client
    from supervisor.client.client import JobError, NoReply, control
    from supervisor.shared.transport import ipv6_for

    assert ipv6_for("tcp://[::1]:5555") == 1 and ipv6_for("tcp://*:5555") == 1
    assert ipv6_for("tcp://localhost:5555") == 0 and ipv6_for("tcp://10.0.0.7:5555") == 0
    assert ipv6_for("ipc:///run/x.sock") == 0
    port6, admin6 = _ipv6_loopback_port(), _ipv6_loopback_port()
    if port6 is None or admin6 is None:  # no IPv6 on this host: IPv4 must still work
        ips = Path("/proc/net/if_inet6")
        assert not ips.exists() or "00000000000000000000000000000001" not in ips.read_text()
        return
    port4 = _ipv4_port()
    supervisor_factory({"supervisor": {
        "endpoints": [f"tcp://[::1]:{port6}", f"tcp://127.0.0.1:{port4}"],
        "admin": f"tcp://[::1]:{admin6}", "insecure": True},
        "models": {"m": echo_model(1)}})
    x = np.full((1, 4), 3.0, np.float32)
    for endpoint in (f"tcp://[::1]:{port6}", f"tcp://127.0.0.1:{port4}",
                     *resolve_endpoints(f"tcp://localhost:{port4}")):
        with Client(endpoint, timeout=20) as client:
            assert client.infer("m", {"x": x})["x"].tolist() == x.tolist(), endpoint

    async def async_infer() -> Any:
        async with AsyncClient(f"tcp://[::1]:{port6}", timeout=20) as client:
            return await client.infer("m", {"x": x})

    assert asyncio.run(async_infer())["x"].tolist() == x.tolist()
    try:  # the admin socket answers over IPv6 (a refusal is an answer too)
        control(f"tcp://[::1]:{admin6}", "status", timeout=10)
    except NoReply:
        raise AssertionError("no answer from the admin socket on [::1]") from None
    except JobError:
        pass
