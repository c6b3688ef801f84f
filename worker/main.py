"""Worker process entry point: set up TF, load, warm up, report ready, serve jobs.

Started by the supervisor as ``python -m worker --id ID --model NAME`` with a
:class:`~supervisor.config.worker_spec.WorkerSpec` as JSON in the TFSUPERVISOR_WORKER environment
variable: every setting comes from the spec, none has a default here.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time
from typing import Any

import zmq
from zmq.backend import zmq_poll

from supervisor.config.worker_spec import ENV_VAR, TREE_VAR, SpawnError, WorkerSpec, tree_mark
from supervisor.shared import linux, logs
from supervisor.shared.exitcodes import WorkerExit
from supervisor.shared.probes import KERAS_PREDICT_REMEDY
from supervisor.shared.protocol import (
    ERROR,
    INTERNAL_HOP,
    JOB,
    READY,
    STOP,
    Message,
    TensorSpec,
    decode,
    encode,
    pack_results,
    signed,
)
from supervisor.shared.transport import recv, send
from worker import recycle_requested, runtime
from worker.batch import run_batch
from worker.heartbeat import Heartbeat
from worker.probes import ProbeRecorder
from worker.readings import keras_loop_traced
from worker.runners import LoadError, Runner, load
from worker.warmup import adopt_direct, check_padding, output_specs, verify, warm

log = logs.get(__name__)


class StopFlag:
    """Set by SIGTERM/SIGINT; the loop finishes the job in hand, then exits."""

    def __init__(self) -> None:
        self.set = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.set = True


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when the supervisor dies (Linux only; the heartbeat
    thread's parent watch covers the rest)."""
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    # Under JSON logs stdout is the supervisor's pipe (supervisor/daemon/worker_output.py),
    # which Python would buffer in 8 KiB blocks: a handler's prints would come late, out of
    # order with stderr, and be lost with the process when it crashes.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("--id", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    spec = read_spec(args.id, args.model)
    if spec is None:
        return WorkerExit.BOOT_ERROR
    # The spec holds the spawn secret: out of the environment the handler and its child
    # processes see, so they cannot sign messages (or log lines) as this worker.
    os.environ.pop(ENV_VAR, None)
    # What they see instead: whose tree they belong to, so that one that escapes the worker's
    # process group (setsid, a double fork) is still known as ours (supervisor/daemon/tree.py).
    os.environ[TREE_VAR] = tree_mark(spec.parent_pid, spec.worker_id)
    logs.configure(spec.log_level, spec.log_format, worker=spec.worker_id, model=spec.model)
    die_with_parent()
    # The supervisor's pid comes in the spec, not from getppid() here: a supervisor killed
    # before PDEATHSIG was armed left us to init (or a subreaper), which we must not serve.
    if os.getppid() != spec.parent_pid:
        log.error("worker_orphaned", parent_pid=spec.parent_pid, now_parent=os.getppid())
        return WorkerExit.ORPHANED
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started = time.monotonic()
    try:
        runner = boot(spec)
    except Exception as exc:  # any failure to load is the model's, reported, not a crash
        message = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"
        log.error("model_load_failed", error=message)
        report_load_error(spec, message)
        return WorkerExit.LOAD_ERROR
    warm = time.monotonic() - started
    return serve(spec, runner, warm, stop)


def read_spec(worker_id: str, model: str) -> WorkerSpec | None:
    """The spec from the environment, or None after one line on stderr saying why."""
    text = os.environ.get(ENV_VAR)
    if text is None:
        print(f"worker {worker_id}: {ENV_VAR} is not set; workers are started by the "
              "supervisor", file=sys.stderr)
        return None
    try:
        spec = WorkerSpec.from_env(text)
    except SpawnError as exc:
        print(f"worker {worker_id}: bad spec: {exc}", file=sys.stderr)
        return None
    if (spec.worker_id, spec.model) != (worker_id, model):
        print(f"worker {worker_id}: --id {worker_id} --model {model} do not match the spec's "
              f"worker_id {spec.worker_id!r} and model {spec.model!r}", file=sys.stderr)
        return None
    return spec


def boot(spec: WorkerSpec) -> Runner:
    """Configure TF, load the model, prove padding harmless, warm up every shape;
    LoadError if any step fails."""
    runtime.export_environment(spec.tf)
    if spec.source != "handler" or spec.tf["gpu_memory_limit"]:
        runtime.configure_tensorflow(spec.tf)
    runner = load(spec.source, spec.location, spec.signature, spec.options)
    runner.padding = spec.pad_dims()
    check_padding(runner)
    if runner.inputs is not None:
        # Proven before the warm-up: a padding the model cannot take fails in two calls,
        # not after up to hundreds of warm-up shapes, each time the start is retried.
        verify(runner)
        outputs = warm(runner, spec.warmup_batch_sizes)
        adopt_direct(runner, spec.warmup_batch_sizes)
        if runner.outputs is None:
            runner.outputs = output_specs(outputs, runner.padding)
        warn_keras_loop()
    return runner


def warn_keras_loop() -> None:
    """Keras's predict loop traced by the warm-up call: the handler calls model.predict()
    per request, ~4x slower than calling the model and a known source of growth."""
    step = keras_loop_traced()
    if step is not None:
        log.warning("keras_predict_per_request", traced=step,
                    detail="the handler runs Keras's model.predict() loop on every request: "
                    "it builds per-call machinery and grows the worker",
                    remedy=KERAS_PREDICT_REMEDY)


def report_load_error(spec: WorkerSpec, message: str) -> None:
    """Tell the supervisor why, so clients get the reason with 'unavailable'."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, spec.worker_id.encode())
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(spec.backend)
    header = {"worker": spec.worker_id, "code": "load_error", "message": message}
    sock.send_multipart(encode(signed(Message(ERROR, b"", header), spec.secret)))
    sock.close()
    context.term()


def serve(spec: WorkerSpec, runner: Runner, warm: float, stop: StopFlag) -> int:
    worker_id = spec.worker_id
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, worker_id.encode())
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(spec.backend)
    # Probes sample between batches, at most once per heartbeat (they are sent in it).
    probes = ProbeRecorder(spec.heartbeat_interval, time.monotonic()) if spec.probes else None
    if probes is not None:
        runner = probes.wrap(runner)
    heartbeat = Heartbeat(context, spec.backend, worker_id, spec.heartbeat_interval,
                          spec.parent_pid, spec.secret, probes)
    ready = {"worker": worker_id, "pid": os.getpid(), "warmup_seconds": round(warm, 3),
             "inputs": _wire(runner.client_inputs), "outputs": _wire(runner.outputs)}
    if runner.version is not None:
        ready["version"] = runner.version
    sock.send_multipart(encode(signed(Message(READY, b"", ready), spec.secret)))
    heartbeat.start()
    code = WorkerExit.OK
    # zmq_poll on a list built once: Socket.poll builds a whole Poller on every call.
    watch = [(sock, int(zmq.POLLIN))]
    try:
        while not stop.set:
            if not zmq_poll(watch, 200):
                if probes is not None:
                    probes.between(time.monotonic(), heartbeat.jobs)
                continue
            msg = decode(recv(sock), INTERNAL_HOP)
            if msg.kind == STOP:
                break
            if msg.kind == JOB:
                replies = run_batch(runner, msg)
                # Read once: the flag the supervisor sees is the exit we take. Leaving tells
                # it to send nothing more; the RESULTS go out before we do (LINGER).
                leaving = recycle_requested()
                send(sock, encode(signed(pack_results(replies, leaving=leaving), spec.secret)))
                heartbeat.jobs += len(replies)
                if leaving:
                    log.info("recycle_requested_by_handler")
                    code = WorkerExit.RECYCLE
                    break
                if probes is not None:  # after the reply: sampling never delays one
                    probes.between(time.monotonic(), heartbeat.jobs)
    except Exception as exc:
        log.exception("worker_loop_failed", error=str(exc))
        code = WorkerExit.INTERNAL
    heartbeat.stop()
    if probes is not None:
        probes.close()
    sock.close()
    context.term()
    return code


def _wire(specs: list[TensorSpec] | None) -> list[dict[str, Any]] | None:
    return None if specs is None else [s.to_wire() for s in specs]
