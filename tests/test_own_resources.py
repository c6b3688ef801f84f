"""The daemon outlives its own resources (issue 36): its log output, its file descriptors.

Real faults, real daemon: a pipe whose reader exits, a tiny tmpfs that fills up (mounted by
the test: CI runs as root), a `nofile` limit set with prlimit, many real client connections.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import yaml

from supervisor.testing import Supervisor, short_tmpdir
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


def answered(sup: Supervisor, jobs: int) -> None:
    """``jobs`` jobs, each answered with its own value."""
    with sup.client(timeout=30) as client:
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
