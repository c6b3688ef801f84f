"""Benchmarks 3 and 4: the demo MLP under load, against the usual baselines.

3. Throughput: batch-1 requests from 32 concurrent clients (4 client processes of 8
   threads: one process would be held back by its own GIL) for ``--seconds`` each, to
   tfsupervisor with batching, tfsupervisor without, an in-process loop calling the model
   once per request, and gunicorn (sync workers, the same SavedModel, max_requests set).
   Targets: >= 3x gunicorn and >= 3x the loop.
4. Recycle under load: p99 latency and failures in a window around each worker recycle vs
   steady state, tfsupervisor (replacement first, max_jobs) vs gunicorn (max_requests).
   Target: 0 failures and p99 within 1.5x of steady state.

    python -m bench.mlp [--seconds 20] [--recycle-seconds 60] [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import percentiles, write
from supervisor.client import Client
from supervisor.testing import short_tmpdir, start_supervisor

CLIENTS = 32
PROCESSES = 4  # client processes the CLIENTS are spread over
WARM_SECONDS = 2.0  # of load before each measured run: every shape seen, every worker warm
THREADS = {"intra_op_threads": 1, "inter_op_threads": 1}
WORKERS = 2  # per contender (tfsupervisor workers, gunicorn workers)


@dataclass
class Run:
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (wall end, seconds)
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def drive(call: Callable[[np.ndarray], Any], seconds: float, clients: int = CLIENTS) -> Run:
    """``clients`` threads of this process calling ``call`` for ``seconds``."""
    run = Run()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        x = np.random.default_rng().standard_normal((1, 64)).astype(np.float32)
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                call(x)
                ok = True
            except Exception:
                ok = False
            took = time.perf_counter() - start
            with run.lock:
                if ok:
                    run.latencies.append((time.time(), took))
                else:
                    run.failures += 1

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return run


def _client_process(target: tuple[str, Any], seconds: float, threads: int, out: Any) -> None:
    run = drive(caller(target), seconds, threads)
    out.put((run.latencies, run.failures))


def drive_processes(target: tuple[str, Any], seconds: float, clients: int = CLIENTS,
                    processes: int = PROCESSES) -> Run:
    """``clients`` callers spread over ``processes`` forked client processes, each making
    its own client for ``target`` (a tfsupervisor endpoint or a gunicorn port)."""
    context = mp.get_context("fork")  # the bench process never imports TensorFlow
    out = context.Queue()
    procs = [context.Process(target=_client_process,
                             args=(target, seconds, clients // processes, out))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    run = Run()
    for _ in procs:  # read before joining: a child blocks until its results are taken
        latencies, failures = out.get(timeout=seconds + 300)
        run.latencies += latencies
        run.failures += failures
    for proc in procs:
        proc.join(30)
    return run


def caller(target: tuple[str, Any]) -> Callable[[np.ndarray], Any]:
    kind, address = target
    if kind == "tfsupervisor":
        client = Client(address, timeout=60)
        return lambda x: client.infer("mlp", {"features": x})
    return lambda x: http_call(address, x)


def http_call(port: int, x: np.ndarray) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/", body=x.tobytes())
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(response.status)
        return data
    finally:
        conn.close()


def summary(run: Run, seconds: float) -> dict[str, Any]:
    return {"jobs_per_second": round(len(run.latencies) / seconds, 1),
            "failures": run.failures, **percentiles([t for _, t in run.latencies])}


# --- contenders ---------------------------------------------------------------------------

def supervisor_config(model: Path, batching: bool, **policy: Any) -> dict[str, Any]:
    return {"models": {"mlp": {"saved_model": str(model), "workers": WORKERS, "tf": THREADS,
                               "batching": {"max_batch_size": 32 if batching else 1},
                               "policy": policy}}}


def with_supervisor(model: Path, batching: bool, seconds: float,
                    **policy: Any) -> tuple[Run, list[float]]:
    sup = start_supervisor(supervisor_config(model, batching, **policy))
    try:
        sup.wait_ready(timeout=300)
        target = ("tfsupervisor", sup.endpoint)
        drive_processes(target, WARM_SECONDS)
        pids = PidWatch(sup.process.pid)
        with pids:
            run = drive_processes(target, seconds)
        return run, pids.exits
    finally:
        sup.stop()


def in_process_loop(model: Path, seconds: float) -> Run:
    """The naive service: one process, the model called once per request, in order."""
    code = f"""
import time, json, numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
serve = tf.saved_model.load({str(model)!r}).signatures["serving_default"]
x = tf.constant(np.random.default_rng().standard_normal((1, 64)).astype(np.float32))
for _ in range(50):
    serve(features=x)
lat = []
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    s = time.perf_counter()
    serve(features=x)["output_0"].numpy()
    lat.append(time.perf_counter() - s)
print(json.dumps(lat))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    import json

    run = Run()
    run.latencies = [(0.0, t) for t in json.loads(out.stdout.strip().splitlines()[-1])]
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_gunicorn(model: Path, seconds: float, max_requests: int,
                  jitter: int) -> tuple[Run, list[float]]:
    port = free_port()
    gunicorn = Path(sys.executable).parent / "gunicorn"
    proc = subprocess.Popen(
        [str(gunicorn), "--workers", str(WORKERS), "--worker-class", "sync", "--bind",
         f"127.0.0.1:{port}", "--max-requests", str(max_requests), "--max-requests-jitter",
         str(jitter), "--timeout", "120", "--backlog", "2048", "--chdir",
         str(Path(__file__).resolve().parent), "wsgi_mlp:app"],
        env={**os.environ, "MLP_PATH": str(model), "TF_CPP_MIN_LOG_LEVEL": "2",
             "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                http_call(port, np.zeros((1, 64), np.float32))
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        drive_processes(("gunicorn", port), WARM_SECONDS)
        pids = PidWatch(proc.pid)
        with pids:
            run = drive_processes(("gunicorn", port), seconds)
        return run, pids.exits
    finally:
        proc.terminate()
        proc.wait(30)


class PidWatch(threading.Thread):
    """Wall-clock times at which a worker process of ``parent`` exited (a recycle)."""

    def __init__(self, parent: int) -> None:
        super().__init__(daemon=True)
        self.parent = psutil.Process(parent)
        self.exits: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        known = {c.pid for c in self.parent.children()}
        while not self.halt.wait(0.05):
            now = {c.pid for c in self.parent.children()}
            self.exits += [time.time() for _ in known - now]
            known = now

    def __enter__(self) -> PidWatch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(2)


def around(run: Run, exits: list[float], before: float = 10.0,
           after: float = 10.0) -> tuple[list[float], list[float]]:
    """Latencies within [exit - before, exit + after] of a recycle, and all the others."""
    near, steady = [], []
    for end, took in run.latencies:
        close = any(e - before <= end <= e + after for e in exits)
        (near if close else steady).append(took)
    return near, steady


# --- the two benchmarks -------------------------------------------------------------------

def throughput(model: Path, seconds: float, out: Path | None) -> dict[str, Any]:
    rows = {}
    rows["tfsupervisor, batching"] = summary(with_supervisor(model, True, seconds)[0], seconds)
    rows["tfsupervisor, no batching"] = summary(with_supervisor(model, False, seconds)[0],
                                                seconds)
    rows["in-process loop, 1 request per call"] = summary(in_process_loop(model, seconds),
                                                          seconds)
    gunicorn = f"gunicorn sync x{WORKERS}, max_requests 1000"
    rows[gunicorn] = summary(with_gunicorn(model, seconds, 1000, 100)[0], seconds)
    best = rows["tfsupervisor, batching"]["jobs_per_second"]
    result = {"seconds": seconds, "clients": CLIENTS, "results": rows,
              "ratio_vs_gunicorn": round(best / rows[gunicorn]["jobs_per_second"], 2),
              "ratio_vs_loop": round(best / rows["in-process loop, 1 request per call"]
                                     ["jobs_per_second"], 2),
              "targets": {"vs_gunicorn": 3.0, "vs_loop": 3.0}}
    table = [["contender", "jobs/s", "p50 ms", "p99 ms", "failures"]]
    table += [[k, v["jobs_per_second"], v["p50_ms"], v["p99_ms"], v["failures"]]
              for k, v in rows.items()]
    write("mlp_throughput", result, table, out,
          f"Design-brief MLP, batch-1 requests, {CLIENTS} concurrent clients in {PROCESSES} "
          f"client processes (the in-process loop is one sequential caller), {WORKERS} "
          "workers each, "
          "TF 1 thread per op, all on the same cores. "
          f"tfsupervisor with batching: {result['ratio_vs_gunicorn']}x gunicorn, "
          f"{result['ratio_vs_loop']}x the loop (targets 3x).")
    return result


def recycle_under_load(model: Path, seconds: float, out: Path | None) -> dict[str, Any]:
    rows = {}
    run, exits = with_supervisor(model, True, seconds, max_jobs=4000, jitter=0.2)
    rows["tfsupervisor (max_jobs 4000, replacement first)"] = (run, exits)
    run, exits = with_gunicorn(model, seconds, 4000, 800)
    rows["gunicorn (max_requests 4000)"] = (run, exits)
    result: dict[str, Any] = {"seconds": seconds, "clients": CLIENTS, "results": {}}
    table = [["contender", "recycles", "failures", "steady p99 ms", "near-recycle p99 ms",
              "ratio"]]
    for name, (run, exits) in rows.items():
        near, steady = around(run, exits)
        p_near, p_steady = percentiles(near), percentiles(steady)
        ratio = round(p_near["p99_ms"] / p_steady["p99_ms"], 2) if near and steady else None
        result["results"][name] = {"recycles": len(exits), "failures": run.failures,
                                   "steady": p_steady, "near_recycle": p_near,
                                   "p99_ratio": ratio}
        table.append([name, len(exits), run.failures, p_steady["p99_ms"], p_near["p99_ms"],
                      ratio])
    write("recycle_under_load", result, table, out,
          "Latency within 10 s of a worker exit vs the rest. Target: 0 failures and p99 "
          "within 1.5x of steady state.")
    return result


def build_model() -> Path:
    path = short_tmpdir() / "mlp"
    subprocess.run([sys.executable, "-m", "supervisor", "demo-model", str(path)], check=True,
                   capture_output=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--recycle-seconds", type=float, default=90)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("throughput", "recycle"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = build_model()
    if args.only != "recycle":
        print(throughput(model, 2 if args.quick else args.seconds, args.out))
    if args.only != "throughput":
        print(recycle_under_load(model, 4 if args.quick else args.recycle_seconds, args.out))


if __name__ == "__main__":
    main()
