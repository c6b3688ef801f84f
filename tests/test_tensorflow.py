"""Real TensorFlow workers serving the demo MLP as a SavedModel and as a .keras file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from supervisor.client import BadRequest
from tests import output_handlers
from tests.conftest import Supervisor, start_supervisor

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow", reason="workers need the tensorflow extra")


@pytest.fixture(scope="module")
def tf_sup(models_dir: Path) -> Iterator[Supervisor]:
    threads = {"intra_op_threads": 1, "inter_op_threads": 1}
    sup = start_supervisor({"models": {
        "sm": {"saved_model": str(models_dir / "demo_sm"), "workers": 2, "tf": threads},
        "kr": {"keras": str(models_dir / "demo.keras"), "workers": 1, "tf": threads},
        "text": {"saved_model": str(models_dir / "text_sm"), "workers": 1, "tf": threads},
        "tfout": {"handler": "tests.output_handlers:tf_noisy", "workers": 1, "tf": threads},
    }})
    try:
        sup.wait_ready(timeout=180)
        yield sup
    finally:
        sup.stop()


def features(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def test_saved_model_matches_in_process_inference(tf_sup: Supervisor, models_dir: Path) -> None:
    loaded = tf.saved_model.load(str(models_dir / "demo_sm"))
    serve = loaded.signatures["serving_default"]
    batch = features(7, seed=1)
    expected = serve(features=tf.constant(batch))["output_0"].numpy()
    with tf_sup.client() as client:
        out = client.infer("sm", {"features": batch})
    assert set(out) == {"output_0"}
    np.testing.assert_allclose(out["output_0"], expected, rtol=1e-5, atol=1e-6)


def test_keras_matches_in_process_inference(tf_sup: Supervisor, models_dir: Path) -> None:
    import keras

    model = keras.models.load_model(models_dir / "demo.keras", compile=False)
    batch = features(5, seed=2)
    expected = model(batch, training=False).numpy()
    with tf_sup.client() as client:
        out = client.infer("kr", {"features": batch})
    assert set(out) == {"probability"}
    np.testing.assert_allclose(out["probability"], expected, rtol=1e-5, atol=1e-6)


def test_specs_known_from_the_model(tf_sup: Supervisor) -> None:
    with tf_sup.client() as client:
        models = client.models()
    assert models["sm"]["inputs"] == [{"name": "features", "dtype": "float32",
                                       "shape": [None, 64]}]
    assert models["kr"]["outputs"] == [{"name": "probability", "dtype": "float32",
                                        "shape": [None, 1]}]


def test_concurrent_clients_spread_over_both_workers(tf_sup: Supervisor,
                                                     models_dir: Path) -> None:
    loaded = tf.saved_model.load(str(models_dir / "demo_sm"))
    serve = loaded.signatures["serving_default"]
    batches = [features(1 + i % 9, seed=100 + i) for i in range(60)]
    expected = [serve(features=tf.constant(b))["output_0"].numpy() for b in batches]
    before = {w["id"]: w["jobs"] for w in tf_sup.workers("sm")}
    client = tf_sup.client()
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda b: client.infer("sm", {"features": b}), batches))
    client.close()
    for out, want in zip(outs, expected, strict=True):
        np.testing.assert_allclose(out["output_0"], want, rtol=1e-5, atol=1e-6)
    after = {w["id"]: w["jobs"] for w in tf_sup.workers("sm")}
    assert all(after[w] > before.get(w, 0) for w in after), (before, after)


def test_wrong_dtype_refused_with_the_expected_spec(tf_sup: Supervisor) -> None:
    with tf_sup.client() as client, pytest.raises(BadRequest) as err:
        client.infer("sm", {"features": np.zeros((2, 64), np.float64)})
    assert "features: float32[None, 64]" in err.value.message


def test_cli_infer_random_and_status_json(tf_sup: Supervisor) -> None:
    cli = [sys.executable, "-m", "supervisor"]
    out = subprocess.run([*cli, "infer", "-c", str(tf_sup.config_path), "sm", "--random",
                          "--batch", "3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "output_0: float32[3, 1]" in out.stdout
    out = subprocess.run([*cli, "status", "-c", str(tf_sup.config_path), "--json"],
                         capture_output=True, text=True, timeout=60)
    report: dict[str, Any] = json.loads(out.stdout)
    workers = report["models"]["sm"]["workers"]
    assert len(workers) == 2
    for worker in workers:
        assert {"id", "pid", "state", "rss", "jobs", "age"} <= set(worker)
        assert worker["rss"] > 100 * 1024**2  # a TF process
    assert report["models"]["sm"]["recycles"] == {}


def test_string_inputs_and_outputs(tf_sup: Supervisor, models_dir: Path) -> None:
    loaded = tf.saved_model.load(str(models_dir / "text_sm"))
    texts = np.array(["héllo wörld", "", "TensorFlow", b"bytes too"], dtype=object)
    expected = loaded.signatures["serving_default"](text=tf.constant(texts))
    with tf_sup.client(timeout=60) as client:
        spec = client.models()["text"]
        assert spec["inputs"] == [{"name": "text", "dtype": "string", "shape": [None]}]
        out = client.infer("text", {"text": texts})
    assert out["length"].tolist() == [11, 0, 10, 9]
    assert out["upper"].tolist() == expected["upper"].numpy().tolist()
    assert out["upper"][2] == b"TENSORFLOW"


def test_string_jobs_batched_together_each_get_their_own_rows(tf_sup: Supervisor) -> None:
    def one(i: int) -> bool:
        words = np.array([f"job{i}-" + "x" * (i % 7) for _ in range(1 + i % 3)], dtype=object)
        with tf_sup.client(timeout=60) as client:
            out = client.infer("text", {"text": words})
        return out["upper"].tolist() == [w.upper().encode() for w in words]

    sent_before = tf_sup.status()["models"]["text"]["batches"]["sent"]
    with ThreadPoolExecutor(12) as pool:
        assert all(pool.map(one, range(120)))
    sent = tf_sup.status()["models"]["text"]["batches"]["sent"] - sent_before
    assert sent < 120  # concurrent string jobs did share batches


def test_numbers_sent_to_a_string_input_are_refused(tf_sup: Supervisor) -> None:
    with tf_sup.client(timeout=30) as client, pytest.raises(BadRequest, match="string"):
        client.infer("text", {"text": np.zeros(3, np.float32)})


def test_tf_output_comes_as_json_events_of_its_worker(tf_sup: Supervisor) -> None:
    """What TensorFlow writes natively to stderr (here a line its print kernel writes at
    load, in a worker that imported TensorFlow) comes as a worker_output event with the
    worker's id and model, and every line of the supervisor's output is a JSON object (raw,
    TF's start-up lines were 40 % of it). The line is the handler's own, not one TensorFlow
    chooses to print on some CPUs only."""
    worker = tf_sup.workers("tfout")[0]["id"]
    deadline = time.monotonic() + 60
    while True:
        text = tf_sup.log()
        events = [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]
        assert all(isinstance(e, dict) for e in events)
        output = [e for e in events if e["event"] == "worker_output"
                  and e["line"] == output_handlers.TF_LINE]
        if output or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [(e["worker"], e["model"]) for e in output] == [(worker, "tfout")], output


def test_signatures_are_served_through_the_direct_call(tf_sup: Supervisor) -> None:
    """Every SavedModel worker proved the direct call at start (worker/direct_call.py) and
    serves through it, so the other tests here check its answers; the Keras one cannot."""
    text = tf_sup.log()  # read after the workers reported ready, which comes after the proof
    events = [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]
    used = {e["worker"] for e in events if e["event"] == "direct_call_used"}
    saved_models = {w["id"] for model in ("sm", "text") for w in tf_sup.workers(model)}
    assert saved_models <= used
    assert not used & {w["id"] for w in tf_sup.workers("kr")}
