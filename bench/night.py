"""A night in minutes: a leaking text service, unsupervised and under tfsupervisor.

One supervisor serves the same leaking handler twice (``bench.leak_handlers:eager_text``:
the demo text encoder per request through a ``tf.function`` that takes each request's
length as a Python argument, so every new length traces a graph TensorFlow keeps):

- ``unsupervised``: every limit off, as a plain long-running service process runs;
- ``supervised``: the default policy with ``max_memory`` (``--max-memory``): recycled,
  replacement first, before the limit.

One worker each, batches of one (the service called the model per request), the same client
threads on each, lengths as bench.text_peers draws them (log-normal, median 28, 4..256: rare
long lengths keep bringing new shapes). Every half second each worker's RSS is read from
outside. Written: night.json / night.md (memory at start and peak, jobs, failures, recycles,
throughput lost: supervised jobs/s over the 10 s windows holding a recycle against the
others) and night.png (memory over time, recycles marked).

    python -m bench.night [--seconds 420] [--max-memory 900MiB] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, write
from bench.leak_bound import draw_memory, sampled_under_load
from bench.text_peers import VOCAB, lengths
from supervisor.client import Client, JobError
from supervisor.testing import short_tmpdir, start_supervisor

MIB = 2**20
THREADS = 2  # client threads per model
WINDOW = 10.0  # seconds per throughput window


def config(model: Path, max_memory: str) -> dict[str, Any]:
    handler = {"handler": "bench.leak_handlers:eager_text", "options": {"model": str(model)},
               "workers": 1, "tf": {"intra_op_threads": 1, "inter_op_threads": 1},
               "batching": {"max_batch_size": 1}}
    off = {"max_growth_per_1k_jobs": None, "max_growth_per_hour": None}
    return {"supervisor": {"poll_interval": "1s"}, "models": {
        "supervised": {**handler, "policy": {"max_memory": max_memory}},
        "unsupervised": {**handler, "policy": off}}}


def load(endpoint: str, model: str, stop: threading.Event, counts: dict[str, Any],
         seed: int) -> None:
    rng = np.random.default_rng(seed)
    with Client(endpoint, timeout=120) as client:
        while not stop.is_set():
            for n in lengths(100, int(rng.integers(1 << 30))):
                if stop.is_set():
                    return
                ids = rng.integers(1, VOCAB, (1, int(n))).astype(np.int32)
                try:
                    client.infer(model, {"input_ids": ids})
                    counts["done"].append(time.monotonic())
                except JobError as exc:
                    counts["failed"].append(str(exc)[:200])


def run(seconds: float, max_memory: str, out: Path) -> dict[str, Any]:
    work = short_tmpdir()
    model = work / "text_model"
    subprocess.run([sys.executable, "-m", "worker.demo_text", str(model)], check=True)
    sup = start_supervisor(config(model, max_memory))
    sup.wait_ready(timeout=300)
    stop = threading.Event()
    counts: dict[str, dict[str, Any]] = {m: {"done": [], "failed": []}
                                         for m in ("supervised", "unsupervised")}
    threads = [threading.Thread(target=load, args=(sup.endpoint, m, stop, counts[m], i))
               for i, m in enumerate(m for m in counts for _ in range(THREADS))]
    samples, recycles, start = sampled_under_load(sup, threads, stop, seconds, "supervised")
    result = summarise(samples, counts, recycles, start, seconds, max_memory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "night_samples.json").write_text(json.dumps(samples))
    plot(samples, result, out / "night.png")
    rows = [[name, result["start_mib"][name], result["peak_mib"][name],
             result["end_mib"][name], result["jobs"][name], result["failed"][name],
             result["recycles"] if name == "supervised" else 0]
            for name in ("unsupervised", "supervised")]
    write("night", result, [["model", "start MiB", "peak MiB", "end MiB", "jobs", "failed",
                             "recycles"], *rows], out,
          f"{seconds:g} s, {THREADS} client threads each, max_memory {max_memory} on the "
          f"supervised one; throughput lost to recycling: {result['throughput_lost_pct']} % "
          "(supervised jobs/s in the 10 s windows holding a recycle against the others); "
          "plot: night.png.")
    return result


def recycle_times(samples: list[dict[str, Any]], model: str) -> list[float]:
    """When each of the model's workers was last seen, but the last one: its recycles."""
    last: dict[str, float] = {}
    for s in samples:
        if s["model"] == model:
            last[s["worker"]] = s["t"]
    return sorted(last.values())[:-1]


def summarise(samples: list[dict[str, Any]], counts: dict[str, dict[str, Any]],
              recycles: dict[str, int], start: float, seconds: float,
              max_memory: str) -> dict[str, Any]:
    def rss(model: str) -> list[float]:
        return [s["rss"] / MIB for s in samples if s["model"] == model]

    models = ("unsupervised", "supervised")
    marks = recycle_times(samples, "supervised")
    done = np.array(counts["supervised"]["done"]) - start
    windows = np.histogram(done, bins=np.arange(0, seconds + WINDOW, WINDOW))[0] / WINDOW
    holding = {int(t // WINDOW) for t in marks}
    calm = [w for i, w in enumerate(windows) if i not in holding]
    hit = [w for i, w in enumerate(windows) if i in holding]
    lost = round(100 * (1 - np.mean(hit) / np.mean(calm)), 1) if hit and calm and \
        np.mean(calm) > 0 else None
    return {"seconds": seconds, "max_memory": max_memory,
            "start_mib": {m: round(rss(m)[0]) if rss(m) else None for m in models},
            "peak_mib": {m: round(max(rss(m), default=0)) for m in models},
            "end_mib": {m: round(rss(m)[-1]) if rss(m) else None for m in models},
            "jobs": {m: len(counts[m]["done"]) for m in models},
            "failed": {m: len(counts[m]["failed"]) for m in models},
            "failures_seen": sorted({f for m in models for f in counts[m]["failed"]})[:5],
            "recycles": sum(recycles.values()), "recycle_reasons": recycles,
            "recycled_at_s": marks, "throughput_lost_pct": lost}


def plot(samples: list[dict[str, Any]], result: dict[str, Any], path: Path) -> None:
    draw_memory(samples, {
        "unsupervised": ("tab:red", "without (the same service, no recycling)"),
        "supervised": ("tab:blue", f"with tfsupervisor (max_memory {result['max_memory']})")},
        "A text service: a graph per new length, one worker each", path,
        result["recycled_at_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=420)
    parser.add_argument("--max-memory", default="900MiB")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    print(json.dumps(run(args.seconds, args.max_memory, args.out), indent=2))


if __name__ == "__main__":
    main()
