"""A reload serves the code on disk (issue 36): a handler module rewritten beside an unchanged
config is noticed (`status`), and `reload --wait` rolls the workers onto it, one at a time,
replacement first, and says when the new code serves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from supervisor.config.fingerprint import fingerprint, sources
from supervisor.config.keys import ModelConfig
from supervisor.config.loading import load_config
from supervisor.testing import Supervisor, short_tmpdir, start_supervisor

HANDLER = '''
import numpy as np
from supervisor.shared.protocol import TensorSpec

VERSION = {version}


class Versioned:
    inputs = [TensorSpec("x", "float32", (None, 4))]
    outputs = None

    def __call__(self, inputs):
        return {{"version": np.full((len(inputs["x"]), 1), VERSION, np.float32)}}


def make(options):
    return Versioned()
'''


def write_handler(folder: Path, version: int) -> None:
    (folder / "versioned.py").write_text(HANDLER.format(version=version))


def served_version(sup: Supervisor) -> float:
    with sup.client(timeout=30) as client:
        return float(client.infer("m", {"x": np.zeros((1, 4), np.float32)})["version"][0, 0])


def test_a_rewritten_handler_is_flagged_and_served_after_reload_wait() -> None:
    workdir = short_tmpdir()
    write_handler(workdir, 1)
    config = {"models": {"m": {"handler": "versioned:make", "workers": 2}}}
    sup = start_supervisor(config, workdir)
    try:
        sup.wait_ready()
        assert served_version(sup) == 1.0
        first = {w["id"] for w in sup.workers("m")}
        assert all(w["code_current"] for w in sup.workers("m"))
        write_handler(workdir, 2)
        os.utime(workdir / "versioned.py", ns=(1, 1))  # same size: the content still counts
        flagged = sup.wait_for(lambda s: s["models"]["m"]["code_changed_on_disk"], 30,
                               "status to say the workers run code older than on disk")
        assert not any(w["code_current"] for w in flagged["models"]["m"]["workers"])
        assert served_version(sup) == 1.0  # nothing rolls before the reload
        done = subprocess.run(
            [sys.executable, "-m", "supervisor", "reload", "-c", str(sup.config_path),
             "--wait", "60"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "code_changed m" in done.stdout and "serving on" in done.stdout, done.stdout
        status = sup.status()["models"]["m"]
        assert not status["code_changed_on_disk"]
        assert not {w["id"] for w in status["workers"]} & first  # every worker rolled
        assert status["recycles"].get("reload") == 2
        for _ in range(10):  # every worker serves the new code
            assert served_version(sup) == 2.0
        # unchanged code: a reload rolls nothing
        again = subprocess.run(
            [sys.executable, "-m", "supervisor", "reload", "-c", str(sup.config_path)],
            capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "code_changed" not in again.stdout, again.stdout
    finally:
        sup.stop()


def test_the_fingerprint_follows_the_handler_package_and_the_files_options_name(
        tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "handler.py").write_text("def make(o): ...\n")
    (package / "helper.py").write_text("X = 1\n")
    (tmp_path / "vocab.txt").write_text("a b c\n")
    (tmp_path / "config.yaml").write_text(
        "models:\n  m:\n    handler: pkg.handler:make\n    options: {vocab: vocab.txt}\n")
    model = load_config(tmp_path / "config.yaml").models["m"]
    before = fingerprint(model, tmp_path)
    assert fingerprint(model, tmp_path) == before  # stable
    (package / "helper.py").write_text("X = 2\n")  # a module beside the handler's
    helper = fingerprint(model, tmp_path)
    assert helper != before
    (tmp_path / "vocab.txt").write_text("a b d\n")  # a file the options name
    assert fingerprint(model, tmp_path) != helper
    (package / "__pycache__").mkdir()  # what Python writes there is not a change
    (package / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\0")
    last = fingerprint(model, tmp_path)
    (package / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\1\1")
    assert fingerprint(model, tmp_path) == last


def fingerprint_within(model: ModelConfig, config_dir: Path, seconds: float = 20) -> str | None:
    """The fingerprint, from a thread: one that never returns fails the test, not hangs it."""
    result: list[str | None] = []
    thread = threading.Thread(target=lambda: result.append(fingerprint(model, config_dir)),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, "the fingerprint did not return (a device or FIFO read?)"
    return result[0]


def test_devices_and_fifos_named_by_options_are_never_read(tmp_path: Path) -> None:
    """/dev/urandom never ends (the supervisor grew 240 MB/s); a FIFO with no writer never
    answers (threads blocked for good, every later reload refused): only regular files are
    read, anything else counts by its type and name."""
    (tmp_path / "handler_mod.py").write_text("def make(o): ...\n")
    os.mkfifo(tmp_path / "pipe")
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "fifo")  # inside a directory an option names
    (data / "weights.txt").write_text("1\n")
    (tmp_path / "config.yaml").write_text(
        "models:\n  m:\n    handler: handler_mod:make\n"
        "    options: {noise: /dev/urandom, pipe: ./pipe, data: ./data}\n")
    model = load_config(tmp_path / "config.yaml").models["m"]
    assert sources(model, tmp_path) == [tmp_path / "handler_mod.py", tmp_path / "./data"]
    before = fingerprint_within(model, tmp_path)
    (data / "weights.txt").write_text("2\n")
    assert fingerprint_within(model, tmp_path) != before


def test_only_option_values_that_name_code_or_data_are_watched(tmp_path: Path) -> None:
    """`decimal_point: "."` fingerprinted the config's whole directory (the daemon's own log
    and runtime dir: "older than on disk" forever); "/" would walk the file system."""
    config_dir = tmp_path / "conf"
    config_dir.mkdir()
    (config_dir / "handler_mod.py").write_text("def make(o): ...\n")
    (config_dir / "vocab.txt").write_text("a\n")
    (config_dir / "supervisor.log").write_text("")
    (config_dir / "config.yaml").write_text(
        "models:\n  m:\n    handler: handler_mod:make\n    options: {decimal_point: '.', "
        "root: /, up: .., proc: /proc/self, version: '1.2', vocab: vocab.txt}\n")
    model = load_config(config_dir / "config.yaml").models["m"]
    assert sources(model, config_dir) == [config_dir / "handler_mod.py",
                                          config_dir / "vocab.txt"]
    before = fingerprint(model, config_dir)
    (config_dir / "supervisor.log").write_text("a line the daemon logged\n")
    assert fingerprint(model, config_dir) == before


def test_the_handler_is_looked_for_where_the_worker_imports_from_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m worker` puts its working directory (the supervisor's) first on sys.path: a
    handler module there changed on disk was never flagged. A module the worker's path does
    not resolve is unknown (None: status says so), never "current"."""
    cwd, config_dir = tmp_path / "cwd", tmp_path / "conf"
    cwd.mkdir()
    config_dir.mkdir()
    (cwd / "cwd_handler_mod.py").write_text("def make(o): return 1\n")
    (config_dir / "config.yaml").write_text(
        "models:\n  m:\n    handler: cwd_handler_mod:make\n"
        "  gone:\n    handler: no_such_module_anywhere:make\n")
    config = load_config(config_dir / "config.yaml")
    monkeypatch.chdir(cwd)
    before = fingerprint(config.models["m"], config_dir)
    assert before is not None
    (cwd / "cwd_handler_mod.py").write_text("def make(o): return 2\n")
    assert fingerprint(config.models["m"], config_dir) != before
    assert fingerprint(config.models["gone"], config_dir) is None


def test_a_walk_cut_by_a_bound_is_said_in_status(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory an option names that is larger than the walk's bounds: only part of it is
    compared, and `status` says which (a change past the bound is not seen)."""
    from supervisor.cli.render import _supervisor_notes
    from supervisor.config import fingerprint as module

    monkeypatch.setattr(module, "MOST_FILES", 3)
    (tmp_path / "handler_mod.py").write_text("def make(o): ...\n")
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(5):
        (shards / f"{i}.bin").write_bytes(b"x")
    (tmp_path / "config.yaml").write_text(
        "models:\n  m:\n    handler: handler_mod:make\n    options: {shards: ./shards}\n")
    fingerprint(load_config(tmp_path / "config.yaml").models["m"], tmp_path)
    assert str(tmp_path / "./shards") in module.bounded()
    notes = _supervisor_notes({"code_bounded": module.bounded()})
    assert any("only part of" in n and "shards" in n for n in notes), notes
    unknown = {"recycles": {}, "available": True, "queued": 0, "in_flight": 0,
               "memory_metric": "rss", "workers": [], "code_unknown": True}
    from supervisor.cli.render import _model_note
    assert "CODE ON DISK UNKNOWN" in _model_note("m", unknown)
