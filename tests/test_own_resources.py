"""The daemon outlives its own resources (issue 36): its log output, its file descriptors.

Real faults, real daemon: a pipe whose reader exits, a tiny tmpfs that fills up (mounted by
the test: CI runs as root), a `nofile` limit set with prlimit, many real client connections.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
import yaml

from supervisor.client import Client, NoReply, control
from supervisor.daemon.descriptors import RESERVE_BASE
from supervisor.testing import Supervisor, free_port, short_tmpdir
from tests.conftest import echo_model

CONFIG = {"models": {"m": echo_model(workers=1)}}


def start(config: dict[str, Any], output: int | IO[bytes], workdir: Path,
          wrapper: tuple[str, ...] = ()) -> Supervisor:
    """`tfsupervisor run` with its log output (stdout and stderr) going to ``output``."""
    runtime_dir = workdir / "run"
    config = {**config, "supervisor": {"runtime_dir": str(runtime_dir), "poll_interval": "0.2s",
                                       **config.get("supervisor", {})}}
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [*wrapper, sys.executable, "-m", "supervisor", "run", "-c", str(config_path),
         "--log-format", "json"],
        stdout=output, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return Supervisor(process, config_path, runtime_dir, workdir / "supervisor.log")


def answered(sup: Supervisor, jobs: int, endpoint: str | None = None) -> None:
    """``jobs`` jobs from a new client, each answered with its own value."""
    with Client(endpoint or sup.endpoint, timeout=30) as client:
        for i in range(jobs):
            x = np.full((1, 4), float(i), dtype=np.float32)
            assert client.infer("m", {"x": x})["x"][0, 0] == float(i)


def recycled(sup: Supervisor) -> None:
    """A recycle, done: it logs several events (started, spawned, ready, stopped)."""
    before = {w["id"] for w in sup.workers("m")}
    sup.admin("recycle", model="m")
    sup.wait_for(lambda s: (ids := {w["id"] for w in s["models"]["m"]["workers"]
                                    if w["state"] == "ready"}) and not ids & before,
                 60, "the recycled worker replaced")


def dropped(sup: Supervisor) -> dict[str, Any]:
    own: dict[str, Any] = sup.status()["supervisor"]
    return own


def stopped(sup: Supervisor) -> int:
    sup.process.send_signal(signal.SIGTERM)
    return sup.process.wait(60)


def test_a_closed_log_pipe_neither_stops_the_daemon_nor_ends_it_as_a_success() -> None:
    """What a service sees when journald restarts: its output pipe's reader is gone. Every
    line after that fails with EPIPE: dropped and counted; the daemon serves on, and its
    exit status stays the truth (0 only for a stop asked for by a signal)."""
    workdir = short_tmpdir()
    reader, writer = os.pipe()
    sup = start(CONFIG, writer, workdir)
    os.close(writer)
    try:
        sup.wait_ready()
        os.close(reader)  # the reader exits
        recycled(sup)  # logs: each line fails with EPIPE
        answered(sup, 20)
        own = dropped(sup)
        assert own["log_lines_dropped"] > 0 and "BrokenPipe" in own["log_error"], own
        assert sup.process.poll() is None
        assert stopped(sup) == 0  # asked to stop, stopped after draining: the truth
    finally:
        sup.stop()


def events(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a JSON log; a line cut short by a failed write is not one."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


LEAK = {"handler": "worker.handlers:leak", "workers": 1, "batching": {"max_batch_size": 1},
        "options": {"bytes_per_job": 16 << 20},
        "policy": {"kill_memory": "200MiB", "max_growth_per_1k_jobs": None,
                   "max_growth_per_hour": None, "max_attempts": 3}}


def test_a_log_reader_that_stops_reading_never_freezes_the_daemon() -> None:
    """stdout piped to a `cat` that is then stopped (SIGSTOP): the pipe fills, and a blocking
    write used to freeze the main loop (no job answered, no memory poll, no kill). Now each
    line that does not fit is dropped (EAGAIN), the daemon serves on, and once the reader
    goes on the count of lines lost comes first."""
    import fcntl

    workdir = short_tmpdir()
    reader, writer = os.pipe()
    fcntl.fcntl(writer, fcntl.F_SETPIPE_SZ, 4096)  # the smallest pipe: full after a few lines
    log_path = workdir / "supervisor.log"
    with open(log_path, "wb") as log:
        cat = subprocess.Popen(["cat"], stdin=reader, stdout=log)
    os.close(reader)
    sup = start({"models": {**CONFIG["models"], "leak": LEAK}}, writer, workdir)
    try:
        sup.wait_ready()
        cat.send_signal(signal.SIGSTOP)
        # The pipe full now, whatever the daemon logs next: filled through a descriptor of
        # the test's own (O_NONBLOCK on the daemon's would hide the bug).
        filler = os.open(f"/proc/self/fd/{writer}", os.O_WRONLY | os.O_NONBLOCK)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(filler, b"\n")
        os.close(filler)
        os.close(writer)
        with Client(sup.endpoint, timeout=10) as client:  # a frozen loop fails within 10 s
            for i in range(30):  # 16 MiB a job: killed over kill_memory on the way
                x = np.full((1, 4), float(i), np.float32)
                assert client.infer("leak", {"x": x})["x"][0, 0] == float(i)
                assert client.infer("m", {"x": x})["x"][0, 0] == float(i)
        recycled(sup)  # its lines, and the kill's, fill the pipe
        answered(sup, 20)
        own = dropped(sup)
        assert own["log_lines_dropped"] > 0 and "temporarily unavailable" in own["log_error"], own
        recycles = sup.status()["models"]["leak"]["recycles"]
        assert recycles.get("kill_memory", 0) >= 1, recycles
        cat.send_signal(signal.SIGCONT)
        lost = own["log_lines_dropped"]

        def told(_: dict[str, Any]) -> bool:
            recycled(sup)  # lines to write once the reader has emptied the pipe
            return any(e["event"] == "log_lines_dropped" and e["count"] > 0
                       for e in events(log_path))

        sup.wait_for(told, 60, "the lines lost told once the reader goes on")
        assert dropped(sup)["log_lines_dropped"] >= lost
        assert stopped(sup) == 0
    finally:
        with contextlib.suppress(OSError):
            os.close(writer)
        cat.send_signal(signal.SIGCONT)
        sup.stop()
        cat.wait(30)


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A tiny file system of its own, unmounted whatever happens."""
    mount = short_tmpdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)  # a file still open
        mount.rmdir()


def fill(path: Path, append_to: Path) -> None:
    """No byte left on ``path``'s file system: a filler file takes the free pages, then the
    log file's own last page is topped up (a short line could still fit in it)."""
    with open(path, "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 4096)
    with open(append_to, "ab", buffering=0) as log, contextlib.suppress(OSError):
        while True:
            log.write(b"\n")


def test_a_full_log_disk_drops_lines_and_says_so_when_there_is_room_again() -> None:
    assert os.geteuid() == 0, "mounts a tmpfs: run as root (CI does)"
    workdir = short_tmpdir()
    with tmpfs("1m") as disk:
        log_path = disk / "supervisor.log"
        with open(log_path, "ab") as log:
            sup = start(CONFIG, log, workdir)
        try:
            sup.wait_ready()
            fill(disk / "filler", log_path)
            recycled(sup)  # its lines meet ENOSPC
            answered(sup, 20)
            own = dropped(sup)
            assert own["log_lines_dropped"] > 0 and "No space left" in own["log_error"], own
            lost = own["log_lines_dropped"]
            (disk / "filler").unlink()
            recycled(sup)  # room again: the count comes first, then the lines themselves
            lines = [json.loads(line) for line in log_path.read_text().splitlines()
                     if line.startswith("{")]
            told = [e for e in lines if e["event"] == "log_lines_dropped"]
            assert told and told[0]["count"] >= lost and "No space" in told[0]["error"], told
            assert lines[-1]["event"] != "log_lines_dropped"  # the lines after it, written
            assert stopped(sup) == 0
        finally:
            sup.stop()


def test_a_start_on_a_full_file_system_leaves_nothing_behind() -> None:
    """The lock file cannot take its pid (ENOSPC): one error, and neither an empty
    supervisor.pid nor the run/ directory this start made is left (the docs promise that a
    failed start removes what it created)."""
    assert os.geteuid() == 0, "mounts a tmpfs: run as root (CI does)"
    workdir = short_tmpdir()
    with tmpfs("64k") as disk:
        with open(disk / "filler", "wb", buffering=0) as filler, \
                contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump({**CONFIG, "supervisor": {
            "runtime_dir": str(disk / "run")}}))
        out = subprocess.run([sys.executable, "-m", "supervisor", "run", "-c",
                              str(config_path), "--log-format", "json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 5, out.stderr  # DaemonExit.RUNTIME_DIR
        failed = [json.loads(line) for line in out.stderr.splitlines()
                  if '"supervisor_start_failed"' in line]
        assert len(failed) == 1 and "No space left" in failed[0]["error"], out.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_a_log_line_is_written_once_and_never_retried(tmp_path: Path) -> None:
    """The sink in-process, on a pipe whose reader has gone: one write per line (no loop),
    no exception, the loss counted and told on the next line that gets through."""
    from supervisor.shared.logs import Sink

    reader, writer = os.pipe()
    os.close(reader)
    with open(writer, "w") as stream:
        sink = Sink(stream)
        sink.render = lambda _, __, event: json.dumps(event)
        for _ in range(3):
            sink.write('{"event": "x"}')
        assert (sink.dropped, sink.untold) == (3, 3)
        assert sink.last_error is not None and "Broken pipe" in sink.last_error
    target = tmp_path / "log"
    with open(target, "w") as stream:
        sink.stream = stream
        sink.write('{"event": "y"}')
    events = [json.loads(line)["event"] for line in target.read_text().splitlines()]
    assert events == ["log_lines_dropped", "y"] and sink.untold == 0 and sink.dropped == 3


def test_a_log_socket_nobody_reads_drops_lines_and_stays_blocking_for_others() -> None:
    """journald's stream socket, full: the line is dropped (EAGAIN), never waited for, and
    the descriptor (shared with other processes) keeps its blocking mode."""
    from supervisor.shared.logs import Sink

    ours, journald = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with journald, open(ours.detach(), "w") as stream:
        sink = Sink(stream)
        sink.render = lambda _, __, event: json.dumps(event)
        for _ in range(2000):  # far more than the socket buffers hold
            sink.write('{"event": "x", "pad": "' + "p" * 200 + '"}')
        assert sink.dropped > 0 and sink.last_error is not None, sink.last_error
        assert "temporarily unavailable" in sink.last_error
        assert os.get_blocking(stream.fileno())  # others' view of it unchanged


def flood(endpoint: str, count: int) -> tuple[Any, list[Any]]:
    """``count`` real client connections (DEALER sockets, as clients open them)."""
    import zmq

    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, count + 16)
    sockets = []
    for _ in range(count):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sockets.append(sock)
    return context, sockets


# The floods measure how far a pause lags libzmq's accepts, which is how soon the gate's
# thread gets a CPU: they run with nothing beside them (docs/operations.md has the margin
# under load, measured on its own).
@pytest.mark.alone
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_flood_of_connections_under_a_low_nofile_limit_is_contained(transport: str) -> None:
    """libzmq aborts the daemon when an ipc accept meets EMFILE (and spins on tcp): with
    `nofile` at 1024 and 1500 connections, new connections wait instead, the ones open serve
    on, housekeeping keeps its schedule, and connections are taken again once they close."""

    workdir = short_tmpdir()
    endpoint = f"ipc://{workdir}/run/frontend.sock" if transport == "ipc" else \
        f"tcp://127.0.0.1:{free_port()}"
    config = {"supervisor": {"endpoints": [endpoint]},
              "models": {**CONFIG["models"], "leak": LEAK}}
    with open(workdir / "supervisor.log", "wb") as log:
        sup = start(config, log, workdir, ("prlimit", "--nofile=512:1024"))
    try:
        sup.wait_ready()
        own = dropped(sup)["descriptors"]
        assert (own["limit"], own["raised_from"]) == (1024, 512), own  # raised at start
        early = Client(endpoint, timeout=30)
        early.infer("m", {"x": np.zeros((1, 4), np.float32)})  # connected before the flood
        context, sockets = flood(endpoint, 1500)
        try:
            deadline = time.monotonic() + 60
            paused = {}
            while time.monotonic() < deadline:
                assert sup.process.poll() is None, sup.log()[-3000:]
                paused = control(sup.admin_endpoint, "status", timeout=10)["supervisor"]
                if not paused["descriptors"]["accepting"]:
                    break
                time.sleep(0.1)
            descriptors = paused["descriptors"]
            assert not descriptors["accepting"], descriptors
            # what the daemon's own work needs is still there
            assert descriptors["headroom"] >= RESERVE_BASE, descriptors
            for i in range(20):  # the connections open serve on
                x = np.full((1, 4), float(i), np.float32)
                assert early.infer("m", {"x": x})["x"][0, 0] == float(i)
            status = control(sup.admin_endpoint, "status", timeout=10)
            worker = status["models"]["m"]["workers"][0]
            assert worker["sampled_ago"] < 2.0, worker  # memory polls on schedule
            # A worker that grows past kill_memory is killed, its job answered by the
            # replacement (spawned out of the reserve): every bound holds during a flood.
            for i in range(30):
                x = np.full((1, 4), float(i), np.float32)
                assert early.infer("leak", {"x": x})["x"][0, 0] == float(i)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not control(
                    sup.admin_endpoint, "status", timeout=10)["models"]["leak"]["recycles"]:
                time.sleep(0.1)
            recycles = control(sup.admin_endpoint, "status", timeout=10)["models"]["leak"][
                "recycles"]
            assert recycles.get("kill_memory", 0) >= 1, recycles
        finally:
            for sock in sockets:
                sock.close(0)
            context.term()
        answered(sup, 5, endpoint)  # a new client: connections are taken again
        assert sup.process.poll() is None
        early.close()
        assert stopped(sup) == 0
    finally:
        sup.stop()


def test_the_reserve_grows_with_the_limit_and_never_takes_more_than_half() -> None:
    from supervisor.daemon.descriptors import reserve

    wanted = RESERVE_BASE + 16 * 2 + 2 * 32 * 2  # two workers, two pausable endpoints
    assert reserve(1024, 2, 2) == wanted  # what the daemon's own work and backlogs need
    assert reserve(65536, 2, 2) == 8192  # descriptors are plenty: an eighth held back
    assert reserve(300, 2, 2) == 150  # a tiny limit: half, and a warning at start


def test_a_failure_on_every_turn_is_logged_once_then_counted() -> None:
    """housekeeping_failed used to log its whole traceback on every poll."""
    import structlog

    from supervisor.daemon.failures import PERIOD, Failures

    def boom(n: int) -> BaseException:
        try:
            raise OSError(24, f"Too many open files ({n})")
        except OSError as exc:
            return exc

    failures = Failures()
    with structlog.testing.capture_logs() as logged:
        for turn in range(100):  # a poll every 0.2 s, each failing the same way
            failures.failed("housekeeping_failed", boom(turn), turn * 0.2)
        failures.failed("housekeeping_failed", boom(0), PERIOD + 1)
    assert [e["event"] for e in logged] == ["housekeeping_failed"] * 2
    assert "exc_info" in logged[0] and "exc_info" not in logged[1]
    assert logged[1]["repeated"] == 100 and "Too many open files" in logged[1]["error"]


def connect_as_nobody(paths: list[Path]) -> list[str]:
    """What a local client of another user (nobody, in the socket group nogroup) gets when
    it connects to each of ``paths``: a forked child that gives up root first."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            results = []
            for path in paths:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    try:
                        sock.connect(str(path))
                        results.append("connected")
                    except OSError as exc:
                        results.append(type(exc).__name__)
            os.write(writer, json.dumps(results).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with open(reader, "rb") as got:
        answer = got.read()
    os.waitpid(pid, 0)
    return list(json.loads(answer))


@pytest.mark.alone
def test_a_paused_ipc_socket_is_out_of_every_other_clients_reach() -> None:
    """The pause moved frontend.sock to frontend.sock.paused, still listening and as open
    to the socket group as before: clients that connected there were not counted, and 600
    of them under nofile=300 hit libzmq's abort (exit 134). Now it goes into a 0700
    directory of the daemon's own; leftovers of a daemon killed while paused are removed."""
    assert os.geteuid() == 0, "connects as another user: run as root (CI does)"
    workdir = short_tmpdir()
    os.chmod(workdir, 0o755)
    runtime = workdir / "run"
    (runtime / ".tfs-paused").mkdir(parents=True)
    leftovers = [runtime / "frontend.sock.paused", runtime / ".tfs-paused" / "frontend.sock"]
    for leftover in leftovers:
        leftover.touch()
    endpoint = f"ipc://{runtime}/frontend.sock"
    config = {"supervisor": {"endpoints": [endpoint], "socket_group": "nogroup"},
              "models": CONFIG["models"]}
    with open(workdir / "supervisor.log", "wb") as log:
        sup = start(config, log, workdir, ("prlimit", "--nofile=300:300"))
    try:
        sup.wait_ready()
        assert not any(p.exists() for p in leftovers), leftovers
        assert connect_as_nobody([runtime / "frontend.sock"]) == ["connected"]  # it can
        context, sockets = flood(endpoint, 400)
        try:
            deadline = time.monotonic() + 60
            own: dict[str, Any] = {"descriptors": {"paused": []}}
            while time.monotonic() < deadline:  # admin: never paused (control may be)
                assert sup.process.poll() is None, sup.log()[-3000:]
                with contextlib.suppress(NoReply):  # a loaded host: 400 handshakes first
                    own = control(sup.admin_endpoint, "status", timeout=10)["supervisor"]
                if endpoint in own["descriptors"]["paused"]:
                    break
                time.sleep(0.1)
            assert endpoint in own["descriptors"]["paused"], own
            aside = [p for p in runtime.rglob("frontend.sock*") if p.is_socket()]
            assert aside and runtime / "frontend.sock" not in aside, aside
            tried = [*aside, runtime / "frontend.sock", runtime / "frontend.sock.paused"]
            assert "connected" not in connect_as_nobody(tried), tried
        finally:
            for sock in sockets:
                sock.close(0)
            context.term()
        answered(sup, 5, endpoint)  # taken again once the flood has gone
        assert sup.process.poll() is None
        assert stopped(sup) == 0
        assert not (runtime / ".tfs-paused").exists()  # removed at exit
    finally:
        sup.stop()
