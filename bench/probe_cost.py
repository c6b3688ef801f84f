"""Benchmark: what the leak probes (worker/probes.py) cost per job.

The worker's own work per job, in one process, with probes on and off side by side: the
JOB message decoded, run through run_batch, its RESULTS encoded and signed, and with probes
on, the runner wrapped by the ProbeRecorder and its between-batch sampling called after each
batch, as worker/main.py does, at the default heartbeat interval. Sockets are left out, so
a job here is cheaper than a served one and the probes' share an upper bound. Blocks of
probes off and on alternate, so that drift on a busy machine falls on both alike.

Two models: the demo MLP SavedModel (models/demo, batches of one row) and the echo handler
(the cheapest job there is). Target: probes cost under 1 % of a job's time.

    python -m bench.probe_cost [--seconds 2] [--rounds 6] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import write
from supervisor.protocol import (
    INTERNAL_HOP,
    JOB,
    Message,
    decode,
    encode,
    pack_arrays,
    pack_results,
    signed,
)
from worker.batch import run_batch
from worker.probes import ProbeRecorder
from worker.runners import Runner, load

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "demo"
SECRET = "0123456789abcdef" * 2
INTERVAL = 1.0  # supervisor.heartbeat_interval's default


def job_frames(inputs: dict[str, np.ndarray]) -> list[Any]:
    specs, frames = pack_arrays(inputs)
    return encode(Message(JOB, b"", {"jobs": [{"id": "1", "inputs": specs}], "pad_to": 0},
                          frames))


def serve_one(runner: Runner, frames: list[Any]) -> None:
    """The serving loop's CPU work for one JOB message, sockets aside."""
    replies = run_batch(runner, decode(frames, INTERNAL_HOP))
    encode(signed(pack_results(replies), SECRET))


def block(step: Callable[[], None], seconds: float) -> tuple[int, float]:
    jobs = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            step()
        jobs += 20
    return jobs, time.perf_counter() - start


def measure(name: str, runner: Runner, inputs: dict[str, np.ndarray], seconds: float,
            rounds: int) -> dict[str, Any]:
    frames = job_frames(inputs)
    recorder = ProbeRecorder(INTERVAL, time.monotonic())
    probed = recorder.wrap(runner)

    def off() -> None:
        serve_one(runner, frames)

    def on() -> None:
        serve_one(probed, frames)
        recorder.between(time.monotonic())

    for _ in range(200):  # warm up both paths
        off()
        on()
    cost_before = recorder.cost
    per_job: dict[str, list[float]] = {"off": [], "on": []}
    totals = {"off": [0, 0.0], "on": [0, 0.0]}
    on_jobs = 0
    for i in range(rounds):
        # Alternate which goes first, so neither always runs on a warmer machine.
        for label in (("off", "on") if i % 2 == 0 else ("on", "off")):
            jobs, took = block(off if label == "off" else on, seconds)
            per_job[label].append(took / jobs * 1e6)
            totals[label][0] += jobs
            totals[label][1] += took
            on_jobs += jobs if label == "on" else 0
    recorder.close()
    off_us = statistics.median(per_job["off"])
    on_us = statistics.median(per_job["on"])
    own = (recorder.cost - cost_before) / on_jobs * 1e6
    snapshot = recorder.latest
    start = time.perf_counter()
    for _ in range(100):
        snapshot.to_wire()
    wire_us = (time.perf_counter() - start) / 100 * 1e6
    return {"model": name, "jobs_off": totals["off"][0], "jobs_on": totals["on"][0],
            "jobs_per_second_off": round(totals["off"][0] / totals["off"][1]),
            "jobs_per_second_on": round(totals["on"][0] / totals["on"][1]),
            "us_per_job_off": round(off_us, 2), "us_per_job_on": round(on_us, 2),
            "overhead_percent": round((on_us - off_us) / off_us * 100, 2),
            "own_cost_us_per_job": round(own, 3),
            "own_cost_percent": round(own / off_us * 100, 3),
            "census_seconds": round(recorder.census.took, 4),
            "heartbeat_to_wire_us": round(wire_us, 1),
            "graphs": snapshot.graphs, "py_blocks": snapshot.py_blocks}


def run(seconds: float, rounds: int, out: Path | None = None, demo: bool = True) -> dict[str, Any]:
    results = []
    echo = load("handler", "worker.handlers:echo", "serving_default",
                {"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}})
    results.append(measure("echo handler", echo, {"x": np.ones((1, 4), np.float32)},
                           seconds, rounds))
    if demo:
        if not (DEMO / "saved_model.pb").exists():
            from worker import demo_model

            demo_model.save(str(DEMO))
        mlp = load("saved_model", str(DEMO), "serving_default", {})
        features = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        results.append(measure("demo MLP SavedModel", mlp, {"features": features},
                               seconds, rounds))
    result = {"seconds_per_block": seconds, "rounds": rounds, "heartbeat_interval": INTERVAL,
              "results": results, "target_percent": 1.0}
    write("probe_cost", result, [
        ["model", "jobs/s off", "jobs/s on", "µs/job off", "µs/job on", "overhead",
         "probes' own cost", "target"],
        *[[r["model"], r["jobs_per_second_off"], r["jobs_per_second_on"], r["us_per_job_off"],
           r["us_per_job_on"], f"{r['overhead_percent']} %",
           f"{r['own_cost_us_per_job']} µs ({r['own_cost_percent']} %)", "< 1 %"]
          for r in results]], out,
        "One process, the worker's CPU work per job (decode, run_batch, encode; no sockets), "
        f"batches of one row, heartbeat interval {INTERVAL:g} s; medians of {rounds} "
        f"alternating blocks of {seconds:g} s each. 'Own cost' is the probes' cost_seconds "
        "over the jobs (per-batch RSS reads and signature accounting, plus sampling); "
        "'overhead' is the difference of the two medians, which machine noise can swamp.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(run(0.3 if args.quick else args.seconds, 2 if args.quick else args.rounds, args.out))


if __name__ == "__main__":
    main()
