"""Benchmark 2: tiny-job throughput with pipelined clients.

Client processes each keep a window of requests in flight on a DEALER socket; the
supervisor serves an echo model (batching on) with two workers. Target: >= 10k jobs/s
on 2 cores (client processes included on the same cores).

    python -m bench.throughput [--seconds 10] [--clients 2] [--window 64] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from bench.common import write
from supervisor.testing import start_supervisor
from supervisor.transport import NOBLOCK, recv, send


def client(endpoint: str, seconds: float, window: int, results: Any) -> None:
    """A load generator: keeps ``window`` requests in flight and reads every reply that is
    waiting before it polls again (through the same frame functions as the daemon)."""
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    payload = np.ones((1, 4), np.float32).tobytes()
    header = msgpack.packb({"model": "echo", "inputs": [
        {"name": "x", "dtype": "float32", "shape": [1, 4]}]})
    done = errors = in_flight = 0
    ids = itertools.count()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or in_flight:
        while in_flight < window and time.perf_counter() < deadline:
            send(sock, [b"TFS1", b"infer", next(ids).to_bytes(8, "little"), header, payload])
            in_flight += 1
        if not sock.poll(5000):
            break
        while in_flight:
            try:
                reply = recv(sock, NOBLOCK)
            except zmq.Again:
                break
            in_flight -= 1
            done += reply[1] == b"result"
            errors += reply[1] != b"result"
    results.put((done, errors))


def run(seconds: float, clients: int, window: int, out: Path | None = None) -> dict[str, Any]:
    sup = start_supervisor({"models": {"echo": {
        "handler": "worker.handlers:echo", "workers": 2,
        "batching": {"max_batch_size": 64}}}, "supervisor": {"max_queue": 10000}})
    try:
        sup.wait_ready()
        spawn = mp.get_context("spawn")  # fresh processes: no ZeroMQ state forked
        results: Any = spawn.Queue()
        procs = [spawn.Process(target=client, args=(sup.endpoint, seconds, window, results))
                 for _ in range(clients)]
        start = time.perf_counter()
        for p in procs:
            p.start()
        totals = [results.get(timeout=seconds + 60) for _ in procs]
        elapsed = time.perf_counter() - start
        for p in procs:
            p.join()
        batches = sup.status()["models"]["echo"]["batches"]
    finally:
        sup.stop()
    done = sum(t[0] for t in totals)
    result = {"seconds": round(elapsed, 2), "clients": clients, "window": window,
              "jobs": done, "errors": sum(t[1] for t in totals),
              "jobs_per_second": round(done / elapsed), "mean_batch_rows": batches["mean_rows"],
              "target_jobs_per_second": 10000}
    write("throughput", result, [
        ["clients x window", "jobs", "errors", "jobs/s", "mean batch", "target"],
        [f"{clients} x {window}", done, result["errors"], result["jobs_per_second"],
         batches["mean_rows"], ">= 10000"]], out,
        "Echo model, 2 workers, batching up to 64; client processes share the 2 cores.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(run(1.0 if args.quick else args.seconds, args.clients, args.window, args.out))


if __name__ == "__main__":
    main()
