"""What `tfsupervisor check` verifies beyond the file itself: that this host can run the
config — model files present and whole, handler modules importable where the workers will
look, the runtime dir able to take what `run` writes there, groups and key files usable.
The daemon would find each of these only at start, or only when a worker first loads.
Loading each model as `run` does is `check --load` (supervisor/cli/loadcheck.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from supervisor.config import worker_spec
from supervisor.config.keys import Config, ModelConfig
from supervisor.core.budget import Budget, sizing_problem
from supervisor.daemon import fronts, security
from supervisor.daemon.cgroup import CgroupReader
from supervisor.shared.certificates import load_certificate
from supervisor.shared.versions import MARKERS, is_saved_model, served_version

# How long `check` waits for a child interpreter that looks a handler module up.
IMPORT_LOOKUP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Finding:
    error: bool  # False: a warning (the daemon may still work, e.g. another PYTHONPATH)
    where: str  # the setting, as in config errors
    message: str

    def __str__(self) -> str:
        return f"{'error' if self.error else 'warning'}: {self.where}: {self.message}"


def preflight(config: Config) -> list[Finding]:
    findings = [f for name, model in config.models.items()
                for f in _model(f"models.{name}", model, config, name)]
    if not any(m.required for m in config.models.values()):
        findings.append(Finding(False, "models", "no model is required: the service reports "
                                "ready (READY=1, status --ready) even when none can load"))
    findings += _runtime_dir(config.runtime_dir)
    sup = config.supervisor
    for setting, group in (("socket_group", sup.socket_group), ("admin_group", sup.admin_group)):
        try:
            security.group_id(setting, group)
        except security.UnknownGroup as exc:
            findings.append(Finding(True, f"supervisor.{setting}", str(exc).split(": ", 1)[1]))
    findings += _curve(config)
    if sup.http.listen or sup.grpc.listen:
        findings += [Finding(True, f"supervisor.{key}", message)
                     for key, message in fronts.file_problems(sup.http, sup.grpc)]
    findings += _memory_budget(config)
    return findings


def _memory_budget(config: Config) -> list[Finding]:
    """The workers at their limits, plus one replacement, against the memory limit of the
    cgroup this command runs in (run it where the daemon runs: inside the container, or
    with `systemd-run --scope -p MemoryMax=...`)."""
    budget = Budget()
    budget.update(CgroupReader().read(), None)
    problem = sizing_problem(config.models, budget, config.supervisor.min_available_memory)
    return [Finding(False, "models", f"memory budget: {problem}")] if problem else []


def model_files_missing(config: Config) -> list[Finding]:
    """The models whose SavedModel directory or .keras file is not there: what `run` says
    at start-up (a handler's module is looked up only by `check`: finding it may import
    its parent packages)."""
    return [f for name, model in config.models.items() if model.source[0] != "handler"
            for f in _model(f"models.{name}", model, config, name) if f.error]


def _model(where: str, model: ModelConfig, config: Config, name: str) -> list[Finding]:
    kind, location = model.source
    if kind == "saved_model":
        path = Path(location)
        found, _ = served_version(path)
        if not is_saved_model(found):
            what = "no such directory" if not path.exists() else \
                "no saved_model.pb in it, nor in a numeric version directory"
            return [Finding(True, f"{where}.saved_model", f"{location}: {what}")]
        problem = saved_model_problem(found)
        if problem:
            return [Finding(True, f"{where}.saved_model", problem)]
    elif kind == "keras":
        if not Path(location).is_file():
            return [Finding(True, f"{where}.keras", f"{location}: no such file")]
    else:
        module = location.partition(":")[0]
        problem = _not_importable(module, config, name)
        if problem:
            return [Finding(False, f"{where}.handler", problem)]
    return []


def saved_model_problem(path: Path) -> str | None:
    """What makes the SavedModel at ``path`` unloadable that is seen without TensorFlow, in
    milliseconds: a ``saved_model.pb`` whose protobuf framing runs past its end (a truncated
    copy) or holds no graph, or no ``variables/variables.index`` (TensorFlow writes one for
    every SavedModel, even without variables, and refuses to load one without it). Only a
    load (``check --load``) proves the rest."""
    if not (path / MARKERS[0]).is_file():
        return None  # saved_model.pbtxt: text, nothing to frame-check
    pb = path / MARKERS[0]
    try:
        with open(pb, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            problem = _framing(stream, size)
    except OSError as exc:
        return f"{pb}: {exc.strerror or exc}"
    if problem:
        return f"{pb} is damaged ({problem}): a truncated or partial copy? TensorFlow " \
               "cannot load it"
    index = path / "variables" / "variables.index"
    if not index.is_file():
        return f"{index}: no such file (variables/ missing or incomplete): TensorFlow " \
               "cannot restore the model's variables"
    return None


def _framing(stream: BinaryIO, size: int) -> str | None:
    """The top level of a SavedModel message walked field by field (tag, then a varint, a
    fixed width or a length, skipped with a seek): None when it ends exactly at the end of
    the file and holds a meta graph (field 2)."""
    graphs = 0
    offset = 0
    while offset < size:
        tag = _varint(stream)
        if tag is None:
            return f"a field cut short at byte {offset} of {size}"
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            skip = 0
            if _varint(stream) is None:
                return f"a number cut short after byte {offset} of {size}"
        elif wire == 1:
            skip = 8
        elif wire == 5:
            skip = 4
        elif wire == 2:
            length = _varint(stream)
            if length is None:
                return f"a length cut short after byte {offset} of {size}"
            skip = length
        else:
            return f"not a SavedModel message (wire type {wire} at byte {offset})"
        end = stream.tell() + skip
        if end > size:
            return f"a field of {skip} bytes at byte {offset} runs past the end, {size} bytes"
        graphs += field == 2 and wire == 2
        stream.seek(end)
        offset = end
    return None if graphs else f"no meta graph in its {size} bytes"


def _varint(stream: BinaryIO) -> int | None:
    value = shift = 0
    while shift < 70:
        byte = stream.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    return None


def _not_importable(module: str, config: Config, name: str) -> str | None:
    """Why the workers of model ``name`` could not find ``module``, looked up where they will
    look: a child interpreter with the worker's own environment (the model's ``env`` and its
    PYTHONPATH, the config's directory first: supervisor/config/worker_spec.py) and working
    directory. A child, because finding ``a.b`` imports the package ``a``."""
    try:
        spec = worker_spec.build_spec(config, name, "check-import", os.getpid(), "json",
                                      "0" * 32)
        env = worker_spec.worker_env(config, spec, os.environ)
    except worker_spec.SpawnError as exc:
        return f"cannot build the worker's environment: {exc}"
    env.pop(worker_spec.ENV_VAR, None)
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) " \
           "else 3)"
    try:
        found = subprocess.run([sys.executable, "-c", code, module], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=IMPORT_LOOKUP_TIMEOUT,
                               check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not look module {module!r} up: {exc}"
    if found.returncode == 0:
        return None
    why = found.stderr.decode(errors="replace").strip().splitlines()[-1:] \
        if found.returncode != 3 else []
    said = f" ({why[0]})" if why else ""
    return f"module {module!r} is not importable with the workers' environment (the " \
           f"model's env and PYTHONPATH, the config's directory){said}; they will fail " \
           "to load"


def _runtime_dir(path: Path) -> list[Finding]:
    """What `run` does there first, tried: the directory made if missing (and removed
    again), then a file written and a Unix socket bound in it (and removed): a full file
    system, a read-only mount or a missing permission fail here as they would fail `run`."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [Finding(True, "supervisor.runtime_dir", f"{existing} is not a directory")]
    if (problem := security.runtime_dir_problem(path)) is not None:  # as `run` refuses it
        return [Finding(True, "supervisor.runtime_dir", problem)]
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "is not writable" if existing == path else \
            f"cannot be created: {existing} is not writable"
        return [Finding(True, "supervisor.runtime_dir", f"{path} {verb} by this user "
                        f"(uid {os.getuid()})")]
    problem = probe_runtime_dir(path)
    if problem:
        return [Finding(True, "supervisor.runtime_dir", f"{path}: {problem}; `run` writes "
                        "its lock file and binds its sockets there")]
    return []


def probe_runtime_dir(path: Path) -> str | None:
    """None when a file can be written and a Unix socket bound in ``path`` (made for the
    try when missing); else what failed. Leaves nothing behind."""
    made: list[Path] = []
    probe = path / f".check-{os.getpid()}"
    try:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            os.mkdir(directory, 0o750)
            made.append(directory)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(probe.with_suffix(".sock")))
    except OSError as exc:
        what = exc.strerror or str(exc)
        return f"cannot write there: {what}"
    finally:
        for leftover in (probe, probe.with_suffix(".sock")):
            with contextlib.suppress(OSError):
                leftover.unlink()
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()
    return None


def _curve(config: Config) -> list[Finding]:
    curve = config.supervisor.curve
    findings = []
    if curve.server_secret_key is not None:
        try:
            _, secret = load_certificate(curve.server_secret_key)
            if secret is None:
                raise ValueError("it holds no secret key (give the .key_secret file)")
        except (OSError, ValueError) as exc:
            findings.append(Finding(True, "supervisor.curve.server_secret_key",
                                    f"{curve.server_secret_key}: {exc}"))
    try:
        security.read_clients(curve)
    except security.KeyDirError as exc:
        where, _, message = str(exc).partition(": ")
        findings.append(Finding(True, where, message))
    return findings
