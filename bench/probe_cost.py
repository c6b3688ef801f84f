"""Benchmark: what the leak probes (worker/probes.py) cost per job.

The worker's own work per job, in one process, with probes on and off side by side: the
JOB message decoded, run through run_batch, its RESULTS encoded and signed, and with probes
on, the runner wrapped by the ProbeRecorder and its between-batch sampling called after each
batch, as worker/main.py does, at the default heartbeat interval. Sockets are left out, so
a job here is cheaper than a served one and the probes' share an upper bound. Small groups
of jobs with probes off and on alternate, so that drift on a busy machine falls on both.

Two models: the demo MLP SavedModel (models/demo, batches of one row) and the echo handler
(the cheapest job there is). Target: probes cost under 1 % of a job's time. Two identical
runs (probes off twice) are measured as well, to show the noise the comparison carries.

    python -m bench.probe_cost [--seconds 20] [--quick]
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
from supervisor.shared.protocol import (
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
from worker.probes import ProbeRecorder, Sources
from worker.runners import Runner, load

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "demo"
SECRET = "0123456789abcdef" * 2
INTERVAL = 1.0  # supervisor.heartbeat_interval's default
GROUP_SECONDS = 0.005  # jobs run back to back before switching to the next kind


def job_frames(inputs: dict[str, np.ndarray]) -> list[Any]:
    specs, frames = pack_arrays(inputs)
    return encode(Message(JOB, b"", {"jobs": [{"id": "1", "inputs": specs}], "pad_to": 0},
                          frames))


def serve_one(runner: Runner, frames: list[Any]) -> None:
    """The serving loop's CPU work for one JOB message, sockets aside."""
    replies = run_batch(runner, decode(frames, INTERNAL_HOP))
    encode(signed(pack_results(replies), SECRET))


def group_size(step: Callable[[], None]) -> int:
    """Jobs in about GROUP_SECONDS."""
    start = time.perf_counter()
    for _ in range(10):
        step()
    return max(1, round(GROUP_SECONDS / ((time.perf_counter() - start) / 10)))


def trimmed_mean(values: list[float]) -> float:
    """The mean of the middle 80 %: a group that a neighbour process interrupted is out."""
    ordered = sorted(values)
    cut = len(ordered) // 10
    return statistics.mean(ordered[cut:len(ordered) - cut] or ordered)


def measure(name: str, runner: Runner, inputs: dict[str, np.ndarray],
            seconds: float) -> dict[str, Any]:
    frames = job_frames(inputs)
    # The recorder's clock stops while the other kinds run: it budgets and samples by the
    # time it sees pass, which in a worker is all its own.
    paused = [0.0]

    def clock() -> float:
        return time.perf_counter() - paused[0]

    sources = Sources.process()
    sources.clock = clock
    recorder = ProbeRecorder(INTERVAL, clock(), sources)
    probed = recorder.wrap(runner)

    def off() -> None:
        serve_one(runner, frames)

    def on() -> None:
        serve_one(probed, frames)
        recorder.between(clock())

    for _ in range(200):  # warm up both paths
        off()
        on()
    size = group_size(off)
    cost_before, batch_before = recorder.cost, recorder.batch_cost
    # "again" is probes off a second time: how far two identical runs differ here (A/A).
    steps = {"off": off, "on": on, "again": off}
    per_job: dict[str, list[float]] = {label: [] for label in steps}
    jobs = dict.fromkeys(steps, 0)
    elapsed = dict.fromkeys(steps, 0.0)
    deadline = time.perf_counter() + seconds * len(steps)
    i = 0
    while time.perf_counter() < deadline:
        # Small groups, in rotating order: drift and neighbours fall on all three alike.
        for label in list(steps)[i % 3:] + list(steps)[:i % 3]:
            step = steps[label]
            start = time.perf_counter()
            for _ in range(size):
                step()
            took = time.perf_counter() - start
            if label != "on":
                paused[0] += took
            per_job[label].append(took / size * 1e6)
            jobs[label] += size
            elapsed[label] += took
        i += 1
    recorder.close()
    off_us, on_us, again_us = (trimmed_mean(per_job[label]) for label in steps)
    own = (recorder.cost - cost_before) / jobs["on"] * 1e6
    around = (recorder.batch_cost - batch_before) / jobs["on"] * 1e6
    snapshot = recorder.latest
    start = time.perf_counter()
    for _ in range(100):
        snapshot.to_wire()
    wire_us = (time.perf_counter() - start) / 100 * 1e6
    return {"model": name, "jobs_per_group": size, "groups": i,
            "jobs_off": jobs["off"], "jobs_on": jobs["on"],
            "jobs_per_second_off": round(jobs["off"] / elapsed["off"]),
            "jobs_per_second_on": round(jobs["on"] / elapsed["on"]),
            "us_per_job_off": round(off_us, 2), "us_per_job_on": round(on_us, 2),
            "overhead_percent": round((on_us - off_us) / off_us * 100, 2),
            "noise_percent": round((again_us - off_us) / off_us * 100, 2),
            "own_cost_us_per_job": round(own, 3),
            "own_cost_percent": round(own / off_us * 100, 3),
            "around_batches_us_per_job": round(around, 3),
            "sampling_us_per_job": round(own - around, 3),
            "census_seconds": round(recorder.census.took, 4),
            "heartbeat_to_wire_us": round(wire_us, 1),
            "graphs": snapshot.graphs, "py_blocks": snapshot.py_blocks}


def run(seconds: float, out: Path | None = None, demo: bool = True) -> dict[str, Any]:
    """``seconds``: of each of off, on and off again, per model."""
    results = []
    echo = load("handler", "worker.handlers:echo", "serving_default",
                {"inputs": {"x": {"dtype": "float32", "shape": [None, 4]}}})
    results.append(measure("echo handler", echo, {"x": np.ones((1, 4), np.float32)}, seconds))
    if demo:
        if not (DEMO / "saved_model.pb").exists():
            from worker import demo_model

            demo_model.save(str(DEMO))
        mlp = load("saved_model", str(DEMO), "serving_default", {})
        features = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        results.append(measure("demo MLP SavedModel", mlp, {"features": features}, seconds))
    result = {"seconds_each": seconds, "heartbeat_interval": INTERVAL,
              "group_seconds": GROUP_SECONDS, "results": results, "target_percent": 1.0}
    write("probe_cost", result, [
        ["model", "jobs/s off", "jobs/s on", "µs/job off", "µs/job on", "on vs off",
         "off vs off (noise)", "probes' own cost", "target"],
        *[[r["model"], r["jobs_per_second_off"], r["jobs_per_second_on"], r["us_per_job_off"],
           r["us_per_job_on"], f"{r['overhead_percent']} %", f"{r['noise_percent']} %",
           f"{r['own_cost_us_per_job']} µs ({r['own_cost_percent']} %)", "< 1 %"]
          for r in results]], out,
        "One process, the worker's CPU work per job (decode, run_batch, encode; no sockets), "
        f"batches of one row, heartbeat interval {INTERVAL:g} s, TF's default threads; "
        f"{seconds:g} s of each of off, on and off again, in groups of ~{GROUP_SECONDS * 1e3:g} "
        "ms in rotating order, trimmed means. 'Own cost' is the probes' cost_seconds over "
        "the jobs: what they time themselves (RSS reads and counting around batches, "
        "samples and censuses between them). 'On vs off' is what the jobs took longer, "
        "measured; 'off vs off' the same for two identical runs, the noise it carries. The "
        "recorder's clock stops while the other kinds run, so that it budgets as in a "
        "worker.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="of each kind, per model")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(run(1.0 if args.quick else args.seconds, args.out))


if __name__ == "__main__":
    main()
