"""Benchmark 1: round trip of tiny jobs through the supervisor vs a raw pyzmq echo, and
what each process spends per job.

All in the same run, sequential requests of one 1x4 float32 array: a raw REQ/REP echo
between two Python processes (one hop, no protocol work); a bare pyzmq DEALER sending the
frames of a real request to a ROUTER echo (the least a client can spend per call); the
bare-broker floor (zguide's load-balancing broker in plain Python: the same two hops each
way as tfsupervisor, frames passed through untouched to an echoing worker); and
tfsupervisor (the project's Client -> supervisor -> echo worker -> supervisor -> client).
Each process's CPU (user + system, its ZeroMQ I/O thread included) is read before and after.
Targets: p50 ratio <= 2.0, p99 <= 3.0; client CPU <= 2x the bare DEALER's; p50 <= 1.25x
the bare broker's.

    python -m bench.roundtrip [--jobs 3000] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

from bench.common import cpu, percentiles, scratch, write
from supervisor.client.client import Client, request_message
from supervisor.shared.protocol import encode
from supervisor.testing import start_supervisor

ECHO_SERVER = """
import sys, zmq
sock = zmq.Context().socket(zmq.REP)
sock.bind(sys.argv[1])
while True:
    sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
"""


ROUTER_ECHO = """
import sys, zmq
sock = zmq.Context().socket(zmq.ROUTER)
sock.bind(sys.argv[1])
while True:
    sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
"""


# The bare-broker floor: zguide's load-balancing broker in plain Python, the same four hops as
# tfsupervisor (client DEALER -> ROUTER | broker | ROUTER <- worker DEALER) and no protocol
# work at all: frames pass through untouched, the worker echoes them.
BROKER = """
import sys, zmq
ctx = zmq.Context()
front, back = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
front.bind(sys.argv[1])
back.bind(sys.argv[2])
poller = zmq.Poller()
poller.register(back, zmq.POLLIN)
idle = []
while True:
    ready = dict(poller.poll())
    if back in ready:
        frames = back.recv_multipart(copy=False)
        idle.append(frames[0].bytes)
        if len(frames) > 2:  # a reply: [worker, client, ...]; [worker, READY] only frees it
            front.send_multipart(frames[1:], copy=False)
        if len(idle) == 1:
            poller.register(front, zmq.POLLIN)
    if front in ready and idle:
        back.send_multipart([idle.pop(0), *front.recv_multipart(copy=False)], copy=False)
        if not idle:
            poller.unregister(front)
"""

BROKER_WORKER = """
import sys, zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(sys.argv[1])
sock.send(b"READY")
while True:
    sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
"""


def warmed_dealer(endpoint: str) -> tuple[zmq.Socket[bytes], list[Any]]:
    """A bare DEALER connected to ``endpoint`` and the frames of a real request, after 200
    round trips of warm-up."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    frames = encode(request_message("echo", {"x": np.ones((1, 4), np.float32)}, 10.0))
    for _ in range(200):
        sock.send_multipart(frames)
        sock.recv_multipart()
    return sock, frames


def sequential(sock: zmq.Socket[bytes], frames: list[Any], jobs: int) -> list[float]:
    """Each of ``jobs`` round trips of ``frames`` on a bare socket, one after another."""
    latencies = []
    for _ in range(jobs):
        start = time.perf_counter()
        sock.send_multipart(frames)
        sock.recv_multipart()
        latencies.append(time.perf_counter() - start)
    return latencies


def bare_broker(jobs: int) -> tuple[list[float], dict[str, float]]:
    """Latencies of a request's frames through the bare broker and back, and CPU per job of
    the broker and its worker."""
    with scratch() as tmp:
        front, back = f"ipc://{tmp}/front.sock", f"ipc://{tmp}/back.sock"
        broker = subprocess.Popen([sys.executable, "-c", BROKER, front, back])
        worker = subprocess.Popen([sys.executable, "-c", BROKER_WORKER, back])
        try:
            sock, frames = warmed_dealer(front)
            procs = psutil.Process(broker.pid), psutil.Process(worker.pid)
            before = [cpu(p) for p in procs]
            latencies = sequential(sock, frames, jobs)
            spent = {"broker_us": (cpu(procs[0]) - before[0]) / jobs * 1e6,
                     "worker_us": (cpu(procs[1]) - before[1]) / jobs * 1e6}
            sock.close()
            return latencies, spent
        finally:
            for proc in (broker, worker):
                proc.kill()
                proc.wait()


def raw_echo(jobs: int) -> list[float]:
    with scratch() as tmp:
        endpoint = f"ipc://{tmp}/echo.sock"
        server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, endpoint])
        try:
            sock = zmq.Context.instance().socket(zmq.REQ)
            sock.connect(endpoint)
            payload = np.ones((1, 4), np.float32).tobytes()
            frames = [b"TFS1", b"infer", b"0123456789abcdef", b"\x80", payload]
            sequential(sock, frames, 200)  # warm up
            latencies = sequential(sock, frames, jobs)
            sock.close()
            return latencies
        finally:
            server.kill()
            server.wait()


def bare_dealer(jobs: int) -> dict[str, float]:
    """Client and server CPU per call of a bare DEALER send+recv of a request's frames."""
    with scratch() as tmp:
        endpoint = f"ipc://{tmp}/echo.sock"
        server = subprocess.Popen([sys.executable, "-c", ROUTER_ECHO, endpoint])
        try:
            sock, frames = warmed_dealer(endpoint)
            peer = psutil.Process(server.pid)
            mine, theirs = time.process_time(), cpu(peer)
            for _ in range(jobs):
                sock.send_multipart(frames)
                sock.recv_multipart()
            out = {"client_us": (time.process_time() - mine) / jobs * 1e6,
                   "server_us": (cpu(peer) - theirs) / jobs * 1e6}
            sock.close()
            return out
        finally:
            server.kill()
            server.wait()


def supervised(jobs: int) -> tuple[list[float], dict[str, float]]:
    """Latencies through the supervisor, and CPU per job of client, supervisor and worker."""
    with scratch() as tmp:
        sup = start_supervisor({"models": {"echo": {"handler": "worker.handlers:echo",
                                                    "workers": 1}}}, tmp)
        try:
            sup.wait_ready()
            x = {"x": np.ones((1, 4), np.float32)}
            with Client(sup.endpoint, timeout=10) as client:
                for _ in range(200):
                    client.infer("echo", x)
                daemon = psutil.Process(sup.process.pid)
                [worker] = daemon.children()
                latencies = []
                mine, theirs, its = time.process_time(), cpu(daemon), cpu(worker)
                for _ in range(jobs):
                    start = time.perf_counter()
                    client.infer("echo", x)
                    latencies.append(time.perf_counter() - start)
                spent = {"client_us": (time.process_time() - mine) / jobs * 1e6,
                         "supervisor_us": (cpu(daemon) - theirs) / jobs * 1e6,
                         "worker_us": (cpu(worker) - its) / jobs * 1e6}
            return latencies, spent
        finally:
            sup.stop()


def run(jobs: int, out: Path | None = None) -> dict[str, Any]:
    raw = percentiles(raw_echo(jobs))
    bare = bare_dealer(jobs)
    broker_latencies, broker_spent = bare_broker(jobs)
    floor = percentiles(broker_latencies)
    latencies, spent = supervised(jobs)
    sup = percentiles(latencies)
    result = {"jobs": jobs, "raw_pyzmq_echo": raw, "bare_broker": floor, "tfsupervisor": sup,
              "bare_broker_cpu_us_per_job": broker_spent,
              "ratio_p50_broker": round(sup["p50_ms"] / floor["p50_ms"], 2),
              "target_ratio_p50_broker": 1.25,
              "ratio_p50": round(sup["p50_ms"] / raw["p50_ms"], 2),
              "ratio_p99": round(sup["p99_ms"] / raw["p99_ms"], 2), "target_ratio": 2.0,
              "cpu_us_per_job": {"bare_dealer": bare, "tfsupervisor": spent},
              "client_cpu_ratio": round(spent["client_us"] / bare["client_us"], 2),
              "target_client_cpu_ratio": 2.0}
    us = {k: round(v, 1) for k, v in {**spent, **{f"bare_{k}": v for k, v in bare.items()}
                                      }.items()}
    write("roundtrip", result, [
        ["path", "p50 ms", "p99 ms", "mean ms", "client CPU µs/job", "supervisor CPU µs/job",
         "worker (server) CPU µs/job"],
        ["raw pyzmq REQ/REP echo (1 hop)", raw["p50_ms"], raw["p99_ms"], raw["mean_ms"],
         "", "", ""],
        ["bare DEALER -> ROUTER echo, a request's frames", "", "", "", us["bare_client_us"],
         "", us["bare_server_us"]],
        ["bare Python broker (zguide lbbroker, 2 hops, no protocol work)", floor["p50_ms"],
         floor["p99_ms"], floor["mean_ms"], "", round(broker_spent["broker_us"], 1),
         round(broker_spent["worker_us"], 1)],
        ["tfsupervisor Client, echo worker (2 hops)", sup["p50_ms"], sup["p99_ms"],
         sup["mean_ms"], us["client_us"], us["supervisor_us"], us["worker_us"]],
        ["ratio to the raw echo (targets: 2.0, 3.0; client CPU 2.0)", result["ratio_p50"],
         result["ratio_p99"], "", result["client_cpu_ratio"], "", ""],
        ["p50 ratio to the bare broker (target 1.25)", result["ratio_p50_broker"], "", "",
         "", "", ""]], out,
        f"{jobs} sequential jobs each. CPU is user + system of each process, ZeroMQ I/O "
        "threads included.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(run(100 if args.quick else args.jobs, args.out))


if __name__ == "__main__":
    main()
