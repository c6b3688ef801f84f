"""Padding and bucketing on a real transformer encoder SavedModel (``[None, None]`` token
ids): jobs of mixed lengths batch together, and each gets exactly the outputs the model
gives it unpadded in-process; the same model served without padding, side by side; a model
that padding would change is refused at load with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bench.encoder_model import save_encoder, token_ids
from supervisor.client import BadRequest
from tests.conftest import Supervisor, short_tmpdir, start_supervisor

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow", reason="workers need the tensorflow extra")

SIZES = [8, 16, 32]
JOBS = 96
THREADS = 16
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "text.yaml"


@pytest.fixture(scope="module")
def encoders() -> Iterator[Path]:
    """The test encoders, and the demo text model built through the CLI users run."""
    path = short_tmpdir()
    save_encoder(path / "masked")
    save_encoder(path / "unmasked", masked=False)
    subprocess.run([sys.executable, "-m", "supervisor", "demo-model", "--text",
                    str(path / "demo_text")], check=True)
    yield path


def example_model(encoders: Path) -> dict[str, Any]:
    """examples/text.yaml's model, on the CLI-built demo text model, with one worker."""
    model: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["models"]["text"]
    return {**model, "saved_model": str(encoders / "demo_text"), "workers": 1}


def padded_model(path: Path) -> dict[str, Any]:
    return {"saved_model": str(path), "workers": 1,
            "tf": {"intra_op_threads": 1, "inter_op_threads": 1},
            "batching": {"max_batch_size": 16, "batch_timeout_ms": 20},
            "warmup_batch_sizes": [1, 16],
            "padding": {"seq": {"inputs": {"input_ids": 1}, "sizes": SIZES,
                                "mask_input": "attention_mask", "outputs": {"tokens": 1}}}}


@pytest.fixture(scope="module")
def sup(encoders: Path) -> Iterator[Supervisor]:
    plain = {**padded_model(encoders / "masked"), "padding": {}, "warmup_batch_sizes": [1]}
    sup = start_supervisor({"models": {
        "padded": padded_model(encoders / "masked"),
        "plain": plain,
        "example": example_model(encoders),
        "unmasked": {**padded_model(encoders / "unmasked"), "required": False,
                     "padding": {"seq": {"inputs": {"input_ids": 1}, "sizes": SIZES,
                                         "outputs": {"tokens": 1}}}},
    }})
    try:
        sup.wait_for(lambda s: all(s["models"][m]["workers"] and s["models"][m]["workers"][0][
            "state"] == "ready" for m in ("padded", "plain", "example")), 180,
            "the encoders ready")
        yield sup
    finally:
        sup.stop()


def reference(loaded: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The unpadded answer of ``loaded`` (the masked encoder, loaded in this process)."""
    serve = loaded.signatures["serving_default"]
    out = serve(input_ids=tf.constant(ids), attention_mask=tf.ones(ids.shape, tf.int32))
    return {name: value.numpy() for name, value in out.items()}


def serve_all(sup: Supervisor, model: str, jobs: list[np.ndarray]) -> list[dict[str, Any]]:
    def one(ids: np.ndarray) -> dict[str, Any]:
        inputs = {"input_ids": ids}
        if model == "plain":
            inputs["attention_mask"] = np.ones(ids.shape, np.int32)
        with sup.client() as client:
            return client.infer(model, inputs)

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, jobs))


def batches(sup: Supervisor, model: str) -> tuple[int, float]:
    """Batches sent and the rows they held (from the mean status reports)."""
    sent = sup.status()["models"][model]["batches"]
    return sent["sent"], (sent["mean_rows"] or 0.0) * sent["sent"]


def test_mixed_lengths_batch_together_with_each_job_exact(sup: Supervisor,
                                                          encoders: Path) -> None:
    lengths = np.random.default_rng(5).integers(1, SIZES[-1] + 1, JOBS)
    jobs = [token_ids(int(n), seed=i) for i, n in enumerate(lengths)]
    before = {m: batches(sup, m) for m in ("padded", "plain")}
    results = {m: serve_all(sup, m, jobs) for m in ("padded", "plain")}
    loaded = tf.saved_model.load(str(encoders / "masked"))  # once, not once a job
    for ids, padded, plain in zip(jobs, results["padded"], results["plain"], strict=True):
        want = reference(loaded, ids)
        for got in (padded, plain):
            assert got["tokens"].shape == (1, ids.shape[1], 32)  # cut back to its length
            np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got["tokens"], want["tokens"], rtol=1e-4, atol=1e-5)
    rows_per_batch = {}
    for model in ("padded", "plain"):
        sent, rows = batches(sup, model)
        rows_per_batch[model] = (rows - before[model][1]) / (sent - before[model][0])
    # 32 lengths in 3 buckets: padded jobs find mates; unpadded ones rarely share a length.
    assert rows_per_batch["padded"] > 1.5 * rows_per_batch["plain"], rows_per_batch


def test_a_job_longer_than_the_largest_size_is_refused(sup: Supervisor) -> None:
    with sup.client() as client, pytest.raises(BadRequest, match="more than the largest size"):
        client.infer("padded", {"input_ids": token_ids(SIZES[-1] + 1, seed=0)})
    with sup.client() as client:  # the generated mask is not asked of clients
        inputs = [spec["name"] for spec in client.models()["padded"]["inputs"]]
    assert inputs == ["input_ids"]
    ids = token_ids(5, seed=0)
    with sup.client() as client, pytest.raises(BadRequest, match="generated by the worker "
                                               r"\(padding 'seq'\)"):
        client.infer("padded", {"input_ids": ids, "attention_mask": np.ones_like(ids)})


def test_every_shape_is_warmed_before_ready(sup: Supervisor) -> None:
    events = [json.loads(line) for line in sup.log().splitlines() if line.startswith("{")]
    padded = [e for e in events if e.get("model") == "padded"]
    names = [e["event"] for e in padded]
    assert "warmed_up_shapes" in names and "worker_ready" in names
    assert names.index("warmed_up_shapes") < names.index("worker_ready")
    warmed = next(e for e in padded if e["event"] == "warmed_up_shapes")
    assert warmed["shapes"] == 2 * len(SIZES)  # batch sizes 1 and 16, each at every size


def test_a_model_that_padding_would_change_is_refused_at_load(sup: Supervisor) -> None:
    status = sup.wait_for(lambda s: s["models"]["unmasked"].get("last_error"), 120,
                          "the unmasked encoder's load error")
    error = status["models"]["unmasked"]["last_error"]
    assert "padding 'seq' changes the model's output" in error, error
    assert "mask_input" in error  # and says what to do


def test_the_demo_text_model_serves_with_the_example_padding(sup: Supervisor,
                                                              encoders: Path) -> None:
    """`demo-model --text` and examples/text.yaml: jobs of lengths across every size batch
    together, and each gets the pooled embedding the model gives it alone, unpadded."""
    sizes = yaml.safe_load(EXAMPLE.read_text())["models"]["text"]["padding"]["seq"]["sizes"]
    lengths = [1, 3, sizes[0], sizes[0] + 1, 40, sizes[-2] + 1, sizes[-1], *range(5, 37)]
    jobs = [token_ids(n, seed=i, vocab=8192) for i, n in enumerate(lengths)]
    before = batches(sup, "example")
    results = serve_all(sup, "example", jobs)
    serve = tf.saved_model.load(str(encoders / "demo_text")).signatures["serving_default"]
    for ids, got in zip(jobs, results, strict=True):
        want = serve(input_ids=tf.constant(ids), attention_mask=tf.ones(ids.shape, tf.int32))
        assert set(got) == {"pooled"}
        np.testing.assert_allclose(got["pooled"], want["pooled"].numpy(), rtol=1e-4,
                                   atol=1e-5)
    sent, rows = batches(sup, "example")
    assert rows - before[1] == pytest.approx(len(jobs), abs=0.5) and sent - before[0] < len(jobs)
    with sup.client() as client, pytest.raises(BadRequest, match="more than the largest size"):
        client.infer("example", {"input_ids": token_ids(sizes[-1] + 1, seed=0)})
