"""Where each µs of a demo-MLP job goes: per process, and inside the worker per step.

Two loads on the demo MLP SavedModel (2 workers, batches up to 32, TF 1 thread per op):

1. **One in flight**: one client, sequential batch-1 jobs. The round trip (p50), then each
   process's CPU per job (client, supervisor, worker: user + system, ZeroMQ I/O threads
   included), against the same steps measured alone in this process: the client's encode
   and decode, the worker's whole path for a batch of one (decode, checks, model call,
   split, encode) and the model call alone.
2. **Under load**: 32 clients in 4 processes, ``--wait-ms`` batch wait. Each process's CPU
   per job, the batch sizes the supervisor sent (its own metrics), and the worker's path
   measured alone at the mean batch size, split into the model call and the Python around
   it.

Timestamps inside the daemon and the workers are not taken (that would add work to every
job); the split comes from CPU clocks per process and from the same code run alone.

    python -m bench.hops [--seconds 10] [--jobs 2000] [--wait-ms 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import cpu, percentiles, write
from bench.harness.transport import Zmq
from bench.mlp import MLP, build_model, supervisor_config
from supervisor.client import Client
from supervisor.client.client import outcome, request_message
from supervisor.shared.protocol import RESULT, Message, decode, encode, pack_arrays
from supervisor.testing import free_port, start_supervisor

# Runs in a fresh process (TensorFlow is never imported by the bench itself): the worker's
# path for one JOB message of `rows` batch-1 jobs, padded as the supervisor pads, and the
# model call alone on the same padded batch. Prints CPU µs per batch for both.
WORKER_PATH = """
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from supervisor.shared.protocol import INTERNAL_HOP, JobEntry, decode, encode, pack_job
from supervisor.shared.protocol import pack_results, signed
from worker.batch import run_batch
from worker.runners import load
from worker.warmup import adopt_direct, warm
runner = load("saved_model", sys.argv[1], "serving_default", {})
public = runner.call
warm(runner, [1])
adopt_direct(runner, [1])  # as a worker does: the model served through its direct call
out = {}
x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
for rows in json.loads(sys.argv[2]):
    pad = 1 << (rows - 1).bit_length()
    spec = [{"name": "features", "dtype": "float32", "shape": [1, 64]}]
    frames = encode(pack_job([JobEntry(str(i).encode(), spec, [x.tobytes()])
                              for i in range(rows)], pad))
    batch = np.repeat(x, pad, axis=0)
    def path():
        replies = run_batch(runner, decode(frames, INTERNAL_HOP))
        return encode(signed(pack_results(replies), "s" * 32))
    def call():
        return runner({"features": batch})
    timings = {}
    for name, step in (("path", path), ("call", call)):
        for _ in range(50):
            step()
        n = 400
        start = time.process_time()
        for _ in range(n):
            step()
        timings[name] = (time.process_time() - start) / n * 1e6
    out[rows] = timings
print(json.dumps({"direct_call": runner.call is not public, "steps": out}))
"""


class Processes:
    """CPU seconds of the supervisor and each worker, read before and after a window."""

    def __init__(self, root: int) -> None:
        self.root = psutil.Process(root)
        self.workers = self.root.children()
        self.before = self._read()

    def _read(self) -> list[float]:
        return [cpu(p) for p in (self.root, *self.workers)]

    def per_job(self, jobs: int) -> dict[str, float]:
        spent = [b - a for a, b in zip(self.before, self._read(), strict=True)]
        return {"supervisor_us": round(spent[0] / jobs * 1e6, 1),
                "workers_us": round(sum(spent[1:]) / jobs * 1e6, 1)}


def worker_path(model: Path, sizes: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
    """CPU µs per batch of the worker's path and of the model call, by batch size; and
    whether the model was called directly (worker/direct_call.py), as a worker calls it."""
    import json

    out = subprocess.run([sys.executable, "-c", WORKER_PATH, str(model), json.dumps(sizes)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {int(k): v for k, v in result["steps"].items()}, bool(result["direct_call"])


def client_steps(jobs: int = 5000) -> float:
    """CPU µs per job of the client's own protocol work: request encode, reply decode."""
    x = {"features": np.zeros((1, 64), np.float32)}
    specs, frames = pack_arrays({"probability": np.zeros((1, 1), np.float32)})
    reply = encode(Message(RESULT, b"0" * 16, {"outputs": specs}, frames))
    start = time.process_time()
    for _ in range(jobs):
        encode(request_message("mlp", x, 10.0))
        outcome(decode(reply))
    return (time.process_time() - start) / jobs * 1e6


def one_in_flight(model: Path, jobs: int) -> dict[str, Any]:
    sup = start_supervisor(supervisor_config(model, batching=True))
    try:
        sup.wait_ready(timeout=300)
        x = {"features": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)}
        with Client(sup.endpoint, timeout=30) as client:
            for _ in range(200):
                client.infer("mlp", x)
            procs = Processes(sup.process.pid)
            mine = time.process_time()
            latencies = []
            for _ in range(jobs):
                start = time.perf_counter()
                client.infer("mlp", x)
                latencies.append(time.perf_counter() - start)
            client_us = (time.process_time() - mine) / jobs * 1e6
            return {**percentiles(latencies), "client_us": round(client_us, 1),
                    **procs.per_job(jobs)}
    finally:
        sup.stop()


def under_load(model: Path, seconds: float, wait_ms: float) -> dict[str, Any]:
    config = supervisor_config(model, batching=True)
    config["models"]["mlp"]["batching"]["batch_timeout_ms"] = wait_ms
    port = free_port()
    config["supervisor"] = {"metrics": f"127.0.0.1:{port}"}
    sup = start_supervisor(config)
    try:
        sup.wait_ready(timeout=300)
        load = MLP.load(Zmq(sup.endpoint, "mlp", "output_0"))
        load.closed(2.0)
        sizes_before = batch_sizes(port)
        procs = Processes(sup.process.pid)
        run = load.closed(seconds, seed=1)
        jobs = len(run.latencies)
        sizes_after = batch_sizes(port)
        batches = sizes_after[1] - sizes_before[1]
        rows = sizes_after[0] - sizes_before[0]
        return {"jobs_per_second": round(jobs / seconds, 1), "failures": run.failures,
                **percentiles(run.latencies), **procs.per_job(jobs),
                "batches": int(batches), "mean_rows": round(rows / max(batches, 1), 2),
                "single_job_batches": int(sizes_after[2] - sizes_before[2])}
    finally:
        sup.stop()


def batch_sizes(port: int) -> tuple[float, float, float]:
    """(rows sent, batches sent, batches of one row) from the supervisor's metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    values = {"sum": 0.0, "count": 0.0, "one": 0.0}
    for line in text.decode().splitlines():
        if line.startswith("tfsupervisor_batch_size_sum"):
            values["sum"] = float(line.split()[-1])
        elif line.startswith("tfsupervisor_batch_size_count"):
            values["count"] = float(line.split()[-1])
        elif line.startswith('tfsupervisor_batch_size_bucket{le="1.0"'):
            values["one"] = float(line.split()[-1])
    return values["sum"], values["count"], values["one"]


def run(seconds: float, jobs: int, wait_ms: float, out: Path | None = None,
        model: Path | None = None) -> dict[str, Any]:
    """``model``: the demo MLP's SavedModel if one is at hand, else one is built."""
    model = model or build_model()
    single = one_in_flight(model, jobs)
    loaded = under_load(model, seconds, wait_ms)
    mean = max(1, round(loaded["mean_rows"]))
    steps, direct = worker_path(model, sorted({1, mean}))
    client = client_steps()
    one, batch = steps[1], steps[mean]
    called = " (direct call)" if direct else " (public call)"
    result = {"one_in_flight": single, "under_load": loaded, "wait_ms": wait_ms,
              "worker_path_us": {str(k): v for k, v in steps.items()}, "direct_call": direct,
              "client_protocol_us": round(client, 1)}
    table = [["load", "what", "µs per job"],
             ["one in flight", f"round trip p50 ({single['p50_ms']} ms)",
              round(single["p50_ms"] * 1000)],
             ["one in flight", "client process CPU", single["client_us"]],
             ["one in flight", "... of which encode + decode alone", round(client, 1)],
             ["one in flight", "supervisor process CPU", single["supervisor_us"]],
             ["one in flight", "worker process CPU", single["workers_us"]],
             ["one in flight", "... worker path alone (batch of 1)", round(one["path"], 1)],
             ["one in flight", f"... of which the model call{called}", round(one["call"], 1)],
             ["under load", f"{loaded['jobs_per_second']} jobs/s, p50 {loaded['p50_ms']} ms, "
              f"mean batch {loaded['mean_rows']} rows", ""],
             ["under load", "supervisor process CPU", loaded["supervisor_us"]],
             ["under load", "workers' CPU", loaded["workers_us"]],
             ["under load", f"... worker path alone, batch of {mean}",
              round(batch["path"] / mean, 1)],
             ["under load", f"... of which the model call{called}",
              round(batch["call"] / mean, 1)]]
    write("hops", result, table, out,
          f"Demo MLP, 2 workers, TF 1 thread per op. One in flight: {jobs} sequential jobs. "
          f"Under load: 32 clients in 4 processes for {seconds:g} s, batch wait {wait_ms:g} "
          "ms. Process CPU: user + system per job, ZeroMQ I/O threads included; 'alone': "
          "the same code run in one process without sockets.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--wait-ms", type=float, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    seconds, jobs = (3.0, 200) if args.quick else (args.seconds, args.jobs)
    print(run(seconds, jobs, args.wait_ms, args.out))


if __name__ == "__main__":
    main()
