"""The spawn contract between the supervisor and a worker, written once.

The supervisor builds a :class:`WorkerSpec` from its configuration (:func:`build_spec`),
starts ``python -m worker`` (:func:`worker_command`) with the spec as JSON in the
``TFSUPERVISOR_WORKER`` environment variable (:func:`worker_env`), and the worker reads it
back with :meth:`WorkerSpec.from_env`. Every field is always filled by the supervisor; the
worker takes every value from the spec and has no defaults of its own. A spec that is not
exactly this shape is refused with :class:`SpawnError` on either side.

``parent_pid`` is the supervisor's pid as the supervisor saw it: a worker whose parent is
already someone else when it starts (the supervisor died before the worker armed
PR_SET_PDEATHSIG) knows it is an orphan and exits.

This module is imported by the supervisor, so it must never import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.config.keys import Config, ModelConfig, PaddingConfig, SupervisorSection, TfConfig
from supervisor.config.settings import Choice, ConfigError, ConfigErrors, section_fields
from supervisor.shared.padding import PadDim, from_config

ENV_VAR = "TFSUPERVISOR_WORKER"
# Set by the worker for its own child processes in place of ENV_VAR: "SUPERVISOR_PID/WORKER_ID".
TREE_VAR = "TFSUPERVISOR_TREE"
# Set by the supervisor for everything it starts, inherited by their descendants:
# "INSTANCE_ID@RUNTIME_DIR", so the next daemon on that runtime dir can reap what a killed one
# left (supervisor/daemon/leftovers.py).
INSTANCE_VAR = "TFSUPERVISOR_INSTANCE"


def tree_mark(supervisor_pid: int, worker_id: str) -> str:
    return f"{supervisor_pid}/{worker_id}"

SOURCES = ("saved_model", "keras", "handler")
# A ZeroMQ routing identity is 1 to 255 bytes and may not start with a zero byte.
MAX_WORKER_ID_BYTES = 255
# pid_t is a signed 32-bit integer on Linux.
MAX_PID = 2**31 - 1
# The longest wait threading accepts (the heartbeat thread waits this long between beats).
MAX_INTERVAL = threading.TIMEOUT_MAX
# What systemd hands the service's main process, never passed on to a worker. Only the
# supervisor talks to systemd: a worker that inherited NOTIFY_SOCKET could send READY=1 or
# STATUS= for the unit (NotifyAccess=main drops it, but only under systemd), one that inherited
# WATCHDOG_USEC could keep pinging while the supervisor itself is wedged, and LISTEN_FDS name
# file descriptors that are the supervisor's, not the worker's.
SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                "LISTEN_FDNAMES")


class SpawnError(ValueError):
    """A worker spec that does not follow the contract (bad JSON, keys, types or values)."""


def _choices(name: str) -> tuple[str, ...]:
    """The allowed values of a Choice setting of the supervisor section (declared there)."""
    kind = next(f for f in section_fields(SupervisorSection) if f.name == name).metadata["kind"]
    assert isinstance(kind, Choice)  # keys.py declares log_level and log_format as choices
    return kind.choices


LOG_LEVELS = _choices("log_level")
LOG_FORMATS = _choices("log_format")
TF_FIELDS = {f.name: f.metadata["kind"] for f in section_fields(TfConfig)}
_MODEL_KINDS = {f.name: f.metadata["kind"] for f in section_fields(ModelConfig)}
PADDING = _MODEL_KINDS["padding"]
WARMUP_SIZES = _MODEL_KINDS["warmup_batch_sizes"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to boot, from the supervisor; validated when built."""

    worker_id: str
    model: str
    source: str  # saved_model | keras | handler
    location: str  # SavedModel directory, .keras file or "module:factory"
    signature: str  # SavedModel signature served
    options: dict[str, Any]  # handler options (JSON values only)
    tf: dict[str, Any]  # TfConfig's fields by name, every one present
    backend: str  # the supervisor's backend endpoint
    heartbeat_interval: float  # seconds
    probes: bool  # sample leak probes into heartbeats (worker/probes.py)
    log_level: str
    log_format: str
    parent_pid: int  # the supervisor's pid
    secret: str  # proves to the supervisor that a backend peer is this spawned worker
    padding: dict[str, dict[str, Any]]  # models.NAME.padding, every field present
    warmup_batch_sizes: list[int]  # batch sizes warmed up, each with every padding size

    def __post_init__(self) -> None:
        _validate(self)
        # JSON writes 1.0 as 1.0 but a hand-written spec may say 1: one type either way.
        object.__setattr__(self, "heartbeat_interval", float(self.heartbeat_interval))

    def pad_dims(self) -> tuple[PadDim, ...]:
        """The padded dimensions (validated with the spec)."""
        return from_config(_padding(self.padding))

    def to_env(self) -> str:
        """The spec as the JSON text of the TFSUPERVISOR_WORKER variable."""
        return json.dumps(dataclasses.asdict(self), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_env(cls, text: str) -> WorkerSpec:
        """Parse the TFSUPERVISOR_WORKER text; SpawnError if it is not exactly a spec."""
        try:
            raw = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
        except SpawnError:
            raise
        except (ValueError, RecursionError) as exc:
            raise SpawnError(f"{ENV_VAR} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise SpawnError(f"{ENV_VAR} must be a JSON object, got {_kind(raw)}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in raw]
        extra = sorted(k for k in raw if k not in names)
        if missing or extra:
            parts = ([f"missing keys: {', '.join(missing)}"] if missing else []) + \
                    ([f"unexpected keys: {', '.join(extra)}"] if extra else [])
            raise SpawnError(f"{ENV_VAR}: {'; '.join(parts)}")
        return cls(**raw)


def build_spec(config: Config, model: str, worker_id: str, parent_pid: int,
               log_format: str, secret: str) -> WorkerSpec:
    """The spec of one worker of ``model``; SpawnError if the model's settings cannot travel
    (handler options that are not plain JSON values, say)."""
    try:
        settings = config.models[model]
    except KeyError:
        raise SpawnError(f"no model {model!r} in the configuration") from None
    kind, location = settings.source
    return WorkerSpec(
        worker_id=worker_id, model=model, source=kind, location=location,
        signature=settings.signature, options=dict(settings.options),
        tf={name: getattr(settings.tf, name) for name in TF_FIELDS},
        backend=config.backend, heartbeat_interval=config.supervisor.heartbeat_interval,
        probes=settings.probes, log_level=config.supervisor.log_level, log_format=log_format,
        parent_pid=parent_pid, secret=secret,
        padding={name: _as_json(dataclasses.asdict(dim))
                 for name, dim in settings.padding.items()},
        warmup_batch_sizes=list(settings.warmup_batch_sizes))


def _as_json(fields: dict[str, Any]) -> dict[str, Any]:
    """Settings as JSON gives them back (lists, not tuples): validated the same either side."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}


def worker_command(spec: WorkerSpec) -> list[str]:
    """The worker's command line (the same Python interpreter as the supervisor)."""
    return [sys.executable, "-m", "worker", "--id", spec.worker_id, "--model", spec.model]


def worker_env(config: Config, spec: WorkerSpec, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (os.environ, say), the model's own env, the spec, and the config file's
    directory first on PYTHONPATH so handler modules beside config.yaml import as they are;
    never systemd's notify, watchdog or socket-activation variables (SYSTEMD_ONLY)."""
    try:
        settings = config.models[spec.model]
    except KeyError:
        raise SpawnError(f"no model {spec.model!r} in the configuration") from None
    env = dict(base)
    env.update(settings.env)
    for name in SYSTEMD_ONLY:  # from the supervisor's environment or a model's: see above
        env.pop(name, None)
    env[ENV_VAR] = spec.to_env()
    if config.path is not None:
        config_dir = str(config.path.parent.resolve())
        env["PYTHONPATH"] = os.pathsep.join(p for p in (config_dir, env.get("PYTHONPATH")) if p)
    return env


# --- validation ------------------------------------------------------------------------------

def _validate(spec: WorkerSpec) -> None:
    for name in ("worker_id", "model", "location", "signature", "backend"):
        _string(name, getattr(spec, name))
    if len(spec.worker_id.encode()) > MAX_WORKER_ID_BYTES:
        raise SpawnError(f"{ENV_VAR}: worker_id must be at most {MAX_WORKER_ID_BYTES} bytes "
                         "(it is the worker's ZeroMQ identity)")
    _one_of("source", spec.source, SOURCES)
    _one_of("log_level", spec.log_level, LOG_LEVELS)
    _one_of("log_format", spec.log_format, LOG_FORMATS)
    _options(spec.options)
    _tf(spec.tf)
    _padding(spec.padding)
    try:
        WARMUP_SIZES.parse(spec.warmup_batch_sizes, "warmup_batch_sizes")
    except ConfigError as exc:
        raise SpawnError(f"{ENV_VAR}: {exc}") from None
    interval = spec.heartbeat_interval
    # NaN fails both comparisons; infinity fails the second.
    if isinstance(interval, bool) or not isinstance(interval, int | float) or \
            not 0 < interval <= MAX_INTERVAL:
        raise SpawnError(f"{ENV_VAR}: heartbeat_interval must be a number of seconds > 0 and "
                         f"<= {MAX_INTERVAL:g}, got {_show(interval)}")
    if not isinstance(spec.probes, bool):
        raise SpawnError(f"{ENV_VAR}: probes must be true or false, got {_show(spec.probes)}")
    if not isinstance(spec.secret, str) or not 32 <= len(spec.secret) <= 128 or \
            not all(c in "0123456789abcdef" for c in spec.secret):
        raise SpawnError(f"{ENV_VAR}: secret must be 32 to 128 lowercase hex digits")
    pid = spec.parent_pid
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= MAX_PID:
        raise SpawnError(f"{ENV_VAR}: parent_pid must be a process id (an integer from 1 to "
                         f"{MAX_PID}), got {_show(pid)}")


def _padding(raw: object) -> dict[str, PaddingConfig]:
    """The padding settings, checked as the config checks them (same declarations)."""
    if not isinstance(raw, dict):  # the config reads a missing section as {}; a spec has it
        raise SpawnError(f"{ENV_VAR}: padding must be a mapping, got {_show(raw)}")
    try:
        return PADDING.parse(raw, "padding")  # type: ignore[no-any-return]
    except ConfigErrors as many:
        raise SpawnError(f"{ENV_VAR}: {many.errors[0]}") from None
    except ConfigError as exc:
        raise SpawnError(f"{ENV_VAR}: {exc}") from None


def _string(name: str, value: object) -> None:
    """Non-empty, no NUL (the id and model go on a command line), valid UTF-8 (no lone
    surrogates, which JSON's \\u escapes can carry)."""
    if not isinstance(value, str) or not value:
        raise SpawnError(f"{ENV_VAR}: {name} must be a non-empty string, got {_show(value)}")
    if "\0" in value:
        raise SpawnError(f"{ENV_VAR}: {name} must not contain a NUL character")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise SpawnError(f"{ENV_VAR}: {name} is not valid Unicode text (a lone surrogate)") \
            from None


def _one_of(name: str, value: object, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise SpawnError(f"{ENV_VAR}: {name} must be one of {', '.join(choices)}, "
                         f"got {_show(value)}")


def check_options(options: object) -> None:
    """SpawnError unless ``options`` can travel to a worker (see _options)."""
    _options(options)


def _options(options: object) -> None:
    """A JSON object of JSON values (no NaN), so that it travels and comes back unchanged."""
    if not isinstance(options, dict):
        raise SpawnError(f"{ENV_VAR}: options must be a JSON object, got {_show(options)}")
    stack: list[tuple[str, object]] = [("options", options)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SpawnError(f"{ENV_VAR}: {path} has a key {key!r} that is not a "
                                     "string")
                stack.append((f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise SpawnError(f"{ENV_VAR}: {path} is {value}, which JSON cannot carry")
        elif value is not None and not isinstance(value, bool | int | float | str):
            raise SpawnError(f"{ENV_VAR}: {path} is a {type(value).__name__}, not a JSON "
                             "value")


def _tf(tf: object) -> None:
    """Every TfConfig field, as the value its declaration parses to (no units, no coercion)."""
    if not isinstance(tf, dict):
        raise SpawnError(f"{ENV_VAR}: tf must be a JSON object, got {_show(tf)}")
    missing = [n for n in TF_FIELDS if n not in tf]
    extra = sorted(str(k) for k in tf if k not in TF_FIELDS)
    if missing or extra:
        parts = ([f"missing keys: {', '.join(missing)}"] if missing else []) + \
                ([f"unexpected keys: {', '.join(extra)}"] if extra else [])
        raise SpawnError(f"{ENV_VAR}: tf: {'; '.join(parts)}")
    for name, kind in TF_FIELDS.items():
        value = tf[name]
        try:
            parsed = kind.parse(value, f"tf.{name}")
        except ConfigError as exc:
            raise SpawnError(f"{ENV_VAR}: {exc}") from None
        if type(parsed) is not type(value) or parsed != value:
            raise SpawnError(f"{ENV_VAR}: tf.{name} must be given as {_show(parsed)}, "
                             f"got {_show(value)}")


def _no_constant(name: str) -> Any:
    raise SpawnError(f"{ENV_VAR}: {name} is not a JSON value")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SpawnError(f"{ENV_VAR}: key {key!r} appears twice in one object")
        out[key] = value
    return out


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _show(value: object) -> str:
    text = json.dumps(value) if _jsonable(value) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True
