"""Leak bound: the TF retracing leak under load, with and without tfsupervisor's policy.

One supervisor serves the same leaking handler twice: ``bounded`` under a growth policy and
``unbounded`` with every limit off (what a plain long-running process does). Client threads
keep both busy; every worker's RSS is sampled from outside. Writes the samples and peaks as
JSON and the memory-over-time plot as PNG.

    python bench/leak_bound.py --seconds 240 --out bench/results
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import write
from supervisor.client import Client, JobError
from supervisor.testing import start_supervisor

MB = 1024**2
WIDTH = 32


def config(quick: bool) -> dict[str, Any]:
    handler = {"handler": "worker.tf_handlers:retracing", "options": {"width": WIDTH},
               "workers": 1, "tf": {"intra_op_threads": 1, "inter_op_threads": 1},
               "batching": {"max_batch_size": 1}}  # one call per job: the leak is per call
    # This leak is fast (MB per second): a worker lives well under the default min_lifetime
    # of 2 minutes, which would rightly call the policy too tight after two recycles.
    bounded = {"warmup_jobs": 50 if quick else 100, "warmup_seconds": "2s" if quick else "10s",
               "trend_window": 20 if quick else 40, "min_lifetime": "10s"}
    off = {"max_growth_per_1k_jobs": None, "max_growth_per_hour": None}
    return {"supervisor": {"poll_interval": "0.5s"}, "models": {
        "bounded": {**handler, "policy": bounded},
        "unbounded": {**handler, "policy": off}}}


def load(endpoint: str, model: str, stop: threading.Event, stats: dict[str, int]) -> None:
    rng = np.random.default_rng()
    with Client(endpoint, timeout=120) as client:
        while not stop.is_set():
            x = rng.standard_normal((int(rng.integers(1, 9)), WIDTH)).astype(np.float32)
            try:
                client.infer(model, {"x": x})
                stats["ok"] += 1
            except JobError:
                stats["failed"] += 1


def sample(sup: Any, start: float) -> list[dict[str, Any]]:
    rows = []
    for model, info in sup.status()["models"].items():
        for worker in info["workers"]:
            try:
                rss = psutil.Process(worker["pid"]).memory_info().rss
            except psutil.Error:
                continue
            rows.append({"t": round(time.monotonic() - start, 2), "model": model,
                         "worker": worker["id"], "rss": rss, "state": worker["state"],
                         "jobs": worker["jobs"]})
    return rows


def run(seconds: float, out: Path, quick: bool) -> dict[str, Any]:
    sup = start_supervisor(config(quick))
    sup.wait_ready(timeout=180)
    stop = threading.Event()
    stats = {m: {"ok": 0, "failed": 0} for m in ("bounded", "unbounded")}
    threads = [threading.Thread(target=load, args=(sup.endpoint, m, stop, stats[m]))
               for m in stats for _ in range(2)]
    samples, recycles, _ = sampled_under_load(sup, threads, stop, seconds, "bounded")
    result = summarise(samples, stats, recycles, seconds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "leak_bound_samples.json").write_text(json.dumps(samples))
    plot(samples, result, out / "leak_bound.png")
    write("leak_bound", result, [
        ["retracing leak, 1 worker", "start RSS MiB", "peak RSS MiB", "growth MiB", "jobs",
         "failed", "recycles"],
        *[[name, result["start_rss_mb"][key], result["peak_rss_mb"][key],
           result["growth_mb"][key], stats[key]["ok"], stats[key]["failed"],
           sum(recycles.values()) if key == "bounded" else 0]
          for name, key in (("with tfsupervisor", "bounded"), ("without", "unbounded"))]],
        out, f"{seconds:g} s under load, 2 client threads each; plot: leak_bound.png.")
    return result


def sampled_under_load(sup: Any, threads: list[threading.Thread], stop: threading.Event,
                       seconds: float, model: str
                       ) -> tuple[list[dict[str, Any]], dict[str, int], float]:
    """Run the client ``threads`` for ``seconds`` while every worker's RSS is read each half
    second; then stop them and the supervisor. Returns the samples, ``model``'s recycles by
    reason, and when the load started (time.monotonic)."""
    start = time.monotonic()
    for t in threads:
        t.start()
    samples: list[dict[str, Any]] = []
    try:
        while time.monotonic() - start < seconds:
            samples.extend(sample(sup, start))
            time.sleep(0.5)  # the sampling period
        recycles: dict[str, int] = sup.status()["models"][model]["recycles"]
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        sup.stop()
    return samples, recycles, start


def summarise(samples: list[dict[str, Any]], stats: dict[str, dict[str, int]],
              recycles: dict[str, int], seconds: float) -> dict[str, Any]:
    def peak(model: str) -> int:
        return max((s["rss"] for s in samples if s["model"] == model), default=0)

    first = {m: next((s["rss"] for s in samples if s["model"] == m), 0)
             for m in ("bounded", "unbounded")}
    return {"seconds": seconds, "jobs": stats, "recycles": recycles,
            "start_rss_mb": {m: round(v / MB, 1) for m, v in first.items()},
            "peak_rss_mb": {m: round(peak(m) / MB, 1) for m in first},
            "growth_mb": {m: round((peak(m) - first[m]) / MB, 1) for m in first}}


def plot(samples: list[dict[str, Any]], result: dict[str, Any], path: Path) -> None:
    draw_memory(samples, {"unbounded": ("tab:red", "without (same leak, no recycling)"),
                          "bounded": ("tab:blue", "with tfsupervisor (growth policy, "
                                      "replacement first)")},
                "TF retracing leak (tf.function without input_signature), 1 worker each", path)


def draw_memory(samples: list[dict[str, Any]], models: dict[str, tuple[str, str]], title: str,
                path: Path, marks: Sequence[float] = ()) -> None:
    """Each model's workers' RSS over time (``models``: colour and label by model), with
    vertical lines at ``marks`` (recycles), saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for model, (colour, label) in models.items():
        workers = list(dict.fromkeys(s["worker"] for s in samples if s["model"] == model))
        for i, worker in enumerate(workers):
            pts = [(s["t"], s["rss"] / MB) for s in samples if s["worker"] == worker]
            ax.plot(*zip(*pts, strict=True), color=colour, lw=1.6,
                    label=label if i == 0 else None)
    for i, t in enumerate(marks):
        ax.axvline(t, color="grey", ls=":", lw=1, label="recycle" if i == 0 else None)
    ax.set_xlabel("seconds under load")
    ax.set_ylabel("worker RSS (MiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="short warm-up and window")
    args = parser.parse_args()
    result = run(args.seconds, args.out, args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
