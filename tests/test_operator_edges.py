"""The edges an operator hits: who may change the service, revoked keys, a bad edit on disk,
a start that cannot happen, readiness with a model that cannot load, `check` on this host.
Real daemons, real sockets, real users (a forked child that drops to uid 65534)."""

from __future__ import annotations

import dataclasses
import grp
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zmq.auth

from supervisor.cli.preflight import preflight
from supervisor.client import Client, JobError, NoReply, control
from supervisor.client.testing import start_supervisor
from supervisor.config.loading import control_endpoints, parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.daemon.daemon import CONFIG_READ_TIMEOUT
from supervisor.shared.exitcodes import DaemonExit
from tests.conftest import echo_model, short_tmpdir

X = {"x": np.ones((1, 4), np.float32)}
CLI = [sys.executable, "-m", "supervisor"]
NOBODY = 65534  # Debian's nobody / nogroup


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- who may change the service -------------------------------------------------------------


def test_the_status_endpoint_refuses_recycle_and_reload(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    for command in ("recycle", "reload"):
        with pytest.raises(JobError, match="admin endpoint"):
            control(sup.control_endpoint, command, timeout=10, model="m")
    assert sup.status()["models"]["m"]["recycles"] == {}
    assert sup.admin("recycle", model="m")["scheduled"]  # the admin endpoint takes it
    assert sup.admin("status")["models"]["m"]  # and answers status too


def _as_nobody(endpoint: str, command: str) -> str:
    """`command` sent from a forked child running as uid/gid 65534: 'ok', or why not.
    Fork, not exec: the child needs no file of this checkout, only the socket."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, then try
        outcome = "error"
        try:
            os.setgroups([NOBODY])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            control(endpoint, command, timeout=3, model="m")
            outcome = "ok"
        except NoReply:
            outcome = "no reply"
        except BaseException as exc:  # anything else is reported, never raised in the fork
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(writer, outcome.encode()[:4000])
            os._exit(0)
    os.close(writer)
    try:
        with os.fdopen(reader, "rb") as pipe:
            return pipe.read().decode()
    finally:
        os.waitpid(pid, 0)


def test_a_socket_group_member_reads_status_but_cannot_reach_admin(
        supervisor_factory: Any) -> None:
    group = grp.getgrgid(NOBODY).gr_name
    sup = supervisor_factory({"supervisor": {"socket_group": group},
                              "models": {"m": echo_model(1)}})
    os.chmod(sup.runtime_dir.parent, 0o711)  # let others walk to the runtime dir
    assert _as_nobody(sup.control_endpoint, "status") == "ok"
    assert _as_nobody(sup.admin_endpoint, "recycle") == "no reply"  # 0600, root's
    assert sup.status()["models"]["m"]["recycles"] == {}
    # Sanity of the probe itself: the same child, as root, reaches the admin endpoint.
    assert sup.admin("recycle", model="m")["scheduled"]


def test_socket_group_is_given_to_the_service_managers_runtime_dir_only(
        supervisor_factory: Any, workdir: Path) -> None:
    """systemd's RuntimeDirectory= is made for the service: socket_group still applies to
    it (its mode stays systemd's). Any other existing directory keeps its group."""
    group = grp.getgrgid(NOBODY).gr_name
    for service in (True, False):
        existing = (workdir / f"existing-{service}").resolve()
        existing.mkdir(mode=0o750)
        os.chmod(existing, 0o750)
        env = {"RUNTIME_DIRECTORY": str(existing)} if service else {}
        sup = supervisor_factory({"supervisor": {"socket_group": group,
                                                 "runtime_dir": str(existing)},
                                  "models": {"m": echo_model(1)}}, wait=False, env=env)
        sup = dataclasses.replace(sup, runtime_dir=existing)
        sup.wait_ready()
        info = os.stat(existing)
        assert stat.S_IMODE(info.st_mode) == 0o750
        assert info.st_gid == (NOBODY if service else 0), (service, info.st_gid)
        assert os.stat(existing / "control.sock").st_gid == NOBODY
        sup.stop()


def test_admin_group_opens_the_admin_socket_to_its_members(supervisor_factory: Any) -> None:
    group = grp.getgrgid(NOBODY).gr_name
    sup = supervisor_factory({"supervisor": {"socket_group": group, "admin_group": group},
                              "models": {"m": echo_model(1)}})
    os.chmod(sup.runtime_dir.parent, 0o711)
    admin = sup.runtime_dir / "admin.sock"
    assert stat.S_IMODE(os.stat(admin).st_mode) == 0o660 and os.stat(admin).st_gid == NOBODY
    assert _as_nobody(sup.admin_endpoint, "recycle") == "ok"


def _curve_sup(supervisor_factory: Any, keys: Path, admin_port: int | None = None) -> Any:
    curve = {"server_secret_key": str(keys / "server.key_secret"),
             "authorized_clients": str(keys / "authorized_clients")}
    sup_section: dict[str, Any] = {"endpoints": [f"tcp://127.0.0.1:{_port()}"],
                                   "curve": curve}
    if admin_port is not None:
        (keys / "admins").mkdir()
        shutil.copy(keys / "admin.key", keys / "admins" / "admin.key")
        curve["admin_clients"] = str(keys / "admins")
        sup_section["admin"] = f"tcp://127.0.0.1:{admin_port}"
    return supervisor_factory({"supervisor": sup_section, "models": {"m": echo_model(1)}})


@pytest.fixture
def keys(workdir: Path) -> Path:
    out = _cli("keygen", str(workdir / "keys"))
    assert out.returncode == 0, out.stderr
    for name in ("stranger", "admin"):
        zmq.auth.create_certificates(str(workdir / "keys"), name)
    return workdir / "keys"


def test_a_tcp_admin_endpoint_admits_admin_keys_only(supervisor_factory: Any,
                                                     keys: Path) -> None:
    port = _port()
    _curve_sup(supervisor_factory, keys, admin_port=port)
    endpoint = f"tcp://127.0.0.1:{port}"
    server = str(keys / "server.key")
    # An ordinary client key, good for jobs, is refused at the admin handshake.
    with pytest.raises(NoReply):
        control(endpoint, "recycle", timeout=2, model="m", server_key=server,
                client_cert=str(keys / "client.key_secret"))
    result = control(endpoint, "recycle", timeout=10, model="m", server_key=server,
                     client_cert=str(keys / "admin.key_secret"))
    assert result["scheduled"]


def _admitted(endpoint: str, keys: Path, name: str) -> bool:
    """Whether the client with key pair NAME gets a job answered (refused: no reply)."""
    with Client(endpoint, timeout=2, server_key=str(keys / "server.key"),
                client_cert=str(keys / f"{name}.key_secret")) as client:
        try:
            return bool(client.infer("m", X)["x"].shape == (1, 4))
        except NoReply:
            return False


def _break(authorized: Path, keys: Path, breakage: str) -> None:
    if breakage == "empty key file":
        (authorized / "extra.key").write_bytes(b"")
    elif breakage == "a fifo":  # reading it would block the daemon's loop for good
        os.mkfifo(authorized / "extra.key")
    elif breakage == "a link to /dev/zero":  # reading it would never end
        (authorized / "extra.key").symlink_to("/dev/zero")
    elif breakage == "a secret key":
        shutil.copy(keys / "stranger.key_secret", authorized / "extra.key")
    else:
        (authorized / "extra.key").write_text("public-key = 'short'\n")


@pytest.mark.parametrize("breakage", ["empty key file", "not a certificate", "a fifo",
                                      "a link to /dev/zero", "a secret key"])
def test_a_bad_key_file_is_skipped_and_said_while_a_removal_applies(
        supervisor_factory: Any, keys: Path, breakage: str) -> None:
    """OpenSSH's rule for authorized_keys: a bad entry is skipped and reported, the rest
    applies, and a removal always applies (it used to reject the whole reload, keeping the
    removed key admitted)."""
    authorized = keys / "authorized_clients"
    shutil.copy(keys / "stranger.key", authorized / "stranger.key")
    sup = _curve_sup(supervisor_factory, keys)
    endpoint = yaml.safe_load(sup.config_path.read_text())["supervisor"]["endpoints"][0]
    (authorized / "stranger.key").unlink()  # revoked, and a broken file beside it
    _break(authorized, keys, breakage)
    out = _cli("reload", "-c", str(sup.config_path))
    assert out.returncode == 0, out
    assert "warning: client key skipped: supervisor.curve.authorized_clients: " \
        f"{authorized / 'extra.key'} is not a usable public certificate" in out.stderr
    assert '"event": "curve_keys_skipped"' in sup.log()
    assert not _admitted(endpoint, keys, "stranger")
    with Client(endpoint, timeout=10, server_key=str(keys / "server.key"),
                client_cert=str(keys / "client.key_secret")) as client:
        assert client.infer("m", X)["x"].shape == (1, 4)  # the good key still admitted


@pytest.mark.parametrize("breakage", ["empty directory", "directory gone"])
def test_a_key_directory_that_holds_no_key_admits_no_one(
        supervisor_factory: Any, keys: Path, breakage: str) -> None:
    """Nothing in it can be shown to be still authorized: fail closed, and say so."""
    sup = _curve_sup(supervisor_factory, keys)
    endpoint = yaml.safe_load(sup.config_path.read_text())["supervisor"]["endpoints"][0]
    authorized = keys / "authorized_clients"
    if breakage == "empty directory":
        (authorized / "client.key").unlink()
    else:
        shutil.rmtree(authorized)
    out = _cli("reload", "-c", str(sup.config_path))
    assert out.returncode == 0 and "warning: client key skipped" in out.stderr, out
    assert not _admitted(endpoint, keys, "client")


def test_a_removal_applies_even_when_the_config_file_is_rejected(
        supervisor_factory: Any, keys: Path) -> None:
    shutil.copy(keys / "stranger.key", keys / "authorized_clients" / "stranger.key")
    sup = _curve_sup(supervisor_factory, keys)
    endpoint = yaml.safe_load(sup.config_path.read_text())["supervisor"]["endpoints"][0]
    (keys / "authorized_clients" / "stranger.key").unlink()
    sup.config_path.write_text(sup.config_path.read_text() + "\nnot: [valid\n")
    with pytest.raises(JobError, match="config rejected"):
        sup.admin("reload")
    assert not _admitted(endpoint, keys, "stranger")


def test_a_key_removed_from_the_directory_is_refused_after_reload(
        supervisor_factory: Any, keys: Path) -> None:
    shutil.copy(keys / "stranger.key", keys / "authorized_clients" / "stranger.key")
    sup = _curve_sup(supervisor_factory, keys)
    endpoint = yaml.safe_load(sup.config_path.read_text())["supervisor"]["endpoints"][0]
    stranger = {"server_key": str(keys / "server.key"),
                "client_cert": str(keys / "stranger.key_secret")}
    with Client(endpoint, timeout=10, **stranger) as client:
        assert client.infer("m", X)["x"].shape == (1, 4)
    (keys / "authorized_clients" / "stranger.key").unlink()  # revoked
    out = _cli("reload", "-c", str(sup.config_path))  # it said "reloaded: no changes"
    assert out.returncode == 0 and "client_keys authorized_clients 1 (1 removed)" in \
        out.stdout, out
    assert _cli("reload", "-c", str(sup.config_path)).stdout.startswith(
        "reloaded: no changes")  # nothing changed since
    with Client(endpoint, timeout=2, **stranger) as client, pytest.raises(NoReply):
        client.infer("m", X)
    with Client(endpoint, timeout=10, server_key=str(keys / "server.key"),
                client_cert=str(keys / "client.key_secret")) as client:
        assert client.infer("m", X)["x"].shape == (1, 4)


# --- a bad edit on disk ------------------------------------------------------------------------


def test_status_top_and_recycle_reach_the_daemon_through_a_broken_config(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    good = sup.config_path.read_text()
    sup.config_path.write_text(good + "\nsupervisor: {poll_interval: [not, a, duration]\n")
    out = _cli("status", "-c", str(sup.config_path))
    assert out.returncode == 0, out.stderr
    assert "does not validate" in out.stderr and "m-" in out.stdout
    assert _cli("status", "--ready", "-c", str(sup.config_path)).returncode == 0
    out = _cli("recycle", "-c", str(sup.config_path), "m")
    assert out.returncode == 0, out.stderr
    # reload: the daemon refuses the broken file, says why, logs and counts it
    out = _cli("reload", "-c", str(sup.config_path))
    assert out.returncode == 1 and "poll_interval" in out.stderr
    assert '"event": "config_rejected"' in sup.log()
    # With no config at all: --control / --admin name the endpoints.
    missing = str(sup.config_path.parent / "nowhere.yaml")
    out = _cli("status", "-c", missing, "--control", sup.control_endpoint, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["models"]["m"]
    out = _cli("recycle", "-c", missing, "--admin", sup.admin_endpoint, "m")
    assert out.returncode == 0, out.stderr


def test_a_reload_whose_new_workers_cannot_load_says_so_and_keeps_the_old_ones(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    config = yaml.safe_load(sup.config_path.read_text())
    # valid as a file (check passes), but no worker can ever load it
    config["models"]["m"]["handler"] = "worker.handlers:no_such_handler"
    sup.config_path.write_text(yaml.safe_dump(config))
    out = _cli("reload", "-c", str(sup.config_path), "--wait", "60", timeout=90)
    assert out.returncode == 1, out
    assert "m: new workers fail to start (the old ones serve on)" in out.stderr, out.stderr
    assert "no_such_handler" in out.stderr
    with sup.client() as client:  # the old worker serves on
        assert client.infer("m", X)["x"].shape == (1, 4)
    shown = _cli("status", "-c", str(sup.config_path))
    assert "NEW WORKERS FAIL TO START" in shown.stdout, shown.stdout
    # the same reload again (a deploy script's retry) is no success: tried again at once
    out = _cli("reload", "-c", str(sup.config_path), "--wait", "60", timeout=90)
    assert out.returncode == 1 and "reloaded: retried m" in out.stdout, out
    assert "no_such_handler" in out.stderr
    # put right: the next reload's new workers start, and --wait says so
    config["models"]["m"]["handler"] = "worker.handlers:echo"
    config["models"]["m"]["options"] = {"changed": True}
    sup.config_path.write_text(yaml.safe_dump(config))
    out = _cli("reload", "-c", str(sup.config_path), "--wait", "60", timeout=90)
    assert out.returncode == 0, out
    assert "serving on workers of the current settings and code: m" in out.stdout
    status = sup.status()["models"]["m"]
    assert status["last_error"] is None and len(status["workers"]) == 1


def test_control_endpoints_are_read_leniently(workdir: Path) -> None:
    config = workdir / "config.yaml"
    config.write_text("supervisor: {runtime_dir: rt, admin: 'ipc://{runtime_dir}/a.sock', "
                      "poll_interval: nope}\nmodels: {}\n")
    found = control_endpoints(config)
    assert found.control == f"ipc://{workdir.resolve()}/rt/control.sock"
    assert found.admin == f"ipc://{workdir.resolve()}/rt/a.sock"
    assert found.problems
    config.write_text("supervisor:\n  runtime_dir: rt2\n  control: 'ipc://{runtime_dir}/c.sock'"
                      "\nmodels: {m: [unclosed\n")  # not YAML any more: line by line
    assert control_endpoints(config).control == f"ipc://{workdir.resolve()}/rt2/c.sock"
    config.write_bytes(b"\xff\xfe{{{")  # nothing to go on: the defaults beside the file
    assert control_endpoints(config).control.endswith("/run/control.sock")


# --- start-up failures -------------------------------------------------------------------------


def _run(workdir: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = workdir / "config.yaml"
    config.setdefault("supervisor", {}).setdefault("runtime_dir", str(workdir / "run"))
    path.write_text(yaml.safe_dump(config))
    return _cli("run", "-c", str(path), "--log-format", "json", timeout=120)


def _one_failure(out: subprocess.CompletedProcess[str], code: DaemonExit) -> dict[str, Any]:
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert all(line.startswith("{") for line in lines), lines  # JSON, every line
    failures = [e for e in _events(out.stderr) if e["event"] == "supervisor_start_failed"]
    assert len(failures) == 1 and failures[0]["exit_code"] == code
    return failures[0]


def test_a_metrics_port_in_use_is_one_clear_error_and_leaves_nothing_behind(
        workdir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _run(workdir, {"supervisor": {"metrics": f"127.0.0.1:{port}"},
                             "models": {"m": echo_model(1)}})
    failure = _one_failure(out, DaemonExit.ADDRESS_IN_USE)
    assert f"127.0.0.1:{port}" in failure["error"]
    left = sorted(p.name for p in (workdir / "run").rglob("*") if not p.is_dir())
    assert left == [], left  # the ipc sockets bound before the failure, and the lock: gone


def test_a_frontend_port_in_use_is_one_clear_error(workdir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _run(workdir, {"supervisor": {"endpoints": [f"tcp://127.0.0.1:{port}"]},
                             "models": {"m": echo_model(1)}})
    assert f"tcp://127.0.0.1:{port}" in _one_failure(out, DaemonExit.ADDRESS_IN_USE)["error"]


def test_a_runtime_dir_that_cannot_be_created_is_one_clear_error(workdir: Path) -> None:
    (workdir / "file").write_text("not a directory")
    out = _run(workdir, {"supervisor": {"runtime_dir": str(workdir / "file" / "run")},
                         "models": {"m": echo_model(1)}})
    assert "runtime dir" in _one_failure(out, DaemonExit.RUNTIME_DIR)["error"]
    # The runtime dir itself a file: named as `check` names it, not mkdir's "File exists".
    out = _run(workdir, {"supervisor": {"runtime_dir": str(workdir / "file")},
                         "models": {"m": echo_model(1)}})
    error = _one_failure(out, DaemonExit.RUNTIME_DIR)["error"]
    assert f"is not a directory ({workdir / 'file'})" in error and "File exists" not in error


def test_a_shared_runtime_dir_is_never_changed_and_the_cli_still_finds_the_daemon(
        workdir: Path) -> None:
    """`runtime_dir: /tmp`, as it were: mode 1777, another user's file in it. The daemon
    keeps its sockets in a directory of its own inside it; the shared one keeps its mode and
    owner through a start, a clean stop and a failed start; `status` finds the sockets."""
    shared = workdir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.chown(shared, NOBODY, NOBODY)
    (shared / "theirs").write_text("another user's file")
    before = os.stat(shared)
    config = {"supervisor": {"runtime_dir": str(shared)}, "models": {"m": echo_model(1)}}
    sup = start_supervisor(config, workdir)
    try:
        sup = dataclasses.replace(sup, runtime_dir=shared / "tfsupervisor")
        sup.wait_ready()
        with sup.client() as client:
            assert client.infer("m", X)["x"].shape == (1, 4)
        out = _cli("status", "-c", str(sup.config_path), "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["models"]["m"], out.stderr
        assert stat.S_IMODE(os.stat(shared / "tfsupervisor").st_mode) == 0o750
        assert sup.stop() == 0
    finally:
        sup.stop()
    after = os.stat(shared)
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == \
        (stat.S_IMODE(before.st_mode), before.st_uid, before.st_gid) == (0o1777, NOBODY, NOBODY)
    # A failed start (the metrics port taken): the shared directory untouched still, and
    # the daemon's own directory, made by this start, gone.
    shutil.rmtree(shared / "tfsupervisor")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = _run(workdir, {"supervisor": {"runtime_dir": str(shared),
                                            "metrics": f"127.0.0.1:{taken.getsockname()[1]}"},
                             "models": {"m": echo_model(1)}})
    _one_failure(out, DaemonExit.ADDRESS_IN_USE)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert sorted(p.name for p in shared.iterdir()) == ["theirs"]


def test_a_runtime_dir_it_cannot_make_private_is_refused_in_one_line(workdir: Path) -> None:
    shared = workdir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    squatted = shared / "tfsupervisor"  # another user's, where the daemon's own would go
    squatted.mkdir()
    os.chown(squatted, NOBODY, NOBODY)
    out = _run(workdir, {"supervisor": {"runtime_dir": str(shared)},
                         "models": {"m": echo_model(1)}})
    error = _one_failure(out, DaemonExit.RUNTIME_DIR)["error"]
    assert str(squatted) in error and "another user" in error, error
    assert list(squatted.iterdir()) == [] and os.stat(squatted).st_uid == NOBODY
    check = _cli("check", "-c", str(workdir / "config.yaml"))  # `check` agrees with `run`
    assert check.returncode == 1 and "made by another user" in check.stdout + check.stderr
    # A directory every user may write to, not sticky, named as the runtime dir itself:
    # the daemon's own inside it too, never a chmod of it.
    open_dir = workdir / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    sup = start_supervisor({"supervisor": {"runtime_dir": str(open_dir)},
                            "models": {"m": echo_model(1)}}, workdir)
    try:
        sup = dataclasses.replace(sup, runtime_dir=open_dir / "tfsupervisor")
        sup.wait_ready()
        assert stat.S_IMODE(os.stat(open_dir).st_mode) == 0o777
    finally:
        sup.stop()


def test_a_config_that_cannot_be_used_is_one_json_event(workdir: Path) -> None:
    out = _run(workdir, {"supervisor": {"endpoints": ["tcp://0.0.0.0:5555"],
                                        "metrics": "127.0.0.1:99999"},
                         "models": {"m": echo_model(1)}})
    failure = _one_failure(out, DaemonExit.CONFIG)
    assert any("supervisor.metrics" in e for e in failure["errors"])
    assert any("supervisor.endpoints[0]" in e for e in failure["errors"])


def test_an_unknown_group_and_a_bad_key_directory_are_config_errors(workdir: Path,
                                                                    keys: Path) -> None:
    out = _run(workdir, {"supervisor": {"socket_group": "no-such-group-here"},
                         "models": {"m": echo_model(1)}})
    assert "no-such-group-here" in _one_failure(out, DaemonExit.CONFIG)["error"]
    (keys / "authorized_clients" / "client.key").unlink()
    out = _run(workdir, {"supervisor": {
        "endpoints": [f"tcp://127.0.0.1:{_port()}"],
        "curve": {"server_secret_key": str(keys / "server.key_secret"),
                  "authorized_clients": str(keys / "authorized_clients")}},
        "models": {"m": echo_model(1)}})
    assert "holds no client certificate" in _one_failure(out, DaemonExit.CONFIG)["error"]


# --- readiness ---------------------------------------------------------------------------------

BROKEN = {"handler": "worker.handlers:broken"}


@pytest.mark.parametrize("required", [True, False])
def test_readiness_with_a_model_that_cannot_load(supervisor_factory: Any,
                                                 required: bool) -> None:
    sup = supervisor_factory({"models": {"good": echo_model(1),
                                         "broken": {**BROKEN, "required": required}}},
                             wait=False)
    status = sup.wait_for(lambda s: not s["models"]["broken"]["available"] and
                          any(w["state"] == "ready" for w in s["models"]["good"]["workers"]),
                          what="good ready, broken unavailable")
    probe = _cli("status", "--ready", "-c", str(sup.config_path))
    if required:
        assert probe.returncode == 1 and not status["ready"]
        assert '"event": "serving"' not in sup.log()
    else:  # the broken model does not hold the others back
        status = sup.wait_for(lambda s: s["ready"], what="ready")
        assert _cli("status", "--ready", "-c", str(sup.config_path)).returncode == 0
        assert status["models"]["broken"]["required"] is False
    with sup.client(timeout=30) as client:
        assert client.infer("good", X)["x"].shape == (1, 4)


def test_a_model_whose_only_worker_is_starting_is_not_available(supervisor_factory: Any) -> None:
    """`status` said "available" while the model's only worker was still loading."""
    sup = supervisor_factory({"models": {"m": echo_model(1, startup_seconds=600)}}, wait=False)
    status = sup.wait_for(lambda s: [w["state"] for w in s["models"]["m"]["workers"]] ==
                          ["starting"], what="its worker starting")
    assert status["models"]["m"]["available"] is False
    assert status["models"]["m"]["last_error"] is None
    out = _cli("status", "-c", str(sup.config_path))
    assert "STARTING: no worker ready yet" in out.stdout and "available" not in out.stdout, \
        out.stdout


def test_a_handlers_own_exit_while_serving_is_not_called_a_load_error(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1, exit_on=-3.0, exit_code=3)}})
    with sup.client(timeout=30) as client, pytest.raises(JobError):
        client.infer("m", {"x": np.full((1, 4), -3.0, np.float32)})
    status = sup.wait_for(lambda s: s["models"]["m"]["last_unexpected_exit"] is not None,
                          what="the exit recorded")
    told = status["models"]["m"]["last_unexpected_exit"]["exit"]
    assert told.startswith("exit 3 (while serving") and "LOAD_ERROR" not in told, told
    died = [e for e in _events(sup.log()) if e["event"] == "worker_died"]
    assert died and "LOAD_ERROR" not in died[0]["exit"], died


def test_a_models_last_error_names_the_worker_that_failed_last(supervisor_factory: Any) -> None:
    """Workers that exit 3 while loading without a word: each failure is its own, not the
    first one's message again (which named the first worker)."""
    sup = supervisor_factory({"models": {"m": echo_model(1, startup_exit=3)}}, wait=False)

    def failed() -> list[dict[str, Any]]:
        return [e for e in _events(sup.log()) if e["event"] == "worker_boot_failed"]

    sup.wait_for(lambda s: len(failed()) >= 3, what="three workers failed to load")
    events = failed()
    assert len({e["worker"] for e in events}) == len(events)
    for event in events:
        assert f"worker {event['worker']} exited before ready" in event["error"], events
    before = failed()
    error = sup.status()["models"]["m"]["last_error"]
    recent = [e["worker"] for e in failed()[len(before) - 1:]]  # the last, or a newer one
    assert any(error.startswith(f"worker {w} exited before ready") for w in recent), \
        (error, recent)


# --- check -------------------------------------------------------------------------------------


def test_check_verifies_what_this_host_must_have(workdir: Path) -> None:
    (workdir / "file").write_text("")
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "supervisor": {"runtime_dir": str(workdir / "file" / "run"),
                       "socket_group": "no-such-group-here"},
        "models": {"a": {"saved_model": "missing/model"},
                   "b": {"keras": "missing.keras"},
                   "c": {"handler": "no_such_module_anywhere:make"},
                   "d": echo_model(1)}}))
    out = _cli("check", "-c", str(config))
    assert out.returncode == 1
    for fragment in ("models.a.saved_model", "no such directory", "models.b.keras",
                     "warning: models.c.handler", "supervisor.runtime_dir",
                     "supervisor.socket_group"):
        assert fragment in out.stderr, (fragment, out.stderr)
    assert "models.d" not in out.stderr


def test_check_passes_a_runnable_config_and_reads_key_directories(workdir: Path,
                                                                  keys: Path) -> None:
    text = yaml.safe_dump({"supervisor": {
        "runtime_dir": str(workdir / "run"),
        "endpoints": [f"tcp://127.0.0.1:{_port()}"],
        "curve": {"server_secret_key": str(keys / "server.key_secret"),
                  "authorized_clients": str(keys / "authorized_clients")}},
        "models": {"d": echo_model(1), "e": {"handler": "beside:make"}}})
    (workdir / "beside.py").write_text("def make(options): return None\n")
    assert preflight(parse_config(text, workdir / "config.yaml")) == []
    (keys / "authorized_clients" / "bad.key").write_text("nothing here\n")
    findings = preflight(parse_config(text, workdir / "config.yaml"))
    assert [f.where for f in findings] == ["supervisor.curve.authorized_clients"]
    assert "bad.key" in findings[0].message


def test_admin_and_endpoint_settings_are_validated() -> None:
    model = "models: {m: {handler: 'worker.handlers:echo'}}\n"

    def errors(text: str) -> str:
        with pytest.raises(ConfigErrors) as info:
            parse_config(model + text)
        return str(info.value)

    assert "TCP admin endpoint" in errors("supervisor: {admin: 'tcp://127.0.0.1:1'}")
    assert "admin_clients" in errors(
        "supervisor: {admin: 'tcp://127.0.0.1:1', curve: {server_secret_key: s, "
        "authorized_clients: d}}")
    assert "already supervisor.control" in errors(
        "supervisor: {admin: 'ipc://{runtime_dir}/control.sock'}")
    assert "admin keys are CURVE keys" in errors("supervisor: {curve: {admin_clients: d}}")
    parse_config(model + "supervisor: {admin: 'tcp://127.0.0.1:1', curve: {server_secret_key: "
                 "s, authorized_clients: d, admin_clients: a}}")


def test_the_unit_does_not_restart_on_statuses_a_restart_cannot_fix() -> None:
    unit = (Path(__file__).parent.parent / "systemd" / "tfsupervisor.service").read_text()
    line = next(x for x in unit.splitlines() if x.startswith("RestartPreventExitStatus="))
    statuses = {int(v) for v in line.partition("=")[2].split()}
    assert statuses == {DaemonExit.CONFIG, DaemonExit.USAGE, DaemonExit.RUNTIME_DIR}


def test_a_control_call_to_a_missing_ipc_socket_fails_at_once(workdir: Path) -> None:
    endpoint = f"ipc://{workdir}/run/admin.sock"  # no daemon ever made it
    started = time.monotonic()
    with pytest.raises(NoReply, match=r"no socket at .*is the supervisor running, with this"):
        control(endpoint, "reload", timeout=30)
    assert time.monotonic() - started < 25  # not the whole timeout
    out = _cli("reload", "-c", str(workdir / "config.yaml"), "--wait", "nan")
    assert out.returncode == 2 and "expected a finite number of seconds >= 0" in out.stderr


def test_a_fifo_in_place_of_the_config_is_refused_at_once(supervisor_factory: Any) -> None:
    """Opening a FIFO for reading waits for a writer: a reload that read one froze the
    daemon (no job, no status answered) and `reload -c` hung past its --timeout."""
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    sup.config_path.unlink()
    os.mkfifo(sup.config_path)
    started = time.monotonic()
    out = _cli("reload", "-c", str(sup.config_path), "--admin", sup.admin_endpoint,
               "--timeout", "20")
    assert out.returncode == 1 and "FIFO" in out.stderr, out.stderr
    with Client(sup.endpoint, timeout=10) as client:
        assert client.infer("m", X)["x"].shape == (1, 4)
    assert time.monotonic() - started < 15
    assert '"event": "config_rejected"' in sup.log() and "FIFO" in sup.log()
    out = _cli("check", "-c", str(sup.config_path))
    assert out.returncode == 1 and "a config must be a regular file" in out.stderr


def test_a_config_on_a_hung_mount_freezes_nothing() -> None:
    """The read is off the loop: jobs and status are answered while it hangs, the reload is
    refused when its deadline passes, a second one at once while the read is stuck, no
    worker is killed as hung, the CLI keeps its --timeout, and all is well once the file
    system answers again."""
    hang_fs = [sys.executable, str(Path(__file__).parent / "slow_fs.py")]
    config = {"supervisor": {"heartbeat_interval": "0.2s", "heartbeat_timeout": "1s"},
              "models": {"m": echo_model(1)}}
    sup = start_supervisor(config, wrapper=hang_fs)
    try:
        sup.wait_ready()
        (worker,) = sup.workers("m")
        hang = sup.config_path.parent / "HANG"
        hang.touch()
        reload = subprocess.Popen([*CLI, "reload", "-c", str(sup.config_path), "--admin",
                                   sup.admin_endpoint, "--timeout", "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        with sup.client(timeout=5) as client:
            while reload.poll() is None:
                assert client.infer("m", X)["x"].shape == (1, 4)
                assert sup.status()["models"]["m"]["workers"][0]["id"] == worker["id"]
                assert time.monotonic() - started < CONFIG_READ_TIMEOUT + 30
        out, err = reload.communicate()
        assert reload.returncode == 1 and "took longer than" in err, (out, err)
        # stuck still: the next reload is refused at once, not stacked behind it
        refused = _cli("reload", "-c", str(sup.config_path), "--admin", sup.admin_endpoint)
        assert refused.returncode == 1 and "has not returned" in refused.stderr, refused
        # the CLI reading the config on the same mount gives up at its own --timeout
        cli = subprocess.run([*hang_fs, sys.executable, "-m", "supervisor", "reload", "-c",
                              str(sup.config_path), "--timeout", "1"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1 and "took longer than 1s" in cli.stderr, cli
        hang.unlink()  # the file system answers again: the stuck read returns, and then
        deadline = time.monotonic() + 30  # a reload reads and applies as ever
        while (out := _cli("reload", "-c", str(sup.config_path))).returncode != 0:
            assert "has not returned" in out.stderr and time.monotonic() < deadline, out
            time.sleep(0.1)
        assert sup.workers("m")[0]["id"] == worker["id"]  # never killed as hung
        assert '"worker_hung"' not in sup.log()
    finally:
        sup.stop()


def test_a_removal_applies_while_the_config_read_hangs(keys: Path) -> None:
    """The keys are read before the config file, and apply even when that read then hangs;
    a reload refused because a read is stuck still re-reads the keys."""
    shutil.copy(keys / "stranger.key", keys / "authorized_clients" / "stranger.key")
    shutil.copy(keys / "admin.key", keys / "authorized_clients" / "admin.key")
    endpoint = f"tcp://127.0.0.1:{_port()}"
    config = {"supervisor": {"endpoints": [endpoint], "curve": {
        "server_secret_key": str(keys / "server.key_secret"),
        "authorized_clients": str(keys / "authorized_clients")}},
        "models": {"m": echo_model(1)}}
    sup = start_supervisor(config, wrapper=[sys.executable, str(Path(__file__).parent /
                                                                "slow_fs.py")])

    def admitted(name: str) -> bool:
        return _admitted(endpoint, keys, name)

    try:
        sup.wait_ready()
        assert admitted("stranger") and admitted("admin")
        (keys / "authorized_clients" / "stranger.key").unlink()
        hang = sup.config_path.parent / "HANG"
        hang.touch()
        out = _cli("reload", "-c", str(sup.config_path), "--admin", sup.admin_endpoint)
        assert out.returncode == 1 and "the client keys read before it apply" in out.stderr, \
            out
        assert not admitted("stranger") and admitted("client")
        (keys / "authorized_clients" / "admin.key").unlink()  # while the read is stuck
        out = _cli("reload", "-c", str(sup.config_path), "--admin", sup.admin_endpoint)
        assert out.returncode == 1 and "has not returned" in out.stderr, out
        deadline = time.monotonic() + 30
        while admitted("admin"):
            assert time.monotonic() < deadline, "the removal never applied"
        assert admitted("client")
        # A reload asked for while another's read is in flight, and that read then hangs:
        # its keys are re-read all the same (they were read before the removal).
        hang.unlink()
        while _cli("reload", "-c", str(sup.config_path)).returncode != 0:
            assert time.monotonic() < deadline + 30, "the stuck read never returned"
        shutil.copy(keys / "stranger.key", keys / "authorized_clients" / "stranger.key")
        assert _cli("reload", "-c", str(sup.config_path)).returncode == 0
        assert admitted("stranger")
        hang.touch()
        reload = [*CLI, "reload", "-c", str(sup.config_path), "--admin", sup.admin_endpoint]
        # Whichever arrives first starts the read; the other is queued behind it (or, on a
        # slow machine, refused as stuck): every way, the keys are read again for it.
        first = subprocess.Popen(reload, stderr=subprocess.PIPE, text=True)
        (keys / "authorized_clients" / "stranger.key").unlink()
        second = subprocess.Popen(reload, stderr=subprocess.PIPE, text=True)
        assert first.wait(60) == 1 and second.wait(60) == 1
        assert "being re-read" in second.communicate()[1]
        deadline = time.monotonic() + 30
        while admitted("stranger"):
            assert time.monotonic() < deadline, "the queued reload's removal never applied"
        hang.unlink()
    finally:
        sup.stop()


def test_a_reload_hung_in_the_code_fingerprint_names_it_not_the_config() -> None:
    """A handler's files on a hung mount: the reload's message blamed config.yaml; it names
    the code fingerprint and the file it was reading."""
    hang_fs = [sys.executable, str(Path(__file__).parent / "slow_fs.py")]
    sup = start_supervisor({"models": {"m": echo_model(1)}}, wrapper=hang_fs)
    hang = sup.config_path.parent / "HANG_CODE"
    try:
        sup.wait_ready()
        hang.touch()
        out = _cli("reload", "-c", str(sup.config_path), "--admin", sup.admin_endpoint,
                   "--timeout", "60")
        assert out.returncode == 1 and "the code fingerprint (reading " in out.stderr, out
        assert "worker" in out.stderr.split("the code fingerprint (reading ", 1)[1], out
        with sup.client(timeout=5) as client:
            assert client.infer("m", X)["x"].shape == (1, 4)
    finally:
        hang.unlink(missing_ok=True)
        sup.stop()
