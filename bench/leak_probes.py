"""Evidence: what the leak probes (worker/probes.py) show for each way a worker grows.

Each case is one real worker process, spawned from a config as the supervisor spawns one,
against a fake backend (a ROUTER bound where the supervisor's would be), fed jobs one at a
time; every heartbeat is kept with the worker's RSS read when it arrives. After a warm-up
(the first fifth of the jobs) the slope per 1k jobs of RSS and of every probe counter is a
least-squares fit over the heartbeats; the last heartbeat gives the traced names, the
signatures that grew memory most and the census. Handlers: bench/leak_handlers.py.

    python -m bench.leak_probes [--scale 1.0] [--case NAME ...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml
import zmq

from bench.common import write
from supervisor.config.loading import load_config
from supervisor.config.worker_spec import build_spec, worker_command, worker_env
from supervisor.shared.probes import Probes
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
DEMO = ROOT / "models" / "demo"
THREADS = {"intra_op_threads": 1, "inter_op_threads": 1}  # kind to a 2-core machine
WARMUP = 0.2  # fraction of the jobs left out of the slopes
Arrays = dict[str, np.ndarray]


# --- one real worker, driven directly ----------------------------------------------------------

@dataclass
class Beat:
    jobs: int
    rss: int
    probes: Probes | None
    at: float


class DirectWorker:
    """A worker process spawned from ``model`` (a model's config) as the supervisor spawns
    one, serving a fake backend: jobs go in one at a time, heartbeats are collected."""

    def __init__(self, model: dict[str, Any], heartbeat: float = 0.25,
                 timeout: float = 120.0) -> None:
        self.timeout = timeout
        self.workdir = short_tmpdir()
        (self.workdir / "config.yaml").write_text(yaml.safe_dump({
            "supervisor": {"runtime_dir": "run", "heartbeat_interval": f"{heartbeat}s",
                           "heartbeat_timeout": f"{max(5 * heartbeat, 5)}s"},
            "models": {"m": model}}))
        config = load_config(self.workdir / "config.yaml")
        (self.workdir / "run" / "private").mkdir(parents=True)
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(config.backend)
        spec = build_spec(config, "m", "m-1", os.getpid(), "json", secrets.token_hex(16))
        self.log = open(self.workdir / "worker.log", "wb")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(worker_command(spec), cwd=ROOT,
                                        env=worker_env(config, spec, os.environ),
                                        stdin=subprocess.DEVNULL, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.process.pid)
        self.beats: list[Beat] = []
        self.identity = b""
        self.jobs = 0
        self.identity, _ = self.receive(READY)

    def receive(self, kind: bytes) -> tuple[bytes, Message]:
        """The next message of this kind; heartbeats on the way are kept."""
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(min(left, 0.5) * 1000)):
                if self.process.poll() is not None:
                    raise RuntimeError(f"worker exited {self.process.returncode}:\n"
                                       f"{self.output()[-3000:]}")
                continue
            identity, *frames = self.sock.recv_multipart()
            msg = decode(frames, INTERNAL_HOP)
            if msg.kind == HEARTBEAT:
                self.beats.append(Beat(int(msg.header.get("jobs", 0)),
                                       self.ps.memory_info().rss,
                                       Probes.from_wire(msg.header.get("probes")),
                                       time.monotonic()))
            if msg.kind == kind:
                return identity, msg
        raise RuntimeError(f"no {kind!r} within {self.timeout}s:\n{self.output()[-3000:]}")

    def infer(self, inputs: Arrays) -> None:
        """One job; raises if it is not answered with a result."""
        self.jobs += 1
        specs, frames = pack_arrays(inputs)
        self.sock.send_multipart([self.identity, *encode(Message(
            JOB, b"", {"jobs": [{"id": str(self.jobs), "inputs": specs}], "pad_to": 0},
            frames))])
        _, results = self.receive(RESULTS)
        replies, _ = unpack_results(results)
        if [r.kind for r in replies] != [RESULT]:
            raise RuntimeError(f"job {self.jobs} failed: {[r.header for r in replies]}")

    def wait_beat(self, done: Callable[[Beat], bool]) -> Beat:
        """The first heartbeat (kept or to come) for which ``done`` holds."""
        deadline = time.monotonic() + self.timeout
        seen = 0
        while time.monotonic() < deadline:
            for beat in self.beats[seen:]:
                if done(beat):
                    return beat
            seen = len(self.beats)
            self.receive(HEARTBEAT)
        raise RuntimeError(f"no such heartbeat within {self.timeout}s")

    def settled(self) -> Beat:
        """A heartbeat whose probes were sampled after every job sent so far was answered:
        the worker samples while idle, at most once per heartbeat interval (or less often
        when a sample is dear), so one from a second on is late enough."""
        since = time.monotonic()
        return self.wait_beat(lambda beat: beat.at > since + 1.0)

    def output(self) -> str:
        self.log.flush()
        return (self.workdir / "worker.log").read_text(errors="replace")

    def close(self) -> int | None:
        """STOP, then wait for the exit (killed after the deadline); the exit code."""
        try:
            if self.process.poll() is None:
                self.sock.send_multipart([self.identity, *encode(Message(STOP))])
                self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            self.sock.close(linger=0)
            self.context.term()
            self.log.close()
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.process.returncode


# --- the cases -----------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    cause: str
    model: Callable[[Path], dict[str, Any]]  # the model's config, given a scratch directory
    inputs: Callable[[int, np.random.Generator], Arrays]  # job number -> its inputs
    jobs: int
    notes: list[str] = field(default_factory=list)


def _handler(target: str, **options: Any) -> Callable[[Path], dict[str, Any]]:
    return lambda _: {"handler": target, "options": options, "tf": THREADS}


def _embedding(scratch: Path) -> dict[str, Any]:
    path = scratch / "embedding"
    subprocess.run([sys.executable, "-c", "import sys; from bench.leak_handlers import "
                    "save_embedding_model as s; s(sys.argv[1])", str(path)], cwd=ROOT,
                   check=True, capture_output=True)
    return {"saved_model": str(path), "tf": THREADS}


def _demo(_: Path) -> dict[str, Any]:
    if not (DEMO / "saved_model.pb").exists():
        subprocess.run([sys.executable, "-m", "supervisor", "demo-model", str(DEMO)], check=True)
    return {"saved_model": str(DEMO), "tf": THREADS}


def _floats(rows: int, width: int, rng: np.random.Generator, name: str = "x") -> Arrays:
    return {name: rng.standard_normal((rows, width)).astype(np.float32)}


CASES = [
    Case("a_retrace_shapes", "tf.function without input_signature, batch size 1-2048",
         _handler("bench.leak_handlers:retrace_shapes"),
         lambda i, rng: _floats(int(rng.integers(1, 2049)), 16, rng), 3000),
    Case("b_retrace_scalar", "tf.function called with a new Python int each call",
         _handler("worker.tf_handlers:retracing", width=16),
         lambda i, rng: _floats(4, 16, rng), 2000),
    Case("c_python_hoard", "handler keeps a dict + list of 20 floats + str per call",
         _handler("bench.leak_handlers:python_hoard"),
         lambda i, rng: _floats(4, 16, rng), 80000),  # > a minute: a census is due
    Case("d_native_leak", "handler mallocs 64 KiB per call through ctypes, never freed",
         _handler("bench.leak_handlers:native_leak", bytes_per_call=65536),
         lambda i, rng: _floats(4, 16, rng), 4000),
    Case("e_saved_model_lengths", "SavedModel int32[None, None], sequence length 1-1024",
         _embedding,
         lambda i, rng: {"input_ids": rng.integers(0, 1000, (2, int(rng.integers(1, 1025))),
                                                   dtype=np.int32)}, 4000),
    Case("f_keras_predict", "the demo MLP through model.predict() per call",
         _handler("bench.leak_handlers:keras_predict"),
         lambda i, rng: _floats(1, 64, rng, "features"), 2000),
    Case("g_healthy", "the demo MLP SavedModel, batch sizes 1/2/4/8",
         _demo, lambda i, rng: _floats(1 << (i % 4), 64, rng, "features"), 6000),
    Case("h_batch_sizes", "the demo MLP SavedModel, batch size 1-399",
         _demo, lambda i, rng: _floats(int(rng.integers(1, 400)), 64, rng, "features"), 4000),
]


# --- measuring ---------------------------------------------------------------------------------

METRICS = ("rss", "graphs", "py_blocks", "native_heap", "shapes", "tf_allocator")


def slope_per_1k(beats: list[Beat], metric: str, after_jobs: int) -> float | None:
    points = [(b.jobs, _value(b, metric)) for b in beats if b.jobs >= after_jobs]
    points = [(x, y) for x, y in points if y is not None]
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    return float(np.polyfit(xs, ys, 1)[0] * 1000)


def _value(beat: Beat, metric: str) -> float | None:
    if metric == "rss":
        return beat.rss
    value = getattr(beat.probes, metric, None) if beat.probes else None
    return None if value is None else float(value)


def run_case(case: Case, scale: float, scratch: Path) -> dict[str, Any]:
    jobs = max(20, int(case.jobs * scale))
    worker = DirectWorker(case.model(scratch))
    rng = np.random.default_rng(1)
    try:
        start = time.monotonic()
        for i in range(jobs):
            worker.infer(case.inputs(i, rng))
        took = time.monotonic() - start
        last = worker.settled()
        output = worker.output()
    finally:
        code = worker.close()
    beats = [b for b in worker.beats if b.probes is not None]
    first = beats[0]
    probes = last.probes or Probes()
    slopes = {m: slope_per_1k(beats, m, int(jobs * WARMUP)) for m in METRICS}
    return {
        "case": case.name, "cause": case.cause, "jobs": jobs, "seconds": round(took, 1),
        "exit_code": code, "heartbeats": len(beats),
        "slope_per_1k_jobs": {m: None if v is None else round(v, 1) for m, v in slopes.items()},
        "start": {m: _value(first, m) for m in METRICS},
        "end": {m: _value(last, m) for m in METRICS},
        "traced": [list(t) for t in probes.traced],
        "top_shapes": [s.to_wire() for s in probes.top_shapes[:4]],
        "census": [list(c) for c in probes.census],
        "cost_seconds": probes.cost_seconds,
        # From the first heartbeat on: the start-up census baseline is not a per-job cost.
        "cost_us_per_job": round((probes.cost_seconds - first.probes.cost_seconds) /
                                 max(1, last.jobs - first.jobs) * 1e6, 1) if first.probes
        else None,
        "retracing_warnings": output.count("triggered tf.function retracing"),
    }


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:+.2f} MB"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def run(scale: float, names: list[str] | None = None, out: Path | None = None) -> dict[str, Any]:
    scratch = short_tmpdir()
    results = []
    try:
        for case in CASES:
            if names and case.name not in names:
                continue
            result = run_case(case, scale, scratch)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table: list[list[Any]] = [["case", "jobs", "RSS /1k", "graphs /1k", "py_blocks /1k",
                               "native_heap /1k", "shapes /1k", "tf_allocator /1k", "traced",
                               "top shapes (batches, first growth, growth)", "census"]]
    for r in results:
        s = r["slope_per_1k_jobs"]
        table.append([
            r["case"], r["jobs"], _mb(s["rss"]), _n(s["graphs"]), _n(s["py_blocks"]),
            _mb(s["native_heap"]), _n(s["shapes"]), _mb(s["tf_allocator"]),
            ", ".join(f"{n} {c}" for n, c in r["traced"][:3]) or "-",
            "; ".join(f"{sig} ({b}, {f // 1024} KiB, {g // 1024} KiB)"
                      for sig, b, f, g in r["top_shapes"][:2]) or "-",
            ", ".join(f"{n} +{c}" for n, c in r["census"][:3]) or "-"])
    result = {"scale": scale, "warmup_fraction": WARMUP, "results": results}
    write("leak_probes", result, table, out,
          "One real worker per case (TF threads 1/1), jobs one at a time; slopes are least "
          f"squares over heartbeats (0.25 s) after the first {WARMUP:.0%} of the jobs. "
          "Traced, shapes and census are from the last heartbeat.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="times each case's jobs")
    parser.add_argument("--case", action="append", help="run only these cases")
    parser.add_argument("--quick", action="store_true", help="a tenth of the jobs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run(args.scale / 10 if args.quick else args.scale, args.case, args.out)


if __name__ == "__main__":
    main()
