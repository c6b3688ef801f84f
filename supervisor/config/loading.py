"""Loading config.yaml: read it (bounded, UTF-8), parse it, validate it whole, resolve paths
and substitute endpoints; and the endpoints the CLI needs from a file that no longer validates.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from supervisor.config.keys import (
    MAX_IPC_PATH,
    OWN_DIR,
    PRIVATE_DIR,
    BatchingConfig,
    Config,
    CurveConfig,
    GrpcSection,
    HttpSection,
    ModelConfig,
    PaddingConfig,
    PolicyConfig,
    RawConfig,
    SupervisorSection,
    TfConfig,
)
from supervisor.config.settings import (
    ConfigError,
    ConfigErrors,
    describe,
    parse_section,
    section_schema,
)
from supervisor.config.units import format_size
from supervisor.config.worker_spec import ENV_VAR, SpawnError, check_options

# A config file larger than this is not a config file (and is not read whole into memory):
# a real one is a few KiB, and parsing 1 MiB of YAML took 12 s of CPU in pure Python (on
# the reload thread, whose GIL stalled the loop for seconds).
MAX_CONFIG_BYTES = 256 * 1024
# Values a config may hold once its YAML aliases are expanded (a real one holds hundreds).
MAX_CONFIG_VALUES = 100_000
# libyaml's parser where PyYAML has it (its wheels do): several times faster than the
# pure-Python one, and the same safe constructor.
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A model's options as JSON, at most (see options_problem).
MAX_OPTIONS_BYTES = 64 * 1024


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a YAML config file; raise ConfigErrors listing every problem (and
    nothing else, whatever the file holds)."""
    file = Path(path)
    try:
        data = _read_regular(file)
    except OSError as exc:
        raise ConfigErrors([ConfigError("", f"cannot read {file}: {exc.strerror}")]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigErrors([ConfigError("", f"{file} is larger than "
                                        f"{format_size(MAX_CONFIG_BYTES)}: not a config file")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigErrors([ConfigError("", f"{file} is not UTF-8 text: byte "
                                        f"{data[exc.start]:#04x} at offset {exc.start}")]) from None
    return parse_config(text, file)


def _read_regular(file: Path) -> bytes:
    """At most MAX_CONFIG_BYTES + 1 bytes of a regular file. Opened without blocking and
    refused unless regular: opening a FIFO for reading waits for a writer, and a reload
    that read one froze the daemon's loop (a device or socket is no config either)."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else \
                "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"it is {kind}; a config must be a regular file")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            return stream.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)


def parse_config(text: str, file: Path | None = None) -> Config:
    """Validate a config's text; raise ConfigErrors listing every problem. Any other error
    on the way is a bug, reported as a ConfigErrors too rather than escaping: a daemon that
    reloads its config must be able to say why a new one was refused."""
    try:
        return _parse_config(text, file)
    except ConfigErrors:
        raise
    except ConfigError as one:
        raise ConfigErrors([one]) from None
    except Exception as exc:
        raise ConfigErrors([ConfigError("", f"the configuration could not be checked: "
                                        f"unexpected {type(exc).__name__}: {_text(exc)}")]) \
            from exc


def _text(exc: BaseException, limit: int = 200) -> str:
    try:
        text = str(exc)
    except Exception:
        return "(no message)"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _named(exc: yaml.YAMLError, file: Path | None) -> yaml.YAMLError:
    """The error's positions name the file, not '<unicode string>' (the text was read
    first, so that a hung mount cannot block the parser)."""
    for mark in (getattr(exc, "context_mark", None), getattr(exc, "problem_mark", None)):
        if mark is not None and file is not None:
            mark.name = str(file)
    return exc


def _safe_load(text: str) -> Any:
    """YAML through libyaml (fast); a file it refuses is parsed again by PyYAML's own parser,
    whose error shows the offending line with a caret (libyaml's gives a position only)."""
    try:
        return yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError:
        if SAFE_LOADER is yaml.SafeLoader:
            raise
    return yaml.load(text, Loader=yaml.SafeLoader)


def options_problem(options: object) -> str | None:
    """Why a model's options could never reach its workers, or None. They travel as JSON in
    one environment variable (Linux takes 128 KiB in one): `check` and reload run the test
    the spawn runs, instead of every spawn failing later."""
    size = expanded_size(options, MAX_OPTIONS_BYTES, text_bytes=True)
    if size > MAX_OPTIONS_BYTES:
        return (f"about {size:,} bytes or more as JSON; at most {MAX_OPTIONS_BYTES // 1024} "
                "KiB travel to a worker: put large data in a file the handler reads")
    try:
        check_options(options)
    except SpawnError as exc:
        return str(exc).removeprefix(f"{ENV_VAR}: ")
    return None


def expanded_size(value: object, limit: int, text_bytes: bool = False) -> int:
    """How many values ``value`` holds once YAML aliases are expanded (``text_bytes``: how
    many bytes, about, as JSON), counted up to just past ``limit``. A 524-byte file of
    aliases nested seven deep is 10 million values, and one long string aliased 90,000
    times is 900 MB: each worker spawn expanded it (its options travel as JSON), froze the
    loop and then failed with E2BIG. Shared nodes are sized once (memo by id), so this is
    cheap whatever the nesting."""
    memo: dict[int, int] = {}

    def size(node: object) -> int:
        if id(node) in memo:
            return memo[id(node)]
        total = 8 + len(node) if text_bytes and isinstance(node, str) else \
            8 if text_bytes else 1
        children = node.values() if isinstance(node, dict) else \
            node if isinstance(node, list) else ()
        for child in children:
            total += size(child)
            if total > limit:
                break
        memo[id(node)] = total
        return total

    try:
        return size(value)
    except RecursionError:
        return limit + 1


def _parse_config(text: str, file: Path | None) -> Config:
    try:
        raw = _safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigErrors([ConfigError("", f"not valid YAML: {_named(exc, file)}")]) \
            from None
    except RecursionError:
        raise ConfigErrors([ConfigError("", "not valid YAML: nested too deeply")]) from None
    except ValueError as exc:  # a value YAML matched but Python cannot build: a 5000-digit
        # int, a timestamp like 2024-13-45
        raise ConfigErrors([ConfigError("", f"not valid YAML: {_text(exc)}")]) from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigErrors([ConfigError("", "expected a mapping at the top of the file")])
    if (size := expanded_size(raw, MAX_CONFIG_VALUES)) > MAX_CONFIG_VALUES:
        raise ConfigErrors([ConfigError("", f"the file holds more than "
                                        f"{MAX_CONFIG_VALUES:,} values ({size:,} at least, "
                                        "YAML aliases counted each time they are used): not "
                                        "a config file")])
    errors: list[ConfigError] = []
    try:
        top = parse_section(RawConfig, _with_default_policy(raw), "")
    except ConfigErrors as many:
        errors.extend(many.errors)
    except ConfigError as one:
        errors.append(one)
    if not raw.get("models"):
        errors.append(ConfigError("models", "expected at least one model"))
    if errors:
        raise ConfigErrors(errors)
    base = file.parent.resolve() if file else Path.cwd()
    runtime_dir = _runtime_dir(top.supervisor.runtime_dir, base)
    sup = _substitute(top.supervisor, runtime_dir)
    errors.extend(_check_endpoints(sup, runtime_dir))
    if errors:
        raise ConfigErrors(errors)
    models = {name: _resolve_paths(model, base) for name, model in top.models.items()}
    errors.extend(ConfigError(f"models.{name}.options", problem) for name, model in
                  models.items() if (problem := options_problem(model.options)) is not None)
    if errors:
        raise ConfigErrors(errors)
    curve = sup.curve
    if curve.server_secret_key and curve.authorized_clients:
        sup = dataclasses.replace(sup, curve=CurveConfig(
            str((base / curve.server_secret_key).resolve()),
            str((base / curve.authorized_clients).resolve()),
            str((base / curve.admin_clients).resolve()) if curve.admin_clients else None))
    sup = dataclasses.replace(sup, http=sup.http.files(base), grpc=sup.grpc.files(base))
    return Config(supervisor=sup, models=models, path=file, runtime_dir=runtime_dir)


@dataclass(frozen=True)
class ControlEndpoints:
    """Where the CLI reaches a running daemon: its status and admin endpoints."""

    control: str
    admin: str
    problems: tuple[str, ...] = ()  # why the file was not valid as a whole (then best effort)


def control_endpoints(path: str | os.PathLike[str]) -> ControlEndpoints:
    """The control and admin endpoints a config names, even when the rest of the file no
    longer validates: `status` and `recycle` talk to the daemon that is running, which was
    started from an earlier, valid version of the file, so a bad edit must not stop them."""
    try:
        config = load_config(path)
    except ConfigErrors as errors:
        problems = tuple(str(e) for e in errors.errors)
    else:
        return ControlEndpoints(config.supervisor.control, config.supervisor.admin)
    file = Path(path)
    section = _supervisor_section(file)

    def text(key: str, default: str | None) -> str | None:
        value = section.get(key)
        return value if isinstance(value, str) and "\0" not in value else default

    base = file.parent.resolve()
    runtime_dir = _runtime_dir(text("runtime_dir", None), base)
    if text("runtime_dir", None) is None:
        runtime_dir = _running_dir(runtime_dir)
    defaults = SupervisorSection()
    control = text("control", defaults.control) or defaults.control
    admin = text("admin", defaults.admin) or defaults.admin
    return ControlEndpoints(control.replace("{runtime_dir}", str(runtime_dir)),
                 admin.replace("{runtime_dir}", str(runtime_dir)), problems)


# Where the shipped unit's RuntimeDirectory= puts the sockets. An operator's shell has no
# $RUNTIME_DIRECTORY, so a config without runtime_dir names ./run beside itself there.
SYSTEMD_RUNTIME_DIR = Path("/run/tfsupervisor")


def _running_dir(guess: Path) -> Path:
    """The default runtime dir, or the systemd one when only that one has a daemon."""
    if not (guess / "control.sock").exists() and \
            (SYSTEMD_RUNTIME_DIR / "control.sock").exists():
        return SYSTEMD_RUNTIME_DIR
    return guess


def _supervisor_section(file: Path) -> dict[str, Any]:
    """The file's `supervisor` mapping, best effort: YAML first; a file that is not YAML
    any more (a bad edit elsewhere) is searched line by line for the keys that matter."""
    try:
        text = _read_regular(file)[:MAX_CONFIG_BYTES].decode("utf-8", "replace")
    except OSError:
        return {}
    try:
        raw = _safe_load(text)
        section = raw.get("supervisor") if isinstance(raw, dict) else None
        return section if isinstance(section, dict) else {}
    except Exception:  # not YAML: the plain key: value lines are the best guess left
        found = re.findall(r"^\s+(runtime_dir|control|admin):\s*[\"']?([^\"'\s#]+)", text,
                           re.MULTILINE)
        return dict(found)


def _with_default_policy(raw: dict[str, Any]) -> dict[str, Any]:
    """Lay defaults.policy under each model's policy, when both are well-formed mappings.

    A malformed defaults.policy is left out here: its own errors are reported once, under
    defaults.policy, rather than once per model.
    """
    defaults = raw.get("defaults")
    policy = defaults.get("policy") if isinstance(defaults, dict) else None
    models = raw.get("models")
    if not isinstance(policy, dict) or not isinstance(models, dict):
        return raw
    try:
        parse_section(PolicyConfig, policy, "defaults.policy")
    except ConfigErrors:
        return raw
    merged = {}
    for name, model in models.items():
        own = model.get("policy") if isinstance(model, dict) else None
        if isinstance(model, dict) and (own is None or isinstance(own, dict)):
            model = dict(model, policy={**policy, **(own or {})})
        merged[name] = model
    return dict(raw, models=merged)


def _resolve_paths(model: ModelConfig, base: Path) -> ModelConfig:
    """Model files are relative to the config file, so any working directory will do."""
    if model.saved_model:
        model = dataclasses.replace(model, saved_model=str((base / model.saved_model).resolve()))
    if model.keras:
        model = dataclasses.replace(model, keras=str((base / model.keras).resolve()))
    return model


def _runtime_dir(configured: str | None, base: Path) -> Path:
    if configured:
        return _own_dir((base / configured).resolve())
    env = os.environ.get("RUNTIME_DIRECTORY")
    if env:
        # systemd may list several directories separated by ':'; the first is ours.
        return _own_dir(Path(env.split(":")[0]))
    return _own_dir(base / "run")


def shared_dir(path: Path) -> bool:
    """A directory every user may write to (or sticky, like /tmp): not the daemon's."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and bool(mode & (stat.S_IWOTH | stat.S_ISVTX))


def _own_dir(path: Path) -> Path:
    """Where the sockets go: ``path``, or a directory of the daemon's own inside it when
    ``path`` is shared. Decided from the directory alone, so the daemon and the CLI (run
    by another user) agree."""
    return path / OWN_DIR if shared_dir(path) else path


def _substitute(sup: SupervisorSection, runtime_dir: Path) -> SupervisorSection:
    def sub(endpoint: str) -> str:
        return endpoint.replace("{runtime_dir}", str(runtime_dir))

    return dataclasses.replace(
        sup, endpoints=tuple(sub(e) for e in sup.endpoints), control=sub(sup.control),
        admin=sub(sup.admin))


def _check_endpoints(sup: SupervisorSection, runtime_dir: Path) -> list[ConfigError]:
    errors = []
    named = [(f"supervisor.endpoints[{i}]", e) for i, e in enumerate(sup.endpoints)]
    named += [("supervisor.control", sup.control), ("supervisor.admin", sup.admin),
              ("supervisor.runtime_dir", f"ipc://{runtime_dir}/{PRIVATE_DIR}/backend.sock")]
    seen: dict[str, str] = {}
    for path, endpoint in named:
        if endpoint in seen:  # one socket cannot be two endpoints with two kinds of access
            errors.append(ConfigError(path, f"{endpoint} is already {seen[endpoint]}"))
        seen.setdefault(endpoint, path)
        scheme, sep, rest = endpoint.partition("://")
        if not sep or scheme not in ("ipc", "tcp"):
            errors.append(ConfigError(path, f'expected an ipc:// or tcp:// endpoint, got '
                                      f'"{endpoint}"'))
        elif scheme == "ipc" and len(rest) > MAX_IPC_PATH:
            errors.append(ConfigError(path, f"ipc path is {len(rest)} bytes, longer than the "
                                      f"{MAX_IPC_PATH} the kernel allows: use a shorter "
                                      "runtime_dir"))
    return errors


def config_schema() -> dict[str, Any]:
    """JSON schema of config.yaml, for editors and `tfsupervisor schema`."""
    top = section_schema(RawConfig)
    top["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    top["title"] = "tfsupervisor config.yaml"
    return top


def config_reference() -> str:
    """docs/configuration.md, generated from the declarations in keys.py (a test keeps it so)."""
    sections = [("supervisor", SupervisorSection, "The daemon itself."),
                ("supervisor.curve", CurveConfig, CurveConfig.__doc__ or ""),
                ("supervisor.http", HttpSection, (HttpSection.__doc__ or "").replace(
                    "\n    ", " ")),
                ("supervisor.grpc", GrpcSection, (GrpcSection.__doc__ or "").replace(
                    "\n    ", " ")),
                ("models.NAME", ModelConfig, "One served model. Exactly one of `saved_model`, "
                 "`keras`, `handler`. Relative paths are relative to the config file."),
                ("models.NAME.tf", TfConfig, TfConfig.__doc__ or ""),
                ("models.NAME.batching", BatchingConfig, BatchingConfig.__doc__ or ""),
                ("models.NAME.padding.DIM", PaddingConfig, "One variable-length dimension, "
                 "by a name of your choice, padded up to allowed sizes. See "
                 "docs/batching.md, which says when padding is safe."),
                ("models.NAME.policy", PolicyConfig, "When a worker must go. Any key may also "
                 "be set under `defaults.policy`, which applies to every model and is "
                 "overridden by the model's own `policy`. See docs/policy.md.")]
    lines = ["# Configuration reference", "",
             "Generated from the settings' declarations (`tfsupervisor schema --markdown`); "
             "`tfsupervisor schema` prints the same as JSON Schema for editors.", "",
             "Sizes take bytes or units (`512MiB`, `2GB`); durations take seconds or units "
             "(`250ms`, `30s`, `5m`, `24h`, `2d`). `null` turns an optional limit off. "
             "Numbers must be finite: sizes and integers at most 2^63-1, durations at most "
             "10 years. Strings may not contain NUL characters. A config file is a "
             f"regular file of at most {MAX_CONFIG_BYTES // 1024} KiB holding at most "
             f"{MAX_CONFIG_VALUES:,} values once its YAML aliases are expanded.", ""]
    for prefix, cls, text in sections:
        lines += [f"## `{prefix}`", "", text, "", "| key | expects | default | meaning |",
                  "|---|---|---|---|"]
        for key, expected, default, help_text in describe(cls):
            if key in ("tf", "policy", "curve", "http", "grpc", "batching", "padding"):
                continue
            lines.append(f"| `{key}` | {expected} | `{default}` | {help_text} |")
        lines.append("")
    return "\n".join(lines)
