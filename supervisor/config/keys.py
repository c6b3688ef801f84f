"""tfsupervisor's configuration keys: every section and setting declared once, validated whole.

No YAML here (supervisor/config/loading.py reads the file): the core imports these types and
nothing of the loader.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from supervisor.config.settings import (
    Bool,
    Choice,
    ConfigError,
    Duration,
    Float,
    FreeMap,
    Int,
    ListOf,
    MapOf,
    Optional,
    Section,
    Size,
    Str,
    setting,
)
from supervisor.shared.padding import PadDim, from_config
from supervisor.shared.protocol import MAX_BATCH_JOBS, MAX_NAME, MAX_NDIM

T = TypeVar("T")

# The backend socket lives in this subdirectory of the runtime dir, which only the service
# user may enter: clients share the runtime dir's group, workers are the supervisor's own.
PRIVATE_DIR = "private"
# A runtime_dir every user may write to (/tmp, mode 1777) is not the daemon's to change: its
# sockets go in this subdirectory of it, which it makes (0750) and owns.
OWN_DIR = "tfsupervisor"
# ipc:// paths are limited by sockaddr_un (108 bytes including the terminating NUL).
MAX_IPC_PATH = 107
# The longest a padded dimension may be, and the most shapes a worker warms up (batch sizes
# times every combination of padding sizes): warm-up is start-up time, which every
# replacement pays again.
MAX_PAD_SIZE = 2**20
MAX_WARMUP_SHAPES = 256
# Input and output names as the protocol allows them (docs/protocol.md): any text of 1 to
# MAX_NAME characters but NUL.
INPUT_NAME = rf"^[^\x00]{{1,{MAX_NAME}}}$"
# Bounds past which a value is a typo, not a setting: a poll reads every worker's /proc
# files (faster is a busy loop), a batch that waits a minute for company is a stuck queue,
# and a model with more workers than this would not fit a machine (each loads TensorFlow).
MIN_POLL_INTERVAL = 0.05
MAX_BATCH_TIMEOUT_MS = 60_000.0
MAX_WORKERS = 256
# Floors under which nothing can ever be served, though the value parses: a worker cannot
# load, a drain or a shutdown cannot finish a job, in less than a second (0 killed every
# worker at start, or answered every job 'timeout'); the smallest request header (one model
# name, one array spec) is ~70 bytes and a whole request ~100; a queue of 0 bytes holds
# nothing.
MIN_WAIT = 1.0
MIN_HEADER = 128
MIN_MESSAGE = 1024
MIN_QUEUE_BYTES = 1
# HTTP front processes per daemon (each a Python process of ~40 MB), and the shortest HTTP
# wait that can carry a request at all.
MAX_FRONTS = 64
MIN_HTTP_WAIT = 0.1


@dataclass(frozen=True)
class PolicyConfig:
    """When a worker must go. Defaults are safe for TensorFlow: see docs/policy.md."""

    memory_metric: str = setting(
        Choice("rss", "uss", "pss"), "rss",
        "Memory figure judged: rss (cheap), uss (private pages) or pss (shared pages split).")
    warmup_jobs: int = setting(
        Int(0), 100, "Jobs a worker must have done before its memory trend is judged.")
    warmup_seconds: float = setting(
        Duration(), 30.0, "Age a worker must have before its memory trend is judged.")
    max_memory: int | None = setting(
        Optional(Size()), None, "Soft memory limit: crossing it recycles the worker gracefully.")
    kill_memory: int | None = setting(
        Optional(Size()), None, "Hard memory limit: crossing it kills the worker at once; "
        "its jobs are requeued.")
    max_growth_per_1k_jobs: int | None = setting(
        Optional(Size()), 100 * 1024**2,
        "Recycle when memory grows faster than this per 1000 jobs (robust trend, after warm-up).")
    max_growth_per_hour: int | None = setting(
        Optional(Size()), 1024**3,
        "Recycle when memory grows faster than this per hour (robust trend, after warm-up).")
    trend_window: int = setting(
        Int(8), 60, "Samples (one per poll interval) the trend is fitted on.")
    trend_confirmations: int = setting(
        Int(1), 3, "Consecutive evaluations the trend must hold before a recycle.")
    trend_horizon: float = setting(
        Duration(), 86400.0,
        "Growth projected to stay under max_memory for this long is not acted on.")
    trend_lead: float = setting(
        Float(0.0, 100.0, expected="0 (off), or a number >= 1 and <= 100"), 3.0,
        "With max_memory set, a growth trend recycles only once the "
        "projected time to max_memory is under this many times the worker's own start-up (plus the "
        "confirmations' polls): a worker lives as long as it safely can. 0: act as soon as "
        "the trend is confirmed (within trend_horizon); otherwise at least 1.")
    max_vram: int | None = setting(
        Optional(Size()), None, "Soft GPU memory limit (NVML, per process).")
    max_vram_growth_per_1k_jobs: int | None = setting(
        Optional(Size()), None, "Recycle when GPU memory grows faster than this per 1000 jobs.")
    max_jobs: int | None = setting(
        Optional(Int(1)), None, "Recycle after this many jobs (jittered per worker).")
    max_age: float | None = setting(
        Optional(Duration()), None, "Recycle after this age (jittered per worker).")
    jitter: float = setting(
        Float(0.0, 0.5), 0.1, "Fraction by which max_jobs and max_age are lowered at random "
        "per worker, so a pool never recycles in lockstep.")
    job_timeout: float | None = setting(
        Optional(Duration()), None, "A job running longer is answered 'timeout' and its "
        "worker killed (TensorFlow cannot be interrupted safely).")
    drain_timeout: float = setting(
        Duration(MIN_WAIT), 60.0, "How long a recycled worker may take to finish its in-flight "
        "jobs before they are requeued and it is killed.")
    max_attempts: int = setting(
        Int(1), 2, "Workers a job may be sent to, every loss counted whatever its cause; a job "
        "lost this many times is answered 'worker_crashed'.")
    max_concurrent_recycles: int = setting(
        Int(1), 1, "Graceful recycles (trend, lifetime, manual, reload) of this model under "
        "way at once, each until its replacement is ready; a crossed max_memory, max_vram or "
        "kill_memory acts at once (a soft limit never takes the model's last ready worker "
        "before its replacement is ready).")
    surge: bool = setting(
        Bool(), True, "Start the replacement and wait for it to be ready before draining.")
    min_lifetime: float = setting(
        Duration(), 120.0, "Workers recycled for memory younger than this, twice in a row, mean "
        "the policy is too tight: a loud event is logged (recycles go on: a limit is a limit).")

    def check(self, path: str) -> list[ConfigError]:
        errors = []
        if self.kill_memory is not None and self.max_memory is not None \
                and self.kill_memory <= self.max_memory:
            errors.append(ConfigError(f"{path}.kill_memory", "must be larger than max_memory"))
        if 0 < self.trend_lead < 1:
            errors.append(ConfigError(f"{path}.trend_lead", "must be 0 (off) or at least 1: "
                                      "a lead shorter than one start-up leaves no time for "
                                      "the replacement"))
        if self.job_timeout is not None and self.job_timeout <= 0:
            errors.append(ConfigError(f"{path}.job_timeout", "must be more than 0 (null turns "
                                      "it off)"))
        return errors


@dataclass(frozen=True)
class TfConfig:
    """TensorFlow runtime settings, applied in the worker before the model loads."""

    intra_op_threads: int = setting(Int(0), 0, "Threads inside one op (0: TensorFlow's choice).")
    inter_op_threads: int = setting(Int(0), 0, "Ops run in parallel (0: TensorFlow's choice).")
    gpu_memory_growth: bool = setting(
        Bool(), True, "Let the GPU pool grow on demand instead of taking the whole card.")
    gpu_memory_limit: int | None = setting(
        Optional(Size()), None, "Cap on this worker's GPU pool (a logical device of this size).")


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching: queued jobs combined into one call, padded to allowed sizes."""

    max_batch_size: int = setting(
        Int(1, MAX_BATCH_JOBS), 32, "Most rows in one batch; 1 turns batching off (handlers "
        "that cannot batch).")
    batch_timeout_ms: float | None = setting(
        Optional(Float(0.0, MAX_BATCH_TIMEOUT_MS)), None, "How long a partial batch may wait "
        "for more jobs. Not set: adaptive (no wait while each job finds an idle worker; "
        "under load, long enough to gather the rows that make a call's fixed cost small, at "
        "most two calls' time and 20 ms: `status` shows the wait and why). A number fixes "
        "it; 0: dispatch at once (batches then form only under load). At most 60000 (a "
        "minute).")
    allowed_batch_sizes: tuple[int, ...] | None = setting(
        Optional(ListOf(Int(1), min_items=1)), None, "Sizes a batch is padded up to; default "
        "powers of two up to max_batch_size. Fewer shapes, less TF memory growth.")

    def check(self, path: str) -> list[ConfigError]:
        sizes = self.allowed_batch_sizes
        if sizes and max(sizes) != self.max_batch_size:
            return [ConfigError(f"{path}.allowed_batch_sizes",
                                f"the largest size must be max_batch_size ({self.max_batch_size})")]
        return []


@dataclass(frozen=True)
class PaddingConfig:
    """One variable-length dimension padded up to allowed sizes (docs/batching.md)."""

    inputs: dict[str, int] = setting(
        MapOf(Int(1, MAX_NDIM - 1), key_pattern=INPUT_NAME), {}, "The inputs that have this "
        "dimension, each with its axis (1 or more: axis 0 is the batch).")
    sizes: tuple[int, ...] = setting(
        ListOf(Int(1, MAX_PAD_SIZE), min_items=1), [1], "Lengths a job is padded up to "
        "(e.g. 32, 64, 128, 256, 512; in any order); a longer job is refused bad_request.")
    value: float = setting(
        Float(-1e300, 1e300, expected="a finite number"), 0.0, "What padded positions hold "
        "(cast to each input's dtype, which must hold it exactly; unused with changes_outputs).")
    outputs: dict[str, int] = setting(
        MapOf(Int(1, MAX_NDIM - 1), key_pattern=INPUT_NAME), {}, "Outputs with an axis that "
        "follows this dimension, each with that axis: cut back to each job's own length.")
    mask_input: str | None = setting(
        Optional(Str()), None, "An input the worker generates (int32, rows x padded length: 1 "
        "real, 0 padded) for models that take a mask; clients do not send it.")
    length_input: str | None = setting(
        Optional(Str()), None, "An input the worker generates (int32, one length per row) "
        "for models that take lengths; clients do not send it.")
    changes_outputs: bool = setting(
        Bool(), False, "true: padding would change this model's outputs (nothing masks it), "
        "so jobs are not padded; only jobs of equal length batch together, and the sizes "
        "are still warmed up and bound the length.")
    verify: bool = setting(
        Bool(), True, "At load, run a job padded and unpadded and refuse to serve (load "
        "error) if padding changes its outputs.")

    def check(self, path: str) -> list[ConfigError]:
        errors = []
        if not self.inputs:
            errors.append(ConfigError(f"{path}.inputs", "name at least one input and its axis"))
        if len(set(self.sizes)) != len(self.sizes):
            errors.append(ConfigError(f"{path}.sizes", "sizes must be distinct"))
        made = [n for n in (self.mask_input, self.length_input) if n is not None]
        for name in made:
            if name in self.inputs:
                errors.append(ConfigError(path, f"'{name}' is generated by the worker: it "
                                          "cannot also be a padded input"))
        if len(made) == 2 and made[0] == made[1]:
            errors.append(ConfigError(path, "mask_input and length_input must differ"))
        return errors


@dataclass(frozen=True)
class ModelConfig:
    """One served model: exactly one source, its workers and its policy."""

    saved_model: str | None = setting(Optional(Str()), None, "Path of a SavedModel directory.")
    keras: str | None = setting(Optional(Str()), None, "Path of a .keras model file.")
    handler: str | None = setting(
        Optional(Str()), None, "A user handler 'module:factory'; factory(options) returns a "
        "callable from dict of arrays to dict of arrays.")
    signature: str = setting(Str(), "serving_default", "SavedModel signature to serve.")
    options: dict[str, Any] = setting(FreeMap(), {}, "Passed to the handler factory: JSON "
                                         "values, at most 64 KiB as JSON (they travel in the "
                                         "worker's environment); larger data belongs in a "
                                         "file the handler reads.")
    workers: int = setting(Int(1, MAX_WORKERS), 1, "Worker processes serving this model "
                           "(at most 256).")
    required: bool = setting(
        Bool(), True, "Whether the daemon is ready (systemd READY=1, `status --ready`) only "
        "once this model has its ready workers. false: a model that cannot load does not "
        "hold back the others.")
    env: dict[str, str] = setting(
        FreeMap(strings=True), {}, "Extra environment for this model's workers.")
    probes: bool = setting(
        Bool(), True, "Whether the workers sample leak probes (traced graphs, Python and "
        "native heap, input shapes, per-shape memory growth) into their heartbeats, which "
        "recycle events quote to say why a worker grew. false: for measuring their cost.")
    tf: TfConfig = setting(Section(TfConfig), None, "TensorFlow runtime settings.")
    policy: PolicyConfig = setting(
        Section(PolicyConfig), None, "Recycling policy (over defaults.policy).")
    batching: BatchingConfig = setting(
        Section(BatchingConfig), None, "Dynamic batching.")
    padding: dict[str, PaddingConfig] = setting(
        MapOf(Section(PaddingConfig)), {}, "Variable-length dimensions by a name of your "
        "choice, each padded up to allowed sizes so that jobs of different lengths batch "
        "together and the model sees a bounded set of shapes (docs/batching.md).")
    warmup_batch_sizes: tuple[int, ...] = setting(
        ListOf(Int(1, MAX_BATCH_JOBS), min_items=1), [1], "Batch sizes the worker warms up "
        "with before it reports ready, each with every padding size: the memory TensorFlow "
        "takes per shape is then in the baseline, not mistaken for growth.")

    def check(self, path: str) -> list[ConfigError]:
        sources = [s for s in ("saved_model", "keras", "handler") if getattr(self, s)]
        if len(sources) != 1:
            got = ", ".join(sources) if sources else "none"
            return [ConfigError(path, f"expected exactly one of saved_model, keras, handler; "
                                f"got {got}")]
        if self.handler and (":" not in self.handler or self.handler.startswith(":")):
            return [ConfigError(f"{path}.handler",
                                f'expected "module:factory", got "{self.handler}"')]
        too_big = [n for n in self.warmup_batch_sizes if n > self.batching.max_batch_size]
        if too_big:
            return [ConfigError(f"{path}.warmup_batch_sizes", f"{too_big[0]} is more than "
                                f"batching.max_batch_size ({self.batching.max_batch_size}): "
                                "no batch that large is ever sent")]
        return self._check_padding(f"{path}.padding")

    def _check_padding(self, path: str) -> list[ConfigError]:
        """Across dimensions: an input padded on one axis by one dimension only, and a
        generated input not also an input the client sends."""
        errors = []
        axes: dict[tuple[str, int], str] = {}
        padded = {name for dim in self.padding.values() for name in dim.inputs}
        made: dict[str, str] = {}
        for dim_name, dim in self.padding.items():
            for name, axis in dim.inputs.items():
                other = axes.setdefault((name, axis), dim_name)
                if other != dim_name:
                    errors.append(ConfigError(f"{path}.{dim_name}.inputs.{name}", f"axis "
                                              f"{axis} of '{name}' is padded by '{other}' too"))
            for generated in (dim.mask_input, dim.length_input):
                if generated is None:
                    continue
                if generated in padded:
                    errors.append(ConfigError(f"{path}.{dim_name}", f"'{generated}' is "
                                              "generated by the worker: it cannot also be a "
                                              "padded input"))
                first = made.setdefault(generated, dim_name)
                if first != dim_name:
                    errors.append(ConfigError(f"{path}.{dim_name}", f"'{generated}' is "
                                              f"generated for '{first}' already"))
        shapes = len(self.warmup_batch_sizes) * math.prod(
            len(dim.sizes) for dim in self.padding.values())
        if shapes > MAX_WARMUP_SHAPES:
            errors.append(ConfigError(path, f"{shapes} warm-up shapes (warmup_batch_sizes "
                                      f"times every combination of sizes): at most "
                                      f"{MAX_WARMUP_SHAPES}; every replacement warms them all"))
        return errors

    @functools.cached_property
    def pad_dims(self) -> tuple[PadDim, ...]:
        return from_config(self.padding)

    @property
    def input_shapes(self) -> int:
        """Distinct input shapes batching and padding let a worker see: the allowed batch
        sizes times every combination of padding sizes (dimensions nothing pads may add
        more: the policy counts graphs past a bound, core/policy.py GRAPHS_PER_SHAPE)."""
        return len(self.batch_policy.allowed) * math.prod(
            len(dim.sizes) for dim in self.padding.values())

    @functools.cached_property
    def batch_policy(self) -> BatchPolicy:
        b = self.batching
        return BatchPolicy.from_config(b.max_batch_size, b.batch_timeout_ms,
                                       b.allowed_batch_sizes)

    @property
    def source(self) -> tuple[str, str]:
        """(kind, location) of the model: kind is saved_model, keras or handler."""
        for kind in ("saved_model", "keras", "handler"):
            value = getattr(self, kind)
            if value:
                return kind, value
        raise ValueError("model has no source")  # unreachable after check()


@dataclass(frozen=True)
class CurveConfig:
    """CURVE encryption and client authentication for the frontend, control and admin sockets."""

    server_secret_key: str | None = setting(
        Optional(Str()), None, "The server's secret certificate (from `tfsupervisor keygen`); "
        "set it to turn CURVE on.")
    authorized_clients: str | None = setting(
        Optional(Str()), None, "Directory of authorized client public certificates (*.key); "
        "re-read on reload.")
    admin_clients: str | None = setting(
        Optional(Str()), None, "Directory of the client certificates (*.key) a TCP admin "
        "endpoint admits (recycle, reload); re-read on reload. Required for a TCP admin "
        "endpoint.")

    @property
    def enabled(self) -> bool:
        return self.server_secret_key is not None

    def check(self, path: str) -> list[ConfigError]:
        if (self.server_secret_key is None) != (self.authorized_clients is None):
            return [ConfigError(path, "expected both server_secret_key and "
                                "authorized_clients, or neither")]
        if self.admin_clients is not None and self.server_secret_key is None:
            return [ConfigError(f"{path}.admin_clients", "needs server_secret_key and "
                                "authorized_clients: admin keys are CURVE keys")]
        return []

    @property
    def key_directories(self) -> dict[str, str]:
        """Client key directories by the setting that names them (read at start and on
        every reload)."""
        named = {"authorized_clients": self.authorized_clients,
                 "admin_clients": self.admin_clients}
        return {name: value for name, value in named.items() if value is not None}


@dataclass(frozen=True)
class HttpSection:
    """The HTTP front: the Open Inference Protocol v2 (KServe, Triton) and TF Serving's REST
    API, served by front processes that forward to the daemon as clients (docs/http.md)."""

    listen: str | None = setting(
        Optional(Str()), None, "HOST:PORT the HTTP front listens on, e.g. 127.0.0.1:8080 "
        "(off when null). Beyond loopback it needs tls_cert and tls_key, or insecure: true.")
    processes: int = setting(
        Int(1, MAX_FRONTS), 2, "Front processes sharing the port (each one asyncio loop; "
        "one per core the front should use).")
    insecure: bool = setting(
        Bool(), False, "Allow plain HTTP beyond loopback. Anyone who reaches the port can "
        "submit jobs (set token_file to ask for a bearer token).")
    tls_cert: str | None = setting(
        Optional(Str()), None, "PEM certificate chain file: HTTPS (with tls_key). Read when "
        "a front starts.")
    tls_key: str | None = setting(
        Optional(Str()), None, "PEM private key file of tls_cert.")
    token_file: str | None = setting(
        Optional(Str()), None, "File holding a bearer token: requests must send "
        "`Authorization: Bearer TOKEN` (health endpoints excepted). Read at start.")
    max_body_size: int = setting(
        Size(1024), 64 * 1024**2, "Largest request body; a larger one is answered 413 before "
        "it is read. At most supervisor.max_message_size matters: the job must fit it too.")
    default_timeout: float = setting(
        Duration(MIN_HTTP_WAIT), 60.0, "A request's deadline when it names none "
        "(parameters.timeout, in microseconds as Triton's clients send it).")
    keepalive_timeout: float = setting(
        Duration(MIN_HTTP_WAIT), 5.0, "An idle keep-alive connection is closed after this.")
    request_timeout: float = setting(
        Duration(MIN_HTTP_WAIT), 30.0, "A request's head and body must arrive within this "
        "from its first byte, or the connection is closed (slow clients cannot hold a front).")
    max_connections: int = setting(
        Int(1, 1_000_000), 1000, "Open connections per front process; a new one beyond is "
        "answered 503 and closed.")
    access_log: bool = setting(
        Bool(), False, "Log one line per request (method, route, status, seconds).")

    def check(self, path: str) -> list[ConfigError]:
        return _listening(path, self.listen, self.tls_cert, self.tls_key, self.insecure)

    def files(self, base: Path) -> HttpSection:
        """The file settings resolved against the config file's directory."""
        return _resolved(self, base, "tls_cert", "tls_key", "token_file")


@dataclass(frozen=True)
class GrpcSection:
    """The gRPC front: the Open Inference Protocol's GRPCInferenceService (KServe v2, as
    tritonclient.grpc speaks it) and grpc.health.v1, served by the same front processes as
    HTTP (supervisor.http.processes of them; docs/grpc.md)."""

    listen: str | None = setting(
        Optional(Str()), None, "HOST:PORT the gRPC front listens on, e.g. 127.0.0.1:8081 "
        "(off when null). Beyond loopback it needs tls_cert and tls_key, or insecure: true.")
    insecure: bool = setting(
        Bool(), False, "Allow plaintext gRPC beyond loopback. Anyone who reaches the port can "
        "submit jobs.")
    tls_cert: str | None = setting(
        Optional(Str()), None, "PEM certificate chain file: gRPC over TLS (with tls_key).")
    tls_key: str | None = setting(
        Optional(Str()), None, "PEM private key file of tls_cert.")

    def check(self, path: str) -> list[ConfigError]:
        return _listening(path, self.listen, self.tls_cert, self.tls_key, self.insecure)

    def files(self, base: Path) -> GrpcSection:
        """The file settings resolved against the config file's directory."""
        return _resolved(self, base, "tls_cert", "tls_key")


def _resolved(section: T, base: Path, *keys: str) -> T:
    """``section`` with the file settings ``keys`` made absolute against ``base``."""
    values = {key: getattr(section, key) for key in keys}
    return dataclasses.replace(section, **{  # type: ignore[type-var]
        key: None if value is None else str((base / value).resolve())
        for key, value in values.items()})


def _listening(path: str, listen: str | None, tls_cert: str | None, tls_key: str | None,
               insecure: bool) -> list[ConfigError]:
    """A front's address: HOST:PORT; beyond loopback only with TLS or insecure: true (the
    rule the ZeroMQ frontend has with CURVE)."""
    if listen is None:
        return []
    errors = _metrics_address(f"{path}.listen", listen)
    if (tls_cert is None) != (tls_key is None):
        errors.append(ConfigError(path, "expected both tls_cert and tls_key, or neither"))
    host = listen.rpartition(":")[0]
    if not errors and tls_cert is None and not insecure and \
            not is_loopback(f"tcp://{host}:0"):
        errors.append(ConfigError(
            f"{path}.listen", f"{listen} is reachable beyond this host without encryption: "
            f"set tls_cert and tls_key, listen on loopback, or write {path}.insecure: true"))
    return errors


@dataclass(frozen=True)
class SupervisorSection:
    """The daemon itself."""

    endpoints: tuple[str, ...] = setting(
        ListOf(Str(), min_items=1), ["ipc://{runtime_dir}/frontend.sock"],
        "Frontend endpoints clients connect to; {runtime_dir} is substituted.")
    control: str = setting(
        Str(), "ipc://{runtime_dir}/control.sock", "Status endpoint (read-only: `status`, "
        "`top`, readiness probes); reachable by socket_group.")
    admin: str = setting(
        Str(), "ipc://{runtime_dir}/admin.sock", "Admin endpoint: `recycle` and `reload` "
        "(and `status`). ipc: the service user only, or admin_group; tcp: CURVE keys from "
        "curve.admin_clients.")
    admin_group: str | None = setting(
        Optional(Str()), None, "Group given access to the admin ipc socket (mode 0660); "
        "default none: only the service user (and root). Its members must also be able to "
        "enter the runtime dir (socket_group).")
    runtime_dir: str | None = setting(
        Optional(Str()), None, "Directory for ipc sockets; default $RUNTIME_DIRECTORY, "
        "else ./run beside the config file. Never changed when it exists already; one every "
        "user may write to (like /tmp) holds the sockets in a `tfsupervisor` directory of "
        "the daemon's own inside it.")
    poll_interval: float = setting(
        Duration(MIN_POLL_INTERVAL), 1.0, "How often worker memory is sampled and policies "
        "evaluated (at least 50ms: each poll reads every worker's /proc files).")
    max_queue: int = setting(
        Int(1), 1000, "Jobs a model may hold, queued and running, before 'overloaded'.")
    max_queue_bytes: int = setting(
        Size(MIN_QUEUE_BYTES), 256 * 1024**2, "Bytes of queued job arrays per model before "
        "new jobs are refused 'overloaded'; ZeroMQ's receive buffers are bounded to match (see "
        "docs/protocol.md).")
    max_message_size: int = setting(
        Size(MIN_MESSAGE), 256 * 1024**2, "Largest frontend message, all frames together: a larger "
        "one is answered 'bad_request'; a single frame larger than this is dropped by ZeroMQ "
        "unanswered.")
    heartbeat_interval: float = setting(Duration(), 1.0, "Worker heartbeat period.")
    heartbeat_timeout: float = setting(
        Duration(), 10.0, "A ready worker silent this long is hung: killed and replaced.")
    start_timeout: float = setting(
        Duration(MIN_WAIT), 600.0, "A worker not ready after this long (loading, warm-up) is "
        "killed.")
    shutdown_timeout: float = setting(
        Duration(MIN_WAIT), 30.0, "On SIGTERM, how long queued and in-flight jobs may take to "
        "finish.")
    min_available_memory: int | None = setting(
        Optional(Size()), None, "Memory pressure. On a bare host: below this much available "
        "memory the fastest-growing worker is recycled, one at a time (host_pressure). Under "
        "a cgroup limit: the kill buffer, what must stay free (also beside a replacement); "
        "workers are recycled (container_pressure) when the headroom (the limit less the "
        "working set, or the host's available memory where tighter) is under it plus the "
        "workers' growth rate times what a recycle takes to free memory. Unset: under a "
        "cgroup limit 5% of it (at most 512MiB), else the rule is off.")
    worker_oom_score_adj: int = setting(
        Int(-1000, 1000), 500, "oom_score_adj given to every worker (and what it starts) so "
        "that, where the kernel OOM-kills one process, it picks a worker, not the supervisor. "
        "Raising needs no privilege; a value under the supervisor's own is raised to it.")
    metrics: str | None = setting(
        Optional(Str()), None, "Listen address of Prometheus /metrics and the /livez and "
        "/readyz probes, e.g. 127.0.0.1:9464 (off when null).")
    ready_min_workers: int | None = setting(
        Optional(Int(1)), None, "Ready workers each model needs before the daemon reports "
        "ready (systemd READY=1, status --ready); null: all configured workers.")
    log_level: str = setting(
        Choice("debug", "info", "warning", "error"), "info", "Lowest log level written.")
    log_format: str = setting(
        Choice("auto", "console", "json"), "auto", "console on a terminal and JSON lines "
        "otherwise (auto), or either always; `run --log-format` overrides it.")
    curve: CurveConfig = setting(
        Section(CurveConfig), None, "CURVE keys; required for TCP beyond loopback.")
    http: HttpSection = setting(
        Section(HttpSection), None, "The HTTP front (Open Inference Protocol v2, TF Serving "
        "REST); off unless listen is set.")
    grpc: GrpcSection = setting(
        Section(GrpcSection), None, "The gRPC front (Open Inference Protocol v2); off unless "
        "listen is set.")
    insecure: bool = setting(
        Bool(), False, "Allow TCP endpoints beyond loopback (and TCP control or admin "
        "endpoints) without CURVE. Anyone who reaches them can submit jobs or stop workers.")
    socket_group: str | None = setting(
        Optional(Str()), None, "Group given access to the ipc sockets (mode 0660 in a 0750 "
        "directory); default: the supervisor's own group.")
    max_header_size: int = setting(
        Size(MIN_HEADER), 64 * 1024, "Largest request header (at most 64KiB).")
    max_arrays: int = setting(Int(1), 64, "Arrays per request (at most 64).")
    max_elements: int = setting(
        Int(1), 256 * 1024**2, "Elements in all arrays of one request together.")

    def check(self, path: str) -> list[ConfigError]:
        errors = []
        if self.heartbeat_interval <= 0:
            errors.append(ConfigError(f"{path}.heartbeat_interval", "must be more than 0"))
        if self.poll_interval <= 0:
            errors.append(ConfigError(f"{path}.poll_interval", "must be more than 0"))
        if self.heartbeat_timeout <= 2 * self.heartbeat_interval:
            errors.append(ConfigError(f"{path}.heartbeat_timeout",
                                      "must be more than twice heartbeat_interval"))
        if self.max_header_size > 64 * 1024:
            errors.append(ConfigError(f"{path}.max_header_size", "must be at most 64KiB"))
        if self.max_arrays > 64:
            errors.append(ConfigError(f"{path}.max_arrays", "must be at most 64"))
        if self.metrics is not None:
            errors.extend(_metrics_address(f"{path}.metrics", self.metrics))
        if not (self.curve.enabled or self.insecure):
            errors.extend(_exposed(path, self.endpoints, self.control, self.admin))
        if self.http.listen and self.grpc.listen and \
                self.http.listen.rpartition(":")[2] == self.grpc.listen.rpartition(":")[2]:
            errors.append(ConfigError(f"{path}.grpc.listen", "the HTTP and gRPC fronts need "
                                      "ports of their own"))
        if self.curve.enabled and self.admin.startswith("tcp://") and \
                self.curve.admin_clients is None:
            errors.append(ConfigError(f"{path}.admin", "a TCP admin endpoint needs "
                                      "supervisor.curve.admin_clients: the keys that may "
                                      "recycle and reload"))
        return errors


@dataclass(frozen=True)
class DefaultsSection:
    policy: PolicyConfig = setting(
        Section(PolicyConfig), None, "Policy keys applied to every model, under its own policy.")


@dataclass(frozen=True)
class RawConfig:
    """The file's top level, as declared."""

    supervisor: SupervisorSection = setting(
        Section(SupervisorSection), None, "The daemon's own settings.")
    defaults: DefaultsSection = setting(
        Section(DefaultsSection), None, "Defaults applied to every model.")
    models: dict[str, ModelConfig] = setting(
        MapOf(Section(ModelConfig)), {}, "Served models by name.")


@dataclass(frozen=True)
class Config:
    """A validated configuration, paths resolved and endpoints substituted."""

    supervisor: SupervisorSection
    models: dict[str, ModelConfig]
    path: Path | None
    runtime_dir: Path

    @property
    def backend(self) -> str:
        return f"ipc://{self.runtime_dir}/{PRIVATE_DIR}/backend.sock"


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int = 1
    timeout: float = 0.0  # seconds a partial batch may wait
    allowed: tuple[int, ...] = (1,)  # sizes a batch is padded up to (ascending)
    adaptive: bool = False  # the wait is decided from measurements (core/batch_wait.py)

    @classmethod
    def from_config(cls, max_batch_size: int, timeout_ms: float | None,
                    allowed: tuple[int, ...] | None) -> BatchPolicy:
        sizes = tuple(sorted(set(allowed))) if allowed else powers_of_two(max_batch_size)
        if timeout_ms is None:
            return cls(max_batch_size, 0.0, sizes, adaptive=True)
        return cls(max_batch_size, timeout_ms / 1000.0, sizes)

    def pad_to(self, rows: int) -> int:
        """The smallest allowed size holding ``rows``; ``rows`` itself past the largest."""
        return next((size for size in self.allowed if size >= rows), rows)


def powers_of_two(limit: int) -> tuple[int, ...]:
    sizes = [1]
    while sizes[-1] * 2 < limit:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != limit:
        sizes.append(limit)
    return tuple(sizes)


def _metrics_address(path: str, address: str) -> list[ConfigError]:
    """HOST:PORT (or :PORT, or [v6]:PORT) with a port the kernel can bind."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return [ConfigError(path, f'expected HOST:PORT with a port from 1 to 65535, got '
                            f'"{address}"')]
    if host.startswith("[") != host.endswith("]"):
        return [ConfigError(path, f'an IPv6 host goes in brackets, e.g. "[::1]:9464"; got '
                            f'"{address}"')]
    return []


# Names that mean the loopback interface itself: ZeroMQ binds to an interface by its name.
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback", "lo"})


def is_loopback(endpoint: str) -> bool:
    """A tcp:// endpoint on a loopback address (127.0.0.0/8, ::1 in any spelling, an IPv4
    address mapped into IPv6) or the loopback's names. A host name that merely begins with
    "127." is not one."""
    host = endpoint.partition("://")[2].rpartition(":")[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host.lower() in LOOPBACK_NAMES
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _exposed(path: str, endpoints: tuple[str, ...], control: str,
             admin: str) -> list[ConfigError]:
    """Plain TCP beyond loopback, or a TCP control or admin socket, needs CURVE or
    insecure: true."""
    errors = []
    for i, endpoint in enumerate(endpoints):
        if endpoint.startswith("tcp://") and not is_loopback(endpoint):
            errors.append(ConfigError(
                f"{path}.endpoints[{i}]", f"{endpoint} is reachable beyond this host without "
                "encryption or authentication: configure supervisor.curve, bind to loopback, "
                "or write supervisor.insecure: true"))
    if control.startswith("tcp://"):
        errors.append(ConfigError(f"{path}.control", "a TCP control endpoint shows every "
                                  "model and worker: it needs supervisor.curve (or "
                                  "supervisor.insecure: true); the default is an ipc socket"))
    if admin.startswith("tcp://"):
        errors.append(ConfigError(f"{path}.admin", "a TCP admin endpoint can recycle workers "
                                  "and reload the config: it needs supervisor.curve with "
                                  "admin_clients (or supervisor.insecure: true); the default "
                                  "is an ipc socket"))
    return errors
