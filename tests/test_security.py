"""Security and several hosts: CURVE, socket permissions, input limits, failover."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
import zmq.auth

from supervisor.aclient import AsyncClient
from supervisor.client import BadRequest, Client, JobError, NoReply
from supervisor.config.loading import parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.shared.protocol import HEARTBEAT, READY, Message, encode
from tests.conftest import echo_model, short_tmpdir

X = {"x": np.ones((2, 4), np.float32)}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _errors(text: str) -> str:
    with pytest.raises(ConfigErrors) as info:
        parse_config(text)
    return str(info.value)


MODEL = "models: {m: {handler: 'worker.handlers:echo'}}\n"


def test_exposed_tcp_needs_curve_or_an_explicit_insecure() -> None:
    assert "without encryption" in _errors(MODEL + "supervisor: {endpoints: ['tcp://*:5555']}")
    assert "without encryption" in _errors(
        MODEL + "supervisor: {endpoints: ['tcp://10.1.2.3:5555']}")
    parse_config(MODEL + "supervisor: {endpoints: ['tcp://127.0.0.1:5555']}")
    parse_config(MODEL + "supervisor: {endpoints: ['tcp://[::1]:5555', 'tcp://localhost:1']}")
    parse_config(MODEL + "supervisor: {endpoints: ['tcp://*:5555'], insecure: true}")
    parse_config(MODEL + "supervisor: {endpoints: ['tcp://*:5555'], curve: "
                 "{server_secret_key: s, authorized_clients: d}}")
    assert "TCP control endpoint" in _errors(MODEL + "supervisor: {control: 'tcp://127.0.0.1:1'}")
    assert "both server_secret_key and authorized_clients" in _errors(
        MODEL + "supervisor: {curve: {server_secret_key: s}}")


def test_ipc_sockets_exclude_other_users(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    assert stat.S_IMODE(os.stat(sup.runtime_dir).st_mode) == 0o750
    for name in ("frontend.sock", "control.sock", "private/backend.sock"):
        mode = stat.S_IMODE(os.stat(sup.runtime_dir / name).st_mode)
        assert mode == 0o660, (name, oct(mode))
    # recycle and reload: the service user only, unless admin_group says otherwise
    assert stat.S_IMODE(os.stat(sup.runtime_dir / "admin.sock").st_mode) == 0o600
    # Workers only: clients share the runtime dir's group, not the backend's directory.
    assert stat.S_IMODE(os.stat(sup.runtime_dir / "private").st_mode) == 0o700


@pytest.fixture
def keys() -> Any:
    path = short_tmpdir()
    subprocess.run([sys.executable, "-m", "supervisor", "keygen", str(path)], check=True,
                   capture_output=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_curve_admits_authorized_clients_only(supervisor_factory: Any, keys: Path) -> None:
    port = _port()
    sup = supervisor_factory({"supervisor": {
        "endpoints": [f"tcp://127.0.0.1:{port}"],
        "curve": {"server_secret_key": str(keys / "server.key_secret"),
                  "authorized_clients": str(keys / "authorized_clients")}},
        "models": {"m": echo_model(1)}})
    endpoint = f"tcp://127.0.0.1:{port}"
    with Client(endpoint, timeout=5, server_key=str(keys / "server.key"),
                client_cert=str(keys / "client.key_secret")) as good:
        assert good.infer("m", X)["x"].shape == (2, 4)
    _, stranger = zmq.auth.create_certificates(str(keys), "stranger")
    with Client(endpoint, timeout=1.5, server_key=str(keys / "server.key"),
                client_cert=stranger) as bad, pytest.raises(NoReply):
        bad.infer("m", X)
    with Client(endpoint, timeout=1.5) as plain, pytest.raises(NoReply):
        plain.infer("m", X)  # no CURVE at all: the handshake cannot even start
    assert '"event": "handshake_denied"' in sup.log()
    # Keys are re-read on reload: authorize the stranger, and it is admitted.
    shutil.copy(keys / "stranger.key", keys / "authorized_clients" / "stranger.key")
    sup.admin("reload")  # answers once the reload is applied
    with Client(endpoint, timeout=5, server_key=str(keys / "server.key"),
                client_cert=stranger) as now_good:
        assert now_good.infer("m", X)["x"].shape == (2, 4)


@pytest.mark.parametrize(("limits", "inputs", "fragment"), [
    ({"max_elements": 100}, {"x": np.ones((26, 4), np.float32)}, "104 elements"),
    ({"max_arrays": 1}, {"x": np.ones((1, 4), np.float32), "y": np.ones(1, np.float32)},
     "at most 1 arrays"),
    ({"max_header_size": 200}, {f"x{'_' * 60}{i}": np.ones(1, np.float32) for i in range(4)},
     "header frame is"),
])
def test_input_limits(supervisor_factory: Any, limits: dict[str, Any],
                      inputs: dict[str, np.ndarray], fragment: str) -> None:
    sup = supervisor_factory({"supervisor": limits, "models": {"m": echo_model(1)}})
    with sup.client(timeout=5) as client:
        with pytest.raises(BadRequest, match=fragment):
            client.infer("m", inputs)
        assert client.infer("m", X)["x"].shape == (2, 4)


def test_client_fails_over_when_a_supervisor_is_killed(supervisor_factory: Any) -> None:
    ports = [_port(), _port()]
    sups = [supervisor_factory({"supervisor": {"endpoints": [f"tcp://127.0.0.1:{p}"]},
                                "models": {"m": echo_model(2, delay=0.01)}}) for p in ports]
    client = Client([f"tcp://127.0.0.1:{p}" for p in ports], timeout=20)
    outcomes: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def submit() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                out = client.infer("m", {"x": np.full((1, 4), i, np.float32)})
                result = "ok" if out["x"][0, 0] == i else "wrong"
            except JobError as exc:
                result = exc.code
            with lock:
                outcomes.append(result)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    def until(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"timed out: {what} ({len(outcomes)} answers)"
            time.sleep(0.05)

    until(lambda: len(outcomes) >= 50 and all(sum(w["jobs"] for w in s.workers("m"))
                                              for s in sups), "both supervisors serving")
    served_before = [sum(w["jobs"] for w in s.workers("m")) for s in sups]
    sups[0].process.kill()  # SIGKILL mid-run: its in-flight jobs are lost with it
    after_kill = len(outcomes)
    until(lambda: len(outcomes) >= max(after_kill + 60, 101), "answers after the kill")
    stop.set()
    for t in threads:
        t.join(30)
    client.close()
    assert all(n > 0 for n in served_before), served_before  # both took work
    assert len(outcomes) > 100
    assert set(outcomes) == {"ok"}, {o: outcomes.count(o) for o in set(outcomes)}


def test_async_client_fails_over_when_a_supervisor_is_killed(supervisor_factory: Any) -> None:
    ports = [_port(), _port()]
    sups = [supervisor_factory({"supervisor": {"endpoints": [f"tcp://127.0.0.1:{p}"]},
                                "models": {"m": echo_model(2, delay=0.01)}}) for p in ports]

    async def run() -> tuple[list[int], list[str]]:
        outcomes: list[str] = []
        stop = asyncio.Event()
        async with AsyncClient([f"tcp://127.0.0.1:{p}" for p in ports], timeout=20) as client:
            async def submit(seed: int) -> None:
                i = seed
                while not stop.is_set():
                    i += 8
                    try:
                        out = await client.infer("m", {"x": np.full((1, 4), i, np.float32)})
                        outcomes.append("ok" if out["x"][0, 0] == i else "wrong")
                    except JobError as exc:
                        outcomes.append(exc.code)

            async def until(condition: Any, what: str) -> None:
                deadline = time.monotonic() + 60
                while not condition():
                    assert time.monotonic() < deadline, f"timed out: {what}"
                    await asyncio.sleep(0.05)

            tasks = [asyncio.create_task(submit(seed)) for seed in range(8)]
            await until(lambda: len(outcomes) >= 50 and all(
                sum(w["jobs"] for w in s.workers("m")) for s in sups), "both serving")
            served = [sum(w["jobs"] for w in s.workers("m")) for s in sups]
            sups[0].process.kill()  # SIGKILL with calls out: they must be retried elsewhere
            after_kill = len(outcomes)
            await until(lambda: len(outcomes) >= max(after_kill + 60, 101),
                        "answers after the kill")
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return served, outcomes

    served_before, outcomes = asyncio.run(run())
    assert all(n > 0 for n in served_before), served_before  # both took work
    assert len(outcomes) > 100
    assert set(outcomes) == {"ok"}, {o: outcomes.count(o) for o in set(outcomes)}


def test_client_moves_on_from_a_supervisor_that_is_shutting_down(
        supervisor_factory: Any) -> None:
    ports = [_port(), _port()]
    sups = [supervisor_factory({"supervisor": {"endpoints": [f"tcp://127.0.0.1:{p}"],
                                               "shutdown_timeout": "5s"},
                                "models": {"m": echo_model(1, sleep_on=-2.0,
                                                           sleep_seconds=3.0)}})
            for p in ports]
    held: dict[str, Any] = {}
    with Client(f"tcp://127.0.0.1:{ports[0]}", timeout=10) as holder:
        slow = threading.Thread(target=lambda: held.update(out=holder.infer("m", {
            "x": np.full((1, 4), -2.0, np.float32)})))
        slow.start()
        time.sleep(0.3)
        sups[0].process.send_signal(signal.SIGTERM)  # drains for up to 3 s, refusing work
        time.sleep(0.3)
        with Client([f"tcp://127.0.0.1:{p}" for p in ports], timeout=10) as client:
            for _ in range(6):
                assert client.infer("m", X)["x"].shape == (2, 4)
        slow.join(15)
    assert held["out"]["x"][0, 0] == -2.0  # the draining supervisor finished its job


def test_keygen_never_replaces_keys_silently_and_keeps_secrets_private(keys: Path) -> None:
    secret = (keys / "server.key_secret").read_bytes()
    again = subprocess.run([sys.executable, "-m", "supervisor", "keygen", str(keys)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "--force" in again.stderr
    assert (keys / "server.key_secret").read_bytes() == secret
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
    for name in ("server.key_secret", "client.key_secret"):
        assert stat.S_IMODE(os.stat(keys / name).st_mode) == 0o600
    forced = subprocess.run([sys.executable, "-m", "supervisor", "keygen", str(keys),
                             "--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0
    assert (keys / "server.key_secret").read_bytes() != secret


def test_keygen_keeps_a_directory_of_authorized_clients(keys: Path) -> None:
    other = short_tmpdir()
    try:
        (other / "authorized_clients").mkdir()
        shutil.copy(keys / "client.key", other / "authorized_clients" / "client.key")
        kept = (other / "authorized_clients" / "client.key").read_bytes()
        out = subprocess.run([sys.executable, "-m", "supervisor", "keygen", str(other)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "authorized_clients/client.key" in out.stderr
        assert (other / "authorized_clients" / "client.key").read_bytes() == kept
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_peer_without_the_spawn_secret_is_not_a_worker(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"heartbeat_interval": "0.2s",
                                             "heartbeat_timeout": "1s"},
                              "models": {"m": echo_model(1)}})
    [worker] = sup.workers("m")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"m-2")  # the next worker's id: predictable
    sock.connect(f"ipc://{sup.runtime_dir}/private/backend.sock")
    try:
        fake = {"a": 2**63 - 1}
        for _ in range(20):
            sock.send_multipart(encode(Message(READY, b"", {"worker": "m-2"})))
            sock.send_multipart(encode(Message(HEARTBEAT, b"", {
                "worker": worker["id"], "tf_memory": fake, "secret": "0" * 32})))
            time.sleep(0.05)
        status = sup.wait_for(lambda s: '"event": "backend_stranger"' in sup.log(), 30,
                              "the stranger logged")
    finally:
        sock.close()
    [seen] = status["models"]["m"]["workers"]
    assert seen["id"] == worker["id"] and seen["tf_memory"] != fake
    with sup.client(timeout=30) as client:
        assert client.infer("m", {"x": np.ones((1, 4), np.float32)})["x"][0, 0] == 1.0


def test_a_certificate_that_is_no_regular_file_is_refused_without_blocking(
        tmp_path: Path) -> None:
    """zmq.auth.load_certificate opens what it is given: a FIFO named as the server's key
    hung `check` (and would hang the daemon's start), /dev/zero would never end."""
    from supervisor.client.curve import make_curve_client
    from supervisor.shared.certificates import load_certificate

    fifo = tmp_path / "server.key_secret"
    os.mkfifo(fifo)
    big = tmp_path / "big.key"
    big.write_bytes(b"#" * (64 * 1024 + 1))
    for path in (fifo, Path("/dev/zero"), tmp_path, big):
        with pytest.raises(ValueError, match="not a regular file of at most 65536 bytes"):
            load_certificate(path)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        with pytest.raises(ValueError, match=str(fifo)):
            make_curve_client(sock, b"x" * 40, str(fifo))
    finally:
        sock.close(linger=0)
    clients = tmp_path / "clients"
    clients.mkdir()
    zmq.auth.create_certificates(str(clients), "c")
    (clients / "c.key_secret").unlink()
    config = tmp_path / "config.yaml"
    config.write_text(f"supervisor: {{curve: {{server_secret_key: {fifo}, "
                      f"authorized_clients: {clients}}}}}\n"
                      "models: {m: {handler: 'worker.handlers:echo'}}\n")
    out = subprocess.run([sys.executable, "-m", "supervisor", "check", "-c", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"server_secret_key: {fifo}: not a regular file" in out.stdout + out.stderr


def test_loopback_is_told_by_address_not_by_how_it_is_spelled() -> None:
    """Every spelling of loopback needs no CURVE; a host name that merely begins with
    "127." is not loopback, and was let through without encryption."""
    for host in ("127.0.0.1", "127.1.2.3", "[::1]", "[0:0:0:0:0:0:0:1]",
                 "[::ffff:127.0.0.1]", "localhost", "LOCALHOST", "ip6-localhost", "lo"):
        parse_config(MODEL + f"supervisor: {{endpoints: ['tcp://{host}:5555']}}")
    for host in ("127.attacker.example", "10.0.0.1", "[::2]", "[::ffff:10.0.0.1]",
                 "0.0.0.0", "*", "eth0"):
        assert "without encryption" in _errors(
            MODEL + f"supervisor: {{endpoints: ['tcp://{host}:5555']}}"), host
