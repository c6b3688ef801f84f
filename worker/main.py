"""Worker process entry point: set up TF, load, warm up, report ready, serve jobs.

Started by the supervisor as ``python -m worker --id ID --model NAME``; the model's settings
come as JSON in the TFSUPERVISOR_WORKER environment variable (set by the pool).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from typing import Any

import zmq

from supervisor import logs
from supervisor.exitcodes import WorkerExit
from supervisor.protocol import (
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
    wire_dtype,
)
from supervisor.transport import recv, send
from worker import recycle_requested, runtime
from worker.batch import run_batch
from worker.heartbeat import Heartbeat
from worker.runners import LoadError, Runner, load, warmup_inputs

ENV_SPEC = "TFSUPERVISOR_WORKER"

PR_SET_PDEATHSIG = 1

log = logs.get("worker")


class StopFlag:
    """Set by SIGTERM/SIGINT; the loop finishes the job in hand, then exits."""

    def __init__(self) -> None:
        self.set = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.set = True


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when the supervisor dies (Linux only; the heartbeat
    thread's parent watch covers the rest)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("--id", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    parent = os.getppid()
    die_with_parent()
    try:
        spec = json.loads(os.environ[ENV_SPEC])
    except (KeyError, ValueError) as exc:
        print(f"worker: bad or missing {ENV_SPEC}: {exc}", file=sys.stderr)
        return WorkerExit.BOOT_ERROR
    logs.configure(spec.get("log_level", "info"), spec.get("log_format", "auto"),
                   worker=args.id, model=args.model)
    if os.getppid() != parent:  # the supervisor died before PDEATHSIG was armed
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
        report_load_error(spec["backend"], args.id, message)
        return WorkerExit.LOAD_ERROR
    warm = time.monotonic() - started
    return serve(spec, args.id, runner, warm, stop, parent)


def boot(spec: dict[str, Any]) -> Runner:
    """Configure TF, load the model, run one real inference; LoadError if any step fails."""
    tf_settings = spec.get("tf", {})
    runtime.export_environment(tf_settings)
    source = spec["source"]
    if source != "handler" or tf_settings.get("gpu_memory_limit"):
        runtime.configure_tensorflow(tf_settings)
    runner = load(source, spec["location"], spec.get("signature", "serving_default"),
                  spec.get("options", {}))
    if runner.inputs is not None:
        try:
            outputs = runner(warmup_inputs(runner.inputs))
        except Exception as exc:
            raise LoadError(f"warm-up inference failed: {type(exc).__name__}: {exc}") from exc
        if runner.outputs is None:
            runner.outputs = [TensorSpec(n, wire_dtype(a), (None, *a.shape[1:]))
                              for n, a in outputs.items()]
    return runner


def report_load_error(backend: str, worker_id: str, message: str) -> None:
    """Tell the supervisor why, so clients get the reason with 'unavailable'."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, worker_id.encode())
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(backend)
    header = {"worker": worker_id, "code": "load_error", "message": message}
    sock.send_multipart(encode(Message(ERROR, b"", header)))
    sock.close()
    context.term()


def serve(spec: dict[str, Any], worker_id: str, runner: Runner, warm: float,
          stop: StopFlag, parent: int) -> int:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, worker_id.encode())
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(spec["backend"])
    heartbeat = Heartbeat(context, spec["backend"], worker_id, spec.get("heartbeat", 1.0),
                          parent)
    ready = {"worker": worker_id, "pid": os.getpid(), "warmup_seconds": round(warm, 3),
             "inputs": _wire(runner.inputs), "outputs": _wire(runner.outputs)}
    sock.send_multipart(encode(Message(READY, b"", ready)))
    heartbeat.start()
    code = WorkerExit.OK
    try:
        while not stop.set:
            if not sock.poll(200):
                continue
            msg = decode(recv(sock), INTERNAL_HOP)
            if msg.kind == STOP:
                break
            if msg.kind == JOB:
                replies = run_batch(runner, msg)
                send(sock, encode(pack_results(replies)))
                heartbeat.jobs += len(replies)
                if recycle_requested():
                    log.info("recycle_requested_by_handler")
                    code = WorkerExit.RECYCLE
                    break
    except Exception as exc:
        log.exception("worker_loop_failed", error=str(exc))
        code = WorkerExit.INTERNAL
    heartbeat.stop()
    sock.close()
    context.term()
    return code


def _wire(specs: list[TensorSpec] | None) -> list[dict[str, Any]] | None:
    return None if specs is None else [s.to_wire() for s in specs]
