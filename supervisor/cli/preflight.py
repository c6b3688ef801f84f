"""What `tfsupervisor check` verifies beyond the file itself: that this host can run the
config — model files present, the runtime dir writable, groups and key files usable. The
daemon would find each of these only at start, or only when a worker first loads."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from supervisor.config.keys import Config, ModelConfig
from supervisor.core.budget import Budget, sizing_problem
from supervisor.daemon import security
from supervisor.daemon.cgroup import CgroupReader
from supervisor.shared.certificates import load_certificate
from supervisor.shared.versions import is_saved_model, served_version


@dataclass(frozen=True)
class Finding:
    error: bool  # False: a warning (the daemon may still work, e.g. another PYTHONPATH)
    where: str  # the setting, as in config errors
    message: str

    def __str__(self) -> str:
        return f"{'error' if self.error else 'warning'}: {self.where}: {self.message}"


def preflight(config: Config) -> list[Finding]:
    beside = config.path.parent.resolve() if config.path else None
    findings = [f for name, model in config.models.items()
                for f in _model(f"models.{name}", model, beside)]
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
            for f in _model(f"models.{name}", model, None) if f.error]


def _model(where: str, model: ModelConfig, beside: Path | None) -> list[Finding]:
    kind, location = model.source
    if kind == "saved_model":
        path = Path(location)
        if not is_saved_model(served_version(path)[0]):
            what = "no such directory" if not path.exists() else \
                "no saved_model.pb in it, nor in a numeric version directory"
            return [Finding(True, f"{where}.saved_model", f"{location}: {what}")]
    elif kind == "keras":
        if not Path(location).is_file():
            return [Finding(True, f"{where}.keras", f"{location}: no such file")]
    else:
        module = location.partition(":")[0]
        found = _importable(module, beside)
        if not found:
            return [Finding(False, f"{where}.handler", f"module {module!r} is not importable "
                            "here; the workers will fail to load unless their env "
                            "(PYTHONPATH) provides it")]
    return []


def _importable(module: str, beside: Path | None) -> bool:
    """Whether workers could import ``module``: they run with the config's directory on
    their path (supervisor/config/worker_spec.py), so it is searched here too."""
    extra = [str(beside)] if beside is not None and str(beside) not in sys.path else []
    sys.path[:0] = extra
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False
    finally:
        del sys.path[:len(extra)]


def _runtime_dir(path: Path) -> list[Finding]:
    """Writable, or creatable: its nearest existing parent writable."""
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
    return []


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
