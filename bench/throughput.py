"""Benchmark 2: tiny-job throughput with pipelined clients.

Client processes each keep a window of requests in flight: first a load generator on a raw
DEALER socket (the least a client can cost), then the project's AsyncClient; the supervisor
serves an echo model (batching on) with two workers. Targets: >= 20k jobs/s with the
AsyncClient, the supervisor's CPU <= 50 µs per job (client processes share the 2 cores).

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
import psutil
import zmq

from bench.common import write
from supervisor.shared.transport import NOBLOCK, recv, send
from supervisor.testing import start_supervisor


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


def python_client(endpoint: str, seconds: float, window: int, results: Any) -> None:
    """The project's AsyncClient, as an application would use it: ``window`` calls in
    flight on one event loop, each task sending its next job when its last is answered."""
    import asyncio

    from supervisor.aclient import AsyncClient

    async def go() -> tuple[int, int]:
        done = errors = 0
        x = {"x": np.ones((1, 4), np.float32)}
        deadline = time.perf_counter() + seconds
        async with AsyncClient(endpoint, timeout=30) as client:
            async def one() -> None:
                nonlocal done, errors
                while time.perf_counter() < deadline:
                    try:
                        await client.infer("echo", x)
                        done += 1
                    except Exception:
                        errors += 1
            await asyncio.gather(*(one() for _ in range(window)))
        return done, errors

    results.put(asyncio.run(go()))


def measure(sup: Any, target: Any, seconds: float, clients: int, window: int,
            ) -> dict[str, Any]:
    """Jobs/s with ``clients`` processes running ``target``, and the supervisor's CPU per
    job (user + system, its ZeroMQ I/O thread included) over the run."""
    spawn = mp.get_context("spawn")  # fresh processes: no ZeroMQ state forked
    results: Any = spawn.Queue()
    procs = [spawn.Process(target=target, args=(sup.endpoint, seconds, window, results))
             for _ in range(clients)]
    daemon = psutil.Process(sup.process.pid)
    before, start = daemon.cpu_times(), time.perf_counter()
    for p in procs:
        p.start()
    totals = [results.get(timeout=seconds + 120) for _ in procs]
    elapsed = time.perf_counter() - start
    after = daemon.cpu_times()
    for p in procs:
        p.join()
    done = sum(t[0] for t in totals)
    cpu = (after.user + after.system) - (before.user + before.system)
    return {"jobs": done, "errors": sum(t[1] for t in totals), "seconds": round(elapsed, 2),
            "jobs_per_second": round(done / elapsed),
            "supervisor_cpu_us_per_job": round(cpu / max(done, 1) * 1e6, 1)}


def run(seconds: float, clients: int, window: int, out: Path | None = None) -> dict[str, Any]:
    sup = start_supervisor({"models": {"echo": {
        "handler": "worker.handlers:echo", "workers": 2,
        "batching": {"max_batch_size": 64}}}, "supervisor": {"max_queue": 10000}})
    try:
        sup.wait_ready()
        bench = measure(sup, client, seconds, clients, window)
        python = measure(sup, python_client, seconds, clients, window)
        batches = sup.status()["models"]["echo"]["batches"]
    finally:
        sup.stop()
    result = {"clients": clients, "window": window, "bench_client": bench,
              "python_client": python, "jobs_per_second": bench["jobs_per_second"],
              "jobs": bench["jobs"] + python["jobs"], "errors": bench["errors"] + python["errors"],
              "mean_batch_rows": batches["mean_rows"], "target_jobs_per_second": 20000,
              "target_supervisor_cpu_us_per_job": 50}
    write("throughput", result, [
        ["clients", "clients x window", "jobs", "errors", "jobs/s", "supervisor CPU µs/job",
         "target"],
        *([name, f"{clients} x {window}", r["jobs"], r["errors"], r["jobs_per_second"],
           r["supervisor_cpu_us_per_job"], ">= 20000 jobs/s, <= 50 µs"]
          for name, r in (("raw DEALER bench client", bench),
                          ("AsyncClient (the project's)", python)))], out,
        "Echo model, 2 workers, batching up to 64 (mean batch over both runs: "
        f"{batches['mean_rows']} rows); client processes share the 2 cores with the "
        "supervisor and the workers.")
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
