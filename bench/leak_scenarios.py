"""Leak reproductions run under a real supervisor until each leaking worker is recycled: what
tests/test_diagnosis_live.py asserts on and bench/diagnosis.py reports.

A group is one supervisor with one worker per model and one client per model sending jobs one
at a time (a TF process costs ~0.5 GB and seconds to start, so the groups are small). Only time
is scaled down (poll interval, heartbeat, warm-up, window); the growth limit is set where a
Keras predict loop (~11 MB per 1k jobs, bench/results/leak_probes.md) crosses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from supervisor.client import Client, JobError
from supervisor.testing import Supervisor

# The window (32 polls: 8 s) outlasts two censuses of a growing worker (~2-5 s apart on 2
# busy cores, worker/probes.py): the census is what tells a Python cache of numpy arrays
# from a native leak. With the defaults (60 polls) a window spans minutes.
# No limit per hour: with time scaled down it measures how fast the jobs run (a worker slowed
# by a busy machine crossed it before its growth per job was confident: recycled for
# growth_per_hour), and the cause is named the same whichever limit is crossed.
POLICY: dict[str, Any] = {"warmup_jobs": 30, "warmup_seconds": "2s", "trend_window": 32,
                          "trend_confirmations": 2, "max_growth_per_1k_jobs": "4MiB",
                          "max_growth_per_hour": None, "min_lifetime": "1s"}
POLL = "0.25s"
HEARTBEAT = "0.25s"  # the tests' (more probe readings per second); the default is 1 s
THREADS = {"intra_op_threads": 1, "inter_op_threads": 1}
HEALTHY_JOBS = 2000  # a healthy worker is judged over at least this many jobs

Inputs = Callable[[np.random.Generator], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the reproduction, in words
    config: dict[str, Any]  # the model's config
    inputs: Inputs
    cause: str | None  # the cause it must be named; None: healthy, never suspected


def rows(name: str, width: int, sizes: tuple[int, int] = (1, 1)) -> Inputs:
    def make(rng: np.random.Generator) -> dict[str, np.ndarray]:
        n = int(rng.integers(sizes[0], sizes[1] + 1))
        return {name: rng.standard_normal((n, width)).astype(np.float32)}
    return make


def lengths(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(0, 1000, (2, int(rng.integers(1, 1000)))).astype(np.int32)}


def model(handler: str | None = None, options: dict[str, Any] | None = None,
          saved_model: Path | None = None, **policy: Any) -> dict[str, Any]:
    source = {"saved_model": str(saved_model)} if saved_model else \
        {"handler": handler, "options": options or {}}
    return {**source, "workers": 1, "tf": THREADS, "policy": {**POLICY, **policy},
            "batching": {"max_batch_size": 1}}


def save_sequence_model(path: Path) -> Path:
    """The XLA-compiled embedding SavedModel (bench/leak_handlers.py), saved by a child
    process so that this one never imports TensorFlow."""
    subprocess.run([sys.executable, "-c", "import sys; from bench.leak_handlers import "
                    "save_embedding_model as s; s(sys.argv[1], jit_compile=True)", str(path)],
                   check=True)
    return path


def tensorflow_cases(sequence_model: Path) -> list[Case]:
    return [
        Case("scalar", "tf.function without input_signature, a changing Python int argument",
             model("worker.tf_handlers:retracing", {"width": 16}), rows("x", 16), "retracing"),
        Case("sizes", "tf.function without input_signature, batch sizes 1 to 3000",
             model("bench.leak_handlers:retrace_shapes"), rows("x", 16, (1, 3000)),
             "retracing"),
        Case("lengths", "SavedModel (XLA-compiled signature), sequence lengths 1 to 1000",
             model(saved_model=sequence_model), lengths, "new_input_shapes"),
        # predict() is slow (a few jobs a second on busy cores) and its first calls ramp:
        # judged after 30 jobs, a window of a dozen jobs showed the ramp, not the per-job
        # objects (a CI run named it native heap retention). 100 jobs is the default. Its
        # objects come and go with the collector between readings: a window of 32 polls
        # (63 jobs on a busy CI machine) once saw them shrink while memory grew (named
        # native heap retention again); 64 polls average over more collections.
        Case("keras", "Keras model.predict() per job",
             model("bench.leak_handlers:keras_predict", warmup_jobs=100, trend_window=64),
             rows("features", 64), "python_objects"),
    ]


def host_cases(demo_saved_model: Path) -> list[Case]:
    return [
        Case("hoard", "handler keeps 2000 small Python objects per job",
             model("bench.leak_handlers:python_hoard", {"objects_per_call": 2000}),
             rows("x", 16), "python_objects"),
        Case("native", "handler mallocs 256 KiB per job through ctypes, never frees",
             model("bench.leak_handlers:native_leak", {"bytes_per_call": 256 * 1024}),
             rows("x", 16), "native_heap"),
        Case("pointers", "the same, keeping each pointer (an int) in a list",
             model("bench.leak_handlers:native_leak",
                   {"bytes_per_call": 256 * 1024, "keep_pointers": True}),
             rows("x", 16), "native_heap"),
        Case("cache", "a dict caching a 32 KiB numpy array per job, never evicted",
             model("bench.leak_handlers:array_cache"), rows("x", 16), "python_objects"),
        Case("healthy", "the demo MLP SavedModel, one row per job",
             model(saved_model=demo_saved_model), rows("features", 64), None),
    ]


def config(cases: list[Case], heartbeat: str = HEARTBEAT) -> dict[str, Any]:
    return {"supervisor": {"poll_interval": POLL, "heartbeat_interval": heartbeat},
            "models": {c.name: c.config for c in cases}}


def drive(sup: Supervisor, case: Case, stop: threading.Event, failures: list[str],
          recycled: set[str]) -> None:
    """Jobs one at a time until ``stop``, or until the case's worker was recycled: its first
    recycle is what is judged, and a replacement leaking on would take the CPU the cases
    still leaking need (a busy machine changes nothing judged, but makes the run longer)."""
    rng = np.random.default_rng()
    with Client(sup.endpoint, timeout=120) as client:
        while not stop.is_set() and case.name not in recycled:
            try:
                client.infer(case.name, case.inputs(rng))
            except JobError as exc:
                failures.append(f"{case.name}: {exc}")


def recycling_events(sup: Supervisor) -> dict[str, dict[str, Any]]:
    """The first worker_recycling event of each model."""
    found: dict[str, dict[str, Any]] = {}
    for line in sup.log().splitlines():
        if '"worker_recycling"' in line:
            event = json.loads(line)
            found.setdefault(event["model"], event)
    return found


def run(sup: Supervisor, cases: list[Case], timeout: float = 400.0,
        ) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[str]]:
    """Drive every case until each leaking one has been recycled and each healthy one has
    been judged over HEALTHY_JOBS; returns the recycling events by model, the last status
    and the failed jobs."""
    stop = threading.Event()
    failures: list[str] = []
    recycled: set[str] = set()  # cases recycled once: no more jobs for them
    threads = [threading.Thread(target=drive, args=(sup, case, stop, failures, recycled))
               for case in cases]
    for t in threads:
        t.start()
    leaking = {c.name for c in cases if c.cause is not None}
    healthy = [c.name for c in cases if c.cause is None]

    def done(status: dict[str, Any]) -> bool:
        recycled.update(recycling_events(sup))
        if not leaking <= recycled:
            return False
        for name in healthy:
            worker = status["models"][name]["workers"][0]
            if worker["growth_per_1k_jobs"] is None or worker["jobs"] < HEALTHY_JOBS:
                return False
        return True

    try:
        status = sup.wait_for(done, timeout, f"recycles of {sorted(leaking)}")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    return recycling_events(sup), status, failures
