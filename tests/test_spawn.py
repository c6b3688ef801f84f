"""The spawn contract (supervisor/config/worker_spec.py) and the worker's side of it, on real
processes.

The worker subprocesses here run the TF-free echo handler against a fake backend (a ROUTER
socket in a short temporary directory); every wait is on a condition (a message, a process
exit) with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from supervisor.config.keys import TfConfig
from supervisor.config.loading import load_config
from supervisor.config.worker_spec import (
    ENV_VAR,
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_PID,
    SOURCES,
    SYSTEMD_ONLY,
    TF_FIELDS,
    SpawnError,
    WorkerSpec,
    build_spec,
    worker_command,
    worker_env,
)
from supervisor.shared.exitcodes import WorkerExit
from supervisor.shared.protocol import (
    HEARTBEAT,
    INTERNAL_HOP,
    JOB,
    READY,
    RESULT,
    RESULTS,
    STOP,
    Message,
    decode,
    encode,
    pack_arrays,
    unpack_results,
)
from supervisor.testing import short_tmpdir

ROOT = Path(__file__).resolve().parent.parent
FIELDS = [f.name for f in dataclasses.fields(WorkerSpec)]
TF_DEFAULTS = {name: getattr(TfConfig(), name) for name in TF_FIELDS}
# Deadlines for conditions, generous for a busy CI machine; the waits end as soon as the
# condition holds.
EXIT_TIMEOUT = 60.0
MESSAGE_TIMEOUT = 60.0


SECRET = "0123456789abcdef" * 2


def valid_raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "worker_id": "echo-1", "model": "echo", "source": "handler",
        "location": "worker.handlers:echo", "signature": "serving_default", "options": {},
        "tf": dict(TF_DEFAULTS), "backend": "ipc:///tmp/nowhere/backend.sock",
        "heartbeat_interval": 0.2, "probes": True, "log_level": "info", "log_format": "json",
        "parent_pid": os.getpid(), "secret": SECRET, "padding": {}, "warmup_batch_sizes": [1]}
    raw.update(changes)
    return raw


# --- the contract ------------------------------------------------------------------------------

PADDED_SEQ = {"inputs": {"input_ids": 1}, "sizes": [32, 64], "value": 0.0, "outputs": {},
              "mask_input": "attention_mask", "length_input": None, "changes_outputs": False,
              "verify": True}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)
names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=40)
specs = st.builds(
    WorkerSpec,
    worker_id=names, model=names, source=st.sampled_from(SOURCES), location=names,
    signature=names, options=st.dictionaries(st.text(), json_values, max_size=5),
    tf=st.fixed_dictionaries({
        "intra_op_threads": st.integers(0, 256), "inter_op_threads": st.integers(0, 256),
        "gpu_memory_growth": st.booleans(),
        "gpu_memory_limit": st.none() | st.integers(0, 2**45)}),
    backend=names, heartbeat_interval=st.floats(1e-3, 3600.0), probes=st.booleans(),
    log_level=st.sampled_from(LOG_LEVELS), log_format=st.sampled_from(LOG_FORMATS),
    parent_pid=st.integers(1, MAX_PID),
    secret=st.text("0123456789abcdef", min_size=32, max_size=128),
    padding=st.just({}) | st.just({"seq": PADDED_SEQ}),
    warmup_batch_sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=4))


@given(specs)
def test_spec_round_trips_through_the_environment(spec: WorkerSpec) -> None:
    text = spec.to_env()
    assert WorkerSpec.from_env(text) == spec
    assert json.loads(text).keys() == set(FIELDS)


def _not_str(v: object) -> bool:
    return not isinstance(v, str)


def _not_number(v: object) -> bool:
    return isinstance(v, bool) or not isinstance(v, int | float)


WRONG: dict[str, st.SearchStrategy[Any]] = {
    **{name: json_values.filter(_not_str) | st.just("") | st.just("a\0b")
       for name in ("worker_id", "model", "location", "signature", "backend")},
    "source": json_values.filter(lambda v: v not in SOURCES),
    "log_level": json_values.filter(lambda v: v not in LOG_LEVELS) | st.just("INFO"),
    "log_format": json_values.filter(lambda v: v not in LOG_FORMATS),
    "options": json_values.filter(lambda v: not isinstance(v, dict)),
    "tf": json_values.filter(lambda v: not isinstance(v, dict))
    | st.sampled_from(list(TF_FIELDS)).map(
        lambda k: {n: v for n, v in TF_DEFAULTS.items() if n != k})
    | st.text().filter(lambda k: k not in TF_FIELDS).map(lambda k: {**TF_DEFAULTS, k: 1})
    | st.sampled_from([{**TF_DEFAULTS, "intra_op_threads": True},
                       {**TF_DEFAULTS, "inter_op_threads": -1},
                       {**TF_DEFAULTS, "intra_op_threads": 2.0},
                       {**TF_DEFAULTS, "gpu_memory_growth": 1},
                       {**TF_DEFAULTS, "gpu_memory_limit": "2GiB"},
                       {**TF_DEFAULTS, "gpu_memory_limit": 1.5}]),
    "heartbeat_interval": json_values.filter(_not_number) | st.booleans()
    | st.floats(max_value=0.0, allow_nan=False) | st.integers(max_value=0)
    | st.just(10**400) | st.just(1e300),
    "probes": json_values.filter(lambda v: not isinstance(v, bool)),
    "parent_pid": json_values.filter(lambda v: isinstance(v, bool) or not isinstance(v, int))
    | st.booleans() | st.integers(max_value=0) | st.integers(min_value=MAX_PID + 1)
    | st.floats(allow_nan=False) | st.just(float(os.getpid())),
    "padding": json_values.filter(lambda v: not isinstance(v, dict))
    | st.sampled_from([{"seq": {**PADDED_SEQ, "inputs": {"input_ids": 0}}},
                       {"seq": {**PADDED_SEQ, "sizes": []}},
                       {"seq": {**PADDED_SEQ, "value": "0"}},
                       {"seq": {**PADDED_SEQ, "inputs": {}}},
                       {"seq": {**PADDED_SEQ, "mask_input": "input_ids"}},
                       {"seq": {**PADDED_SEQ, "unknown": 1}},
                       {"not a name!": PADDED_SEQ}, {"seq": []}]),
    "warmup_batch_sizes": json_values.filter(lambda v: not isinstance(v, list))
    | st.sampled_from([[], [0], [True], [1.5], [10**30], ["1"], [4097]]),
    "secret": json_values.filter(lambda v: not isinstance(v, str)) | st.just("")
    | st.just("0123") | st.just("G" * 32) | st.just("A" * 32) | st.just("0" * 129),
}


def test_every_field_has_a_wrong_value_strategy() -> None:
    assert sorted(WRONG) == sorted(FIELDS)


@given(st.data())
def test_a_wrong_value_in_any_field_is_refused(data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(FIELDS), label="field")
    value = data.draw(WRONG[field], label="value")
    with pytest.raises(SpawnError) as info:
        WorkerSpec.from_env(json.dumps(valid_raw(**{field: value})))
    assert ENV_VAR in str(info.value)


@given(st.sampled_from(FIELDS), json_values)
def test_any_json_value_in_any_field_is_refused_or_kept_as_is(field: str, value: Any) -> None:
    """No value crashes the parser, and none is silently coerced into another."""
    try:
        spec = WorkerSpec.from_env(json.dumps(valid_raw(**{field: value})))
    except SpawnError:
        return
    kept = getattr(spec, field)
    assert kept == value
    if field == "heartbeat_interval":
        assert isinstance(kept, float)
    else:
        assert type(kept) is type(value)


@given(st.text())
def test_arbitrary_text_is_refused_with_spawn_error_only(text: str) -> None:
    with pytest.raises(SpawnError):
        WorkerSpec.from_env(text)


@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_a_spec_must_be_a_json_object(value: Any) -> None:
    with pytest.raises(SpawnError, match="must be a JSON object"):
        WorkerSpec.from_env(json.dumps(value))


@pytest.mark.parametrize("field", FIELDS)
def test_a_missing_key_is_refused_by_name(field: str) -> None:
    raw = valid_raw()
    del raw[field]
    with pytest.raises(SpawnError, match=f"missing keys: {field}"):
        WorkerSpec.from_env(json.dumps(raw))


@given(st.text().filter(lambda k: k not in FIELDS), json_values)
def test_an_extra_key_is_refused(key: str, value: Any) -> None:
    with pytest.raises(SpawnError, match="unexpected keys"):
        WorkerSpec.from_env(json.dumps({**valid_raw(), key: value}))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_heartbeat_is_refused(literal: str) -> None:
    text = json.dumps(valid_raw(heartbeat_interval=0.5)).replace("0.5", literal)
    with pytest.raises(SpawnError, match=literal):
        WorkerSpec.from_env(text)
    with pytest.raises(SpawnError, match="heartbeat_interval"):
        WorkerSpec(**valid_raw(heartbeat_interval=float(literal.lower().replace("infinity",
                                                                              "inf"))))


def test_bool_parent_pid_and_duplicate_keys_are_refused() -> None:
    with pytest.raises(SpawnError, match="parent_pid"):
        WorkerSpec.from_env(json.dumps(valid_raw(parent_pid=True)))
    text = json.dumps(valid_raw()).replace('"model":', '"model":"other","model":')
    with pytest.raises(SpawnError, match="appears twice"):
        WorkerSpec.from_env(text)


def test_options_that_json_cannot_carry_are_refused_when_built() -> None:
    for options in ({"when": object()}, {"x": [math.nan]}, {"nested": {1: "int key"}}):
        with pytest.raises(SpawnError, match="options"):
            WorkerSpec(**valid_raw(options=options))


CONFIG = """
supervisor:
  runtime_dir: run
  heartbeat_interval: 0.5s
  heartbeat_timeout: 5s
  log_level: debug
models:
  echo:
    handler: worker.handlers:echo
    options: {recycle_after: 7, inputs: {x: {dtype: float32, shape: [null, 4]}}}
    env: {FROM_MODEL: "yes", PYTHONPATH: /from/model}
    tf: {intra_op_threads: 2, gpu_memory_limit: 1GiB}
"""


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir()  # ipc paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def backend(workdir: Path) -> Iterator[Backend]:
    """A fake supervisor backend at ipc://WORKDIR/run/private/backend.sock, closed whatever happens
    (a zmq context left to the garbage collector with a socket open blocks forever)."""
    (workdir / "run").mkdir()
    fake = Backend(workdir / "run" / "private")
    yield fake
    fake.close()


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Worker processes a test started; any still running at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.returncode is None:  # not yet waited for by the test
            process.kill()
            process.communicate()


def test_build_spec_takes_every_field_from_the_config(workdir: Path) -> None:
    (workdir / "config.yaml").write_text(CONFIG)
    config = load_config(workdir / "config.yaml")
    spec = build_spec(config, "echo", "echo-3", 4321, "console", SECRET)
    assert spec == WorkerSpec(
        worker_id="echo-3", model="echo", source="handler", location="worker.handlers:echo",
        signature="serving_default",
        options={"recycle_after": 7, "inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}},
        tf={"intra_op_threads": 2, "inter_op_threads": 0, "gpu_memory_growth": True,
            "gpu_memory_limit": 2**30},
        backend=f"ipc://{workdir.resolve()}/run/private/backend.sock", heartbeat_interval=0.5,
        probes=True, log_level="debug", log_format="console", parent_pid=4321, secret=SECRET,
        padding={}, warmup_batch_sizes=[1])
    assert worker_command(spec) == [sys.executable, "-m", "worker", "--id", "echo-3",
                                    "--model", "echo"]
    env = worker_env(config, spec, {"HOME": "/home/x", ENV_VAR: "stale", "FROM_MODEL": "no"})
    assert WorkerSpec.from_env(env[ENV_VAR]) == spec
    assert env["HOME"] == "/home/x" and env["FROM_MODEL"] == "yes"
    assert env["PYTHONPATH"] == os.pathsep.join([str(workdir.resolve()), "/from/model"])
    with pytest.raises(SpawnError, match="no model"):
        build_spec(config, "absent", "absent-1", 4321, "json", SECRET)


def test_a_worker_never_gets_what_systemd_gave_the_supervisor(workdir: Path) -> None:
    """Only the supervisor talks to systemd: a worker that inherited WATCHDOG_USEC could ping
    for a wedged supervisor, one with NOTIFY_SOCKET could speak for the unit."""
    (workdir / "config.yaml").write_text(CONFIG.replace(
        'FROM_MODEL: "yes"', 'FROM_MODEL: "yes", NOTIFY_SOCKET: /run/from-model'))
    config = load_config(workdir / "config.yaml")
    spec = build_spec(config, "echo", "echo-1", 4321, "json", SECRET)
    systemd = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000",
               "WATCHDOG_PID": "4321", "LISTEN_FDS": "2", "LISTEN_PID": "4321",
               "LISTEN_FDNAMES": "a:b"}
    assert set(systemd) == set(SYSTEMD_ONLY)
    env = worker_env(config, spec, {**systemd, "INVOCATION_ID": "abc", "HOME": "/home/x"})
    assert not set(SYSTEMD_ONLY) & set(env), env
    assert env["INVOCATION_ID"] == "abc" and env["HOME"] == "/home/x"  # the rest is kept
    assert env["FROM_MODEL"] == "yes" and WorkerSpec.from_env(env[ENV_VAR]) == spec


# --- real workers ------------------------------------------------------------------------------

def start_worker(processes: list[subprocess.Popen[str]], spec_text: str | None,
                 worker_id: str = "echo-1", model: str = "echo") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if spec_text is not None:
        env[ENV_VAR] = spec_text
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "--id", worker_id, "--model", model], cwd=ROOT,
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    processes.append(process)
    return process


def exit_of(process: subprocess.Popen[str]) -> tuple[int, str]:
    """Wait for the process to exit (killing it after the deadline): code and stderr."""
    try:
        _, err = process.communicate(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"worker still running after {EXIT_TIMEOUT}s:\n{err}") from None
    return process.returncode, err


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped: a supervisor that is gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert gone.pid != os.getpid()
    return gone.pid


def test_worker_whose_parent_is_not_the_spec_parent_exits_orphaned(
        backend: Backend, processes: list[subprocess.Popen[str]]) -> None:
    spec = WorkerSpec(**valid_raw(parent_pid=dead_pid(), backend=backend.endpoint))
    code, err = exit_of(start_worker(processes, spec.to_env()))
    assert code == WorkerExit.ORPHANED, err
    assert "worker_orphaned" in err
    assert backend.messages() == [], "an orphan must not load, report ready or heartbeat"


# The scenario the spec's parent_pid exists for: a "supervisor" writes a spec naming itself,
# starts the worker and is SIGKILLed at once, before the worker has armed PR_SET_PDEATHSIG.
# A subreaper (this helper) inherits the worker, so it can wait for the worker's exit status.
ORPHAN_SCENARIO = r"""
import ctypes, dataclasses, json, os, signal, subprocess, sys, time
from supervisor.config.worker_spec import ENV_VAR, WorkerSpec, worker_command
if ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1) != 0:  # PR_SET_CHILD_SUBREAPER
    print(json.dumps({"error": "cannot become a child subreaper"}))
    sys.exit(0)
doomed = '''
import dataclasses, os, signal, subprocess, sys
from supervisor.config.worker_spec import ENV_VAR, WorkerSpec, worker_command
spec = dataclasses.replace(WorkerSpec.from_env(sys.argv[1]), parent_pid=os.getpid())
worker = subprocess.Popen(worker_command(spec), env={**os.environ, ENV_VAR: spec.to_env()},
                          stdin=subprocess.DEVNULL)
print(worker.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''
supervisor = subprocess.Popen([sys.executable, "-c", doomed, sys.argv[1]],
                              stdout=subprocess.PIPE, text=True)
worker_pid = int(supervisor.stdout.readline())
supervisor.wait()
deadline = time.monotonic() + float(sys.argv[2])
while True:
    pid, status = os.waitpid(worker_pid, os.WNOHANG)
    if pid:
        print(json.dumps({"supervisor": supervisor.returncode,
                          "worker": os.waitstatus_to_exitcode(status)}))
        break
    if time.monotonic() > deadline:
        os.kill(worker_pid, signal.SIGKILL)
        os.waitpid(worker_pid, 0)
        print(json.dumps({"supervisor": supervisor.returncode, "worker": "still running"}))
        break
    time.sleep(0.02)
"""


def test_worker_of_a_supervisor_killed_at_spawn_does_not_live_on(backend: Backend) -> None:
    spec = WorkerSpec(**valid_raw(backend=backend.endpoint))
    done = subprocess.run([sys.executable, "-c", ORPHAN_SCENARIO, spec.to_env(),
                           str(EXIT_TIMEOUT)], cwd=ROOT, capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT + 60, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Linux lets any process become a subreaper: if it cannot, the test cannot tell, and says
    # so by failing rather than passing unexamined.
    assert "error" not in result, result
    assert result["supervisor"] == -9
    # Orphaned by the spec check, or killed by PDEATHSIG if it was armed in time.
    assert result["worker"] in (WorkerExit.ORPHANED, -9), (result, done.stderr)


@pytest.mark.parametrize("spec_text, expected", [
    (None, "is not set"),
    ("{not json", "not valid JSON"),
    (json.dumps(valid_raw(heartbeat_interval="1s")), "heartbeat_interval"),
    (json.dumps({k: v for k, v in valid_raw().items() if k != "parent_pid"}),
     "missing keys: parent_pid"),
    (json.dumps(valid_raw(model="other")), "do not match"),
])
def test_worker_with_a_malformed_spec_exits_boot_error(
        spec_text: str | None, expected: str, processes: list[subprocess.Popen[str]]) -> None:
    code, err = exit_of(start_worker(processes, spec_text))
    assert code == WorkerExit.BOOT_ERROR, err
    assert expected in err


class Backend:
    """A fake supervisor backend: a ROUTER on an ipc socket."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.endpoint = f"ipc://{workdir}/backend.sock"
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)

    def receive(self, kind: bytes, process: subprocess.Popen[str]) -> tuple[bytes, Message]:
        """The next message of this kind (heartbeats skipped unless asked for)."""
        deadline = time.monotonic() + MESSAGE_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(min(left, 0.5) * 1000)):
                if process.poll() is not None:
                    raise AssertionError(f"worker exited {process.returncode} while we waited "
                                         f"for {kind!r}: {process.communicate()[1]}")
                continue
            identity, *frames = self.sock.recv_multipart()
            msg = decode(frames, INTERNAL_HOP)
            if msg.kind == kind:
                return identity, msg
        raise AssertionError(f"no {kind!r} within {MESSAGE_TIMEOUT}s")

    def messages(self) -> list[Message]:
        """Whatever has arrived so far."""
        out = []
        while self.sock.poll(0):
            _, *frames = self.sock.recv_multipart()
            out.append(decode(frames, INTERNAL_HOP))
        return out

    def send(self, identity: bytes, msg: Message) -> None:
        self.sock.send_multipart([identity, *encode(msg)])

    def close(self) -> None:
        self.sock.close(linger=0)
        self.context.term()


def job(number: int) -> Message:
    specs, frames = pack_arrays({"x": np.full((1, 4), number, dtype=np.float32)})
    return Message(JOB, b"", {"jobs": [{"id": str(number), "inputs": specs}], "pad_to": 0},
                   frames)


def boot_worker(workdir: Path, backend: Backend, processes: list[subprocess.Popen[str]],
                options: dict[str, Any]) -> tuple[subprocess.Popen[str], bytes]:
    """A worker spawned the way the supervisor spawns one, up to its READY."""
    (workdir / "config.yaml").write_text(
        "supervisor: {runtime_dir: run, heartbeat_interval: 0.2s}\n"
        f"models: {{echo: {{handler: 'worker.handlers:echo', options: {json.dumps(options)}}}}}\n")
    config = load_config(workdir / "config.yaml")
    assert config.backend == backend.endpoint
    spec = build_spec(config, "echo", "echo-1", os.getpid(), "json", SECRET)
    process = subprocess.Popen(worker_command(spec), cwd=ROOT,
                               env=worker_env(config, spec, os.environ),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    processes.append(process)
    identity, ready = backend.receive(READY, process)
    assert identity == b"echo-1" and ready.header["pid"] == process.pid
    assert ready.header["secret"] == SECRET  # proof of spawn, on every message
    return process, identity


def test_worker_spawned_from_a_spec_serves_and_stops(
        workdir: Path, backend: Backend, processes: list[subprocess.Popen[str]]) -> None:
    process, identity = boot_worker(workdir, backend, processes, {})
    backend.receive(HEARTBEAT, process)  # the heartbeat thread found its parent alive
    backend.send(identity, job(1))
    _, results = backend.receive(RESULTS, process)
    replies, leaving = unpack_results(results)
    assert [(r.kind, r.job_id) for r in replies] == [(RESULT, b"1")]
    assert leaving is False
    backend.send(identity, Message(STOP))
    code, err = exit_of(process)
    assert code == WorkerExit.OK, err


def test_worker_that_asked_to_recycle_says_it_is_leaving_on_its_last_results(
        workdir: Path, backend: Backend, processes: list[subprocess.Popen[str]]) -> None:
    # The handler asks to be replaced on its third call (the warm-up inference is one).
    process, identity = boot_worker(workdir, backend, processes, {"recycle_after": 3})
    flags = []
    for number in range(1, 4):
        backend.send(identity, job(number))
        _, results = backend.receive(RESULTS, process)
        replies, leaving = unpack_results(results)
        assert [r.kind for r in replies] == [RESULT]
        flags.append(leaving)
        if leaving:
            break
    assert flags[-1] is True and not any(flags[:-1]), flags
    code, err = exit_of(process)  # no STOP needed: it leaves on its own
    assert code == WorkerExit.RECYCLE, err
