"""The seed's own leak (issue 46, item 3), under a real supervisor: a SavedModel whose
``tf.function`` has no input_signature, saved without signatures, called per request as
``model.f(tf.constant(ids, name="Input-Token"))`` with lengths 1..400 in random order, as the
text service the project exists for does. Loaded, ``model.f`` is TensorFlow's
``restored_function_body``: every new length traces a new graph of it, kept for the life of
the process.

``python -m bench.seed_leak [seconds] [max_memory]`` runs 2 workers with the default policy
(or ``max_memory`` set), 2 clients, and prints the recycles (age, cause, traced counts) and
`explain`'s text: the before/after figures of docs/diagnosis.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from supervisor.client import Client, JobError
from supervisor.client.client import control
from supervisor.client.testing import Supervisor, short_tmpdir, start_supervisor
from supervisor.shared.protocol import TensorSpec

MAX_LENGTH = 400
VOCAB = 1000
WIDTH = 64


def save_seed_model(path: str | Path, width: int = WIDTH, layers: int = 2) -> None:
    """A small encoder saved as the seed saved its own: ``f`` a tf.function with no
    input_signature (traced once on [None, None] so that the loaded one takes any length),
    ``tf.saved_model.save`` with no signatures."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    rng = np.random.default_rng(0)

    def weight(*shape: int) -> Any:
        return tf.Variable(rng.normal(0.0, 1.0 / np.sqrt(shape[0]), shape).astype(np.float32))

    class Seed(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = weight(VOCAB, width)
            self.layers = [(weight(width, 4 * width), weight(4 * width, width))
                           for _ in range(layers)]

        @tf.function  # type: ignore[untyped-decorator]  # no input_signature: the seed's
        def f(self, ids: Any) -> Any:
            h = tf.gather(self.embed, ids)
            for up, down in self.layers:
                h = h + tf.nn.gelu(h @ up) @ down
                scores = tf.nn.softmax(tf.matmul(h, h, transpose_b=True), axis=-1)
                h = h + scores @ h
            return tf.reduce_mean(h, axis=1)

    module = Seed()
    module.f.get_concrete_function(tf.TensorSpec([None, None], tf.int32))
    tf.saved_model.save(module, str(path))  # no signatures


class SeedHandler:
    """The seed's request path: ``model.f(tf.constant(ids, name="Input-Token"))``."""

    def __init__(self, options: dict[str, Any]) -> None:
        import tensorflow as tf

        self.tf = tf
        self.model = tf.saved_model.load(options["model"])
        self.inputs = [TensorSpec("input_ids", "int32", (None, None))]
        self.outputs = None

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = self.tf.constant(inputs["input_ids"], name="Input-Token")
        return {"pooled": self.model.f(ids).numpy()}


def seed_handler(options: dict[str, Any]) -> SeedHandler:
    return SeedHandler(options)


def save_in_child(path: Path) -> Path:
    """Saved by a child process, so that the caller never imports TensorFlow."""
    subprocess.run([sys.executable, "-c", "import sys; from bench.seed_leak import "
                    "save_seed_model as s; s(sys.argv[1])", str(path)], check=True)
    return path


def model_config(path: Path, workers: int = 2, **policy: Any) -> dict[str, Any]:
    """``workers`` of the seed's handler, one job per batch (the seed served per request)."""
    return {"handler": "bench.seed_leak:seed_handler", "options": {"model": str(path)},
            "workers": workers, "tf": {"intra_op_threads": 1, "inter_op_threads": 1},
            "batching": {"max_batch_size": 1}, "policy": policy}


def drive(sup: Supervisor, model: str, stop: threading.Event, failures: list[str],
          seed: int, jobs: list[int]) -> None:
    """Jobs one at a time, each of a length 1..MAX_LENGTH drawn at random."""
    rng = np.random.default_rng(seed)
    with Client(sup.endpoint, timeout=120) as client:
        while not stop.is_set():
            length = int(rng.integers(1, MAX_LENGTH + 1))
            try:
                client.infer(model, {"input_ids": rng.integers(1, VOCAB, (1, length))
                                     .astype(np.int32)})
                jobs[0] += 1
            except JobError as exc:
                failures.append(str(exc))


def recycles(sup: Supervisor) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sup.log().splitlines()
            if '"worker_recycling"' in line]


def main(seconds: float, max_memory: str | None) -> None:
    from supervisor.cli.render import render_explain

    path = save_in_child(short_tmpdir() / "seed_sm")
    policy: dict[str, Any] = {"max_memory": max_memory} if max_memory else {}
    sup = start_supervisor({"supervisor": {"poll_interval": "1s"},
                            "models": {"seed": model_config(path, 2, **policy)}})
    try:
        sup.wait_ready(180)
        stop, jobs = threading.Event(), [0]
        failures: list[str] = []
        threads = [threading.Thread(target=drive, args=(sup, "seed", stop, failures, i, jobs))
                   for i in range(2)]
        start = time.monotonic()
        for t in threads:
            t.start()
        while time.monotonic() - start < seconds:
            time.sleep(5)
            workers = sup.workers("seed")
            print(f"{time.monotonic() - start:5.0f}s jobs {jobs[0]}: " + "; ".join(
                f"{w['id']} {w['state']} {(w['memory'] or 0) >> 20}MiB base "
                f"{(w['baseline'] or 0) >> 20} cause {w['suspected_cause']}" for w in workers),
                flush=True)
        report = control(sup.control_endpoint, "explain", timeout=10, model="seed")
        stop.set()
        for t in threads:
            t.join(60)
        print(f"jobs {jobs[0]}, failures {len(failures)}")
        for e in recycles(sup):
            traced = e.get("evidence", {}).get("traced")
            print(f"recycle {e['worker']} {e['reason']} age {e['age_seconds']}s "
                  f"memory {e['memory'] >> 20}MiB cause {e.get('cause')} traced {traced}\n"
                  f"  summary: {e.get('summary')}\n  remedy: {e.get('remedy')}")
        print(render_explain(report))
    finally:
        sup.stop()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 90.0,
         sys.argv[2] if len(sys.argv) > 2 else None)
