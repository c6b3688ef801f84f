"""Benchmark 1: round trip of tiny jobs through the supervisor vs a raw pyzmq echo.

Both in the same run, sequential requests of one 1x4 float32 array: a raw REQ/REP echo
between two Python processes (one hop, no protocol work), and tfsupervisor (client ->
supervisor -> echo worker -> supervisor -> client). Target: p50 ratio <= 2.0.

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
import zmq

from bench.common import percentiles, write
from supervisor.client import Client
from supervisor.testing import short_tmpdir, start_supervisor

ECHO_SERVER = """
import sys, zmq
sock = zmq.Context().socket(zmq.REP)
sock.bind(sys.argv[1])
while True:
    sock.send_multipart(sock.recv_multipart(copy=False), copy=False)
"""


def raw_echo(jobs: int) -> list[float]:
    endpoint = f"ipc://{short_tmpdir()}/echo.sock"
    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, endpoint])
    try:
        sock = zmq.Context.instance().socket(zmq.REQ)
        sock.connect(endpoint)
        payload = np.ones((1, 4), np.float32).tobytes()
        frames = [b"TFS1", b"infer", b"0123456789abcdef", b"\x80", payload]
        for _ in range(200):  # warm up
            sock.send_multipart(frames)
            sock.recv_multipart()
        latencies = []
        for _ in range(jobs):
            start = time.perf_counter()
            sock.send_multipart(frames)
            sock.recv_multipart()
            latencies.append(time.perf_counter() - start)
        sock.close()
        return latencies
    finally:
        server.kill()
        server.wait()


def supervised(jobs: int) -> list[float]:
    sup = start_supervisor({"models": {"echo": {"handler": "worker.handlers:echo",
                                                "workers": 1}}})
    try:
        sup.wait_ready()
        x = {"x": np.ones((1, 4), np.float32)}
        with Client(sup.endpoint, timeout=10) as client:
            for _ in range(200):
                client.infer("echo", x)
            latencies = []
            for _ in range(jobs):
                start = time.perf_counter()
                client.infer("echo", x)
                latencies.append(time.perf_counter() - start)
        return latencies
    finally:
        sup.stop()


def run(jobs: int, out: Path | None = None) -> dict[str, Any]:
    raw = percentiles(raw_echo(jobs))
    sup = percentiles(supervised(jobs))
    result = {"jobs": jobs, "raw_pyzmq_echo": raw, "tfsupervisor": sup,
              "ratio_p50": round(sup["p50_ms"] / raw["p50_ms"], 2),
              "ratio_p99": round(sup["p99_ms"] / raw["p99_ms"], 2), "target_ratio": 2.0}
    write("roundtrip", result, [
        ["path", "p50 ms", "p99 ms", "mean ms"],
        ["raw pyzmq REQ/REP echo (1 hop)", raw["p50_ms"], raw["p99_ms"], raw["mean_ms"]],
        ["tfsupervisor, echo worker (2 hops)", sup["p50_ms"], sup["p99_ms"], sup["mean_ms"]],
        ["ratio", result["ratio_p50"], result["ratio_p99"], ""]], out,
        f"{jobs} sequential jobs each. Target: ratio <= 2.0.")
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
