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
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import percentiles, write
from bench.harness.load import CLIENTS, PROCESSES, Tally
from bench.harness.scripts import LOAD
from bench.harness.server import start_process
from bench.harness.transport import Http, Inputs, Zmq, raw_codec
from bench.harness.workload import Workload
from supervisor.testing import free_port, short_tmpdir, start_supervisor

FEATURES = 64
WARM_SECONDS = 2.0  # of load before each measured run: every shape seen, every worker warm
THREADS = {"intra_op_threads": 1, "inter_op_threads": 1}
WORKERS = 2  # per contender (tfsupervisor workers, gunicorn workers)

# --- the workload: one row of 64 float32 features per request (bench/peers.py too) --------

# The peers' script head: the loader, and how a batch of bodies is computed.
LOAD_MODEL = LOAD + '''

def forward_raw(call, rows):
    """A batch of raw request bodies (float32 rows) in, raw answers (float32) out."""
    x = np.frombuffer(b"".join(rows), np.float32).reshape(len(rows), -1)
    return [row.tobytes() for row in call(x)]


def from_json(request):
    return np.asarray(request["features"], np.float32)


def predict_rows(call, rows):
    return call(np.stack(rows))


def to_json(output):
    return {"probability": float(output[0])}
'''


def requests(seed: int) -> Iterator[Inputs]:
    """One client's requests: the same random row, again and again."""
    x = np.random.default_rng(seed).standard_normal((1, FEATURES)).astype(np.float32)
    return itertools.repeat({"features": x})


def check(values: np.ndarray) -> None:
    if values.size != 1:
        raise RuntimeError(f"an answer of {values.size} values, not one probability")


def supervisor_config(model: Path, batching: bool, **policy: Any) -> dict[str, Any]:
    return {"models": {"mlp": {"saved_model": str(model), "workers": WORKERS, "tf": THREADS,
                               "batching": {"max_batch_size": 32 if batching else 1},
                               "policy": policy}}}


def peers_config(model: Path, wait_ms: float, adaptive: bool) -> dict[str, Any]:
    """Batching as above, with the peers' batch wait or (adaptive) none set; the product's
    poll interval (start_supervisor's 0.2 s, for tests, polls and scans the workers' process
    trees five times as often)."""
    out = supervisor_config(model, batching=True)
    out["supervisor"] = {"poll_interval": "1s"}
    if not adaptive:
        out["models"]["mlp"]["batching"]["batch_timeout_ms"] = wait_ms
    return out


MLP = Workload("mlp", "output_0", requests, check,
               {"features": np.zeros((1, FEATURES), np.float32)}, LOAD_MODEL, peers_config,
               json_in="features", json_out="probability")


def summary(run: Tally, seconds: float) -> dict[str, Any]:
    return {"jobs_per_second": round(len(run.latencies) / seconds, 1),
            "failures": run.failures, **percentiles(run.latencies)}


# --- contenders ---------------------------------------------------------------------------

def with_supervisor(model: Path, batching: bool, seconds: float,
                    **policy: Any) -> tuple[Tally, list[float]]:
    sup = start_supervisor(supervisor_config(model, batching, **policy))
    try:
        sup.wait_ready(timeout=300)
        load = MLP.load(Zmq(sup.endpoint, "mlp", "output_0"))
        load.closed(WARM_SECONDS)
        pids = PidWatch(sup.process.pid)
        with pids:
            run = load.closed(seconds, seed=1)
        return run, pids.exits
    finally:
        sup.stop()


def in_process_loop(model: Path, seconds: float) -> Tally:
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

    return Tally(latencies=json.loads(out.stdout.strip().splitlines()[-1]))


def with_gunicorn(model: Path, seconds: float, max_requests: int,
                  jitter: int) -> tuple[Tally, list[float]]:
    """bench/wsgi_mlp.py behind gunicorn sync workers, reached with the peers' HTTP client
    (raw float32 bodies; sync workers close the connection after each answer)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), "--workers", str(WORKERS),
               "--worker-class", "sync", "--bind", f"127.0.0.1:{port}", "--max-requests",
               str(max_requests), "--max-requests-jitter", str(jitter), "--timeout", "120",
               "--backlog", "2048", "--chdir", str(Path(__file__).resolve().parent),
               "wsgi_mlp:app"]
    env = {**os.environ, "MLP_PATH": str(model), "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    server, proc = start_process("gunicorn", command, short_tmpdir(), env,
                                 Http(port, "/", raw_codec()))
    with server:
        server.wait_answering(MLP.probe, check, proc.poll)
        load = MLP.load(server.transport)
        load.closed(WARM_SECONDS)
        pids = PidWatch(proc.pid)
        with pids:
            run = load.closed(seconds, seed=1)
        return run, pids.exits


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


def around(run: Tally, exits: list[float], before: float = 10.0,
           after: float = 10.0) -> tuple[list[float], list[float]]:
    """Latencies within [exit - before, exit + after] of a recycle, and all the others."""
    near, steady = [], []
    for end, took in zip(run.ends, run.latencies, strict=True):
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
