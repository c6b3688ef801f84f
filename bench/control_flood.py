"""Benchmark: what a flood of `status` requests on the control socket does to the jobs.

Issue 47 item 2: raw `status` requests (6 threads, 1,000-1,800 a second) raised job p99
from 9-14 ms to 27-60 ms. One daemon (the TF-free echo handler, 2 workers), closed-loop job
clients in one process, and rounds that alternate quiet and flood side by side in one run:
in a flood round a second process runs 6 threads, each on its own raw DEALER connection to
the control socket, sending `status` and waiting for the answer (a closed loop, as fast as
the daemon answers). Target: job p99 in the flood within 1.5x of its quiet value. A third
phase floods the same way on a new connection per request (as `control()` does), which
per-connection pacing does not slow: what the published status alone saves.

    python -m bench.control_flood [--rounds 3] [--seconds 5] [--clients 4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from typing import Any

import numpy as np
import zmq

from bench.common import percentiles, scratch, write
from supervisor.client import Client
from supervisor.shared.protocol import CONTROL, Message, decode, encode
from supervisor.testing import start_supervisor

FLOODERS = 6


def _flood(endpoint: str, seconds: float, counts: Any, reconnect: bool) -> None:
    """FLOODERS threads, each a raw connection asking `status` in a closed loop
    (``reconnect``: a new connection for each request)."""
    context = zmq.Context()
    request = encode(Message(CONTROL, b"", {"command": "status"}))

    def one(index: int) -> None:
        sock = context.socket(zmq.DEALER)
        sock.connect(endpoint)
        answered = refused = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if reconnect:
                sock.close(linger=0)
                sock = context.socket(zmq.DEALER)
                sock.connect(endpoint)
            sock.send_multipart(request)
            if not sock.poll(max(1, int((end - time.monotonic()) * 1000))):
                break
            reply = decode(sock.recv_multipart())
            if reply.header.get("ok"):
                answered += 1
            else:
                refused += 1
        sock.close(linger=0)
        counts[2 * index], counts[2 * index + 1] = answered, refused

    threads = [threading.Thread(target=one, args=(i,)) for i in range(FLOODERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    context.term()


def _jobs(endpoint: str, clients: int, seconds: float) -> tuple[list[float], int]:
    """Closed-loop clients for ``seconds``: every job's latency."""
    latencies: list[float] = []
    lock = threading.Lock()
    x = {"x": np.ones((1, 4), np.float32)}

    def one() -> None:
        own = []
        with Client(endpoint, timeout=30) as client:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                start = time.perf_counter()
                client.infer("m", x)
                own.append(time.perf_counter() - start)
        with lock:
            latencies.extend(own)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, len(latencies)


def run(rounds: int, seconds: float, clients: int) -> dict[str, Any]:
    phases: dict[str, list[float]] = {"quiet": [], "flood": [], "flood_reconnecting": []}
    statuses = {phase: {"answered": 0, "refused": 0} for phase in phases if phase != "quiet"}
    with scratch() as workdir:
        sup = start_supervisor({"models": {"m": {"handler": "worker.handlers:echo",
                                                 "workers": 2}}}, workdir)
        try:
            sup.wait_ready()
            _jobs(sup.endpoint, clients, 1.0)  # warm: connections, first batches
            for _ in range(rounds):
                for phase in phases:
                    flooder = None
                    counts = multiprocessing.Array("q", 2 * FLOODERS)
                    if phase != "quiet":
                        flooder = multiprocessing.Process(
                            target=_flood, args=(sup.control_endpoint, seconds + 1.0, counts,
                                                 phase == "flood_reconnecting"))
                        flooder.start()
                        time.sleep(0.5)  # the flood under way before jobs are measured
                    latencies, _ = _jobs(sup.endpoint, clients, seconds)
                    phases[phase] += latencies
                    if flooder is not None:
                        flooder.join()
                        statuses[phase]["answered"] += sum(counts[0::2])
                        statuses[phase]["refused"] += sum(counts[1::2])
            metrics = sup.status()["supervisor"]
        finally:
            sup.stop()
    flood_seconds = rounds * (seconds + 1.0)
    result = {phase: {**percentiles(values), "jobs_per_s": round(len(values) /
                                                                 (rounds * seconds), 1)}
              for phase, values in phases.items()}
    for phase, counted in statuses.items():
        result[phase]["status_per_s"] = {k: round(v / flood_seconds, 1)
                                         for k, v in counted.items()}
        result[phase]["p99_ratio"] = round(result[phase]["p99_ms"] / result["quiet"]["p99_ms"],
                                           2)
    result["control_paced"] = metrics.get("control_paced")
    result["setup"] = {"rounds": rounds, "seconds": seconds, "clients": clients,
                       "flooders": FLOODERS, "model": "echo handler, 2 workers"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", default=None, help="results name (default control_flood)")
    args = parser.parse_args()
    result = run(args.rounds, args.seconds, args.clients)
    table = [["phase", "jobs/s", "p50 ms", "p99 ms", "p99 / quiet", "status answered/s"]] + [
        [phase, result[phase]["jobs_per_s"], result[phase]["p50_ms"], result[phase]["p99_ms"],
         result[phase].get("p99_ratio", 1.0),
         result[phase].get("status_per_s", {}).get("answered", "-")]
        for phase in ("quiet", "flood", "flood_reconnecting")]
    write(args.out or "control_flood", result, table)
    print(result)


if __name__ == "__main__":
    main()
