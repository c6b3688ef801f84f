"""Benchmark: a transformer encoder fed token ids of mixed lengths, with and without padding.

One supervisor serves the same encoder SavedModel (random weights; 6 layers, width 256, 4
heads, 30k vocabulary, as a small RoBERTa for CPU inference) twice:

- ``bucketed``: lengths padded to 32/64/128/256/512 with a generated attention mask, every
  bucket warmed at batch sizes 1 and 16 before ready;
- ``unpadded``: no padding configured (the client sends its own mask; one-shape warm-up).

The same jobs (lengths uniform in 5..512, one row each) go to each in turn from 16 client
threads; recycling is off, so memory growth is measured, not bounded. Reported side by side:
jobs/s, mean rows per batch, warm-up seconds, memory at ready and its growth over the jobs.

    python -m bench.bucketing [--jobs 10000] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import threading
import time
from typing import Any

import numpy as np

from bench.common import write
from bench.encoder_model import save_encoder, token_ids
from supervisor.testing import Supervisor, short_tmpdir, start_supervisor

SIZES = [32, 64, 128, 256, 512]
THREADS = 16
MIB = 2**20


def model(path: str, padded: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "saved_model": path, "workers": 1, "tf": {"intra_op_threads": 2, "inter_op_threads": 1},
        "batching": {"max_batch_size": 16, "batch_timeout_ms": 5},
        "policy": {"max_growth_per_1k_jobs": None, "max_growth_per_hour": None}}
    if padded:
        config["padding"] = {"seq": {"inputs": {"input_ids": 1}, "sizes": SIZES,
                                     "mask_input": "attention_mask", "outputs": {"tokens": 1}}}
        config["warmup_batch_sizes"] = [1, 16]
    return config


def worker(sup: Supervisor, name: str) -> dict[str, Any]:
    workers: list[dict[str, Any]] = sup.status()["models"][name]["workers"]
    return workers[0]


def run(sup: Supervisor, name: str, lengths: list[int], checkpoints: int) -> dict[str, Any]:
    """Serve every job; memory read every len/checkpoints jobs."""
    jobs = iter(enumerate(lengths))
    lock = threading.Lock()
    done = [0]
    failures: list[str] = []

    def client() -> None:
        with sup.client(timeout=120) as c:
            while True:
                with lock:
                    item = next(jobs, None)
                if item is None:
                    return
                i, n = item
                ids = token_ids(n, seed=i, vocab=30_000)
                inputs = {"input_ids": ids}
                if name == "unpadded":
                    inputs["attention_mask"] = np.ones(ids.shape, np.int32)
                try:
                    c.infer(name, inputs)
                except Exception as exc:  # counted, not raised: the figure says so
                    failures.append(str(exc))
                with lock:
                    done[0] += 1

    before = sup.status()["models"][name]["batches"]
    ready = worker(sup, name)["rss"]
    curve = []
    threads = [threading.Thread(target=client) for _ in range(THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    step = max(1, len(lengths) // checkpoints)
    mark = step
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if done[0] >= mark:
            curve.append((done[0], worker(sup, name)["rss"]))
            mark += step
    elapsed = time.perf_counter() - started
    after = sup.status()["models"][name]
    sent = after["batches"]["sent"] - before["sent"]
    rows = after["batches"]["sent"] * (after["batches"]["mean_rows"] or 0) - \
        before["sent"] * (before["mean_rows"] or 0)
    final = worker(sup, name)["rss"]
    return {"jobs": len(lengths), "failures": len(failures), "seconds": round(elapsed, 1),
            "jobs_per_s": round(len(lengths) / elapsed, 1),
            "mean_rows_per_batch": round(rows / sent, 2) if sent else None,
            "ready_mib": round(ready / MIB), "final_mib": round(final / MIB),
            "growth_mib": round((final - ready) / MIB),
            "curve_mib": [(n, round(r / MIB)) for n, r in curve]}


def warmup_seconds(sup: Supervisor, name: str) -> float | None:
    import json
    for line in sup.log().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "worker_ready" and event.get("model") == name:
                return float(event["warmup_seconds"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    jobs = 600 if args.quick else args.jobs
    shape = {"layers": 2, "width": 64, "heads": 4} if args.quick else \
        {"layers": 6, "width": 256, "heads": 4}
    work = short_tmpdir()
    save_encoder(work / "encoder", vocab=30_000, max_length=512, **shape)
    sup = start_supervisor({"models": {"bucketed": model(str(work / "encoder"), True),
                                       "unpadded": model(str(work / "encoder"), False)}})
    try:
        sup.wait_ready(timeout=600)
        lengths = [int(n) for n in np.random.default_rng(0).integers(5, 513, jobs)]
        results = {}
        for name in ("unpadded", "bucketed"):
            results[name] = {**run(sup, name, lengths, checkpoints=5),
                             "warmup_seconds": warmup_seconds(sup, name)}
            print(name, results[name], flush=True)
    finally:
        sup.stop()
        shutil.rmtree(work, ignore_errors=True)
    u, b = results["unpadded"], results["bucketed"]
    table = [["", "unpadded (today)", "bucketed", "ratio"],
             ["jobs/s", u["jobs_per_s"], b["jobs_per_s"],
              f"{b['jobs_per_s'] / u['jobs_per_s']:.2f}x"],
             ["mean rows per batch", u["mean_rows_per_batch"], b["mean_rows_per_batch"], ""],
             ["warm-up before ready (s)", u["warmup_seconds"], b["warmup_seconds"], ""],
             ["memory at ready (MiB)", u["ready_mib"], b["ready_mib"], ""],
             [f"memory growth over {jobs:,} jobs (MiB)", u["growth_mib"], b["growth_mib"], ""],
             ["memory along the run (jobs, MiB)", _curve(u), _curve(b), ""],
             ["failed jobs", u["failures"], b["failures"], ""]]
    notes = (f"Encoder {shape}, vocabulary 30k; lengths uniform in 5..512, one row per job, "
             f"{THREADS} client threads, max_batch_size 16, batch_timeout_ms 5, intra-op "
             "threads 2; recycling off. Both models share one supervisor and run one after "
             "the other. Outputs of the bucketed model are checked exact against unpadded "
             "in-process inference in tests/test_padding_live.py.")
    write("bucketing", {"results": results, "jobs": jobs, "encoder": shape}, table, notes=notes)


def _curve(r: dict[str, Any]) -> str:
    return ", ".join(f"{n:,}: {m}" for n, m in itertools.islice(r["curve_mib"], 6))


if __name__ == "__main__":
    main()
