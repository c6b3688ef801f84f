"""The HTTP and gRPC fronts on real TensorFlow workers: the demo MLP (SavedModel) and the
demo text encoder (token ids of any length, padded and batched), called with the real
tritonclient (HTTP binary and JSON, gRPC), TF Serving-style requests and curl-style JSON;
every answer equal to the ZeroMQ client's for the same input."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
import yaml

from supervisor.client import Client
from supervisor.testing import Supervisor, short_tmpdir, start_supervisor
from tests.test_health import free_port
from tests.test_http_front import request, wait_http_ready

pytestmark = pytest.mark.tf

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "text.yaml"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Supervisor, int]]:
    path = short_tmpdir()
    for args in (["demo-model", str(path / "demo")],
                 ["demo-model", "--text", str(path / "text")],
                 ["demo-model", str(path / "versioned" / "1")]):
        subprocess.run([sys.executable, "-m", "supervisor", *args], check=True,
                       capture_output=True)
    text = yaml.safe_load(EXAMPLE.read_text())["models"]["text"]
    port, grpc_port = free_port(), free_port()
    sup = start_supervisor({
        "supervisor": {"http": {"listen": f"127.0.0.1:{port}", "processes": 1},
                       "grpc": {"listen": f"127.0.0.1:{grpc_port}"}},
        "models": {"demo": {"saved_model": str(path / "demo"), "workers": 1},
                   "text": {**text, "saved_model": str(path / "text"), "workers": 1},
                   "versioned": {"saved_model": str(path / "versioned"), "workers": 1}}})
    try:
        sup.wait_ready(300)
        wait_http_ready(port)
        sup.models_path = path  # type: ignore[attr-defined]
        sup.grpc_port = grpc_port  # type: ignore[attr-defined]
        yield sup, port
    finally:
        sup.stop()


def test_demo_mlp_over_tritonclient_binary_and_json(served: tuple[Supervisor, int]) -> None:
    sup, port = served
    x = np.random.default_rng(3).random((5, 64), dtype=np.float32)
    with Client(sup.endpoint, timeout=30) as zmq_client:
        expected = zmq_client.infer("demo", {"features": x})["output_0"]
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    meta = client.get_model_metadata("demo")
    assert meta["platform"] == "tensorflow_savedmodel"
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 64]}]
    for binary in (True, False):
        features = triton.InferInput("features", [5, 64], "FP32")
        features.set_data_from_numpy(x, binary_data=binary)
        out = triton.InferRequestedOutput("output_0", binary_data=binary)
        got = client.infer("demo", [features], outputs=[out]).as_numpy("output_0")
        np.testing.assert_array_equal(got, expected)


def test_demo_mlp_as_tf_serving_and_curl_call_it(served: tuple[Supervisor, int]) -> None:
    sup, port = served
    x = np.random.default_rng(4).random((2, 64), dtype=np.float32)
    with Client(sup.endpoint, timeout=30) as zmq_client:
        expected = zmq_client.infer("demo", {"features": x})["output_0"]
    status, _, raw = request(port, "POST", "/v1/models/demo:predict",
                             {"instances": x.tolist()})
    assert status == 200, raw
    np.testing.assert_allclose(json.loads(raw)["predictions"], expected, rtol=1e-6)
    status, _, raw = request(port, "POST", "/v2/models/demo/infer", {"inputs": [
        {"name": "features", "shape": [2, 64], "datatype": "FP32", "data": x.tolist()}]})
    assert status == 200, raw
    np.testing.assert_allclose(np.array(json.loads(raw)["outputs"][0]["data"]).reshape(2, 1),
                               expected, rtol=1e-6)


def test_text_encoder_variable_lengths_over_http_equal_zeromq(
        served: tuple[Supervisor, int]) -> None:
    """Lengths across the padding sizes, sent at once from several threads so they share
    batches: each answer is the ZeroMQ client's for the same ids."""
    sup, port = served
    rng = np.random.default_rng(5)
    jobs = [rng.integers(1, 1000, (1, int(n))).astype(np.int32)
            for n in rng.integers(1, 250, 24)]
    with Client(sup.endpoint, timeout=60) as zmq_client:
        expected = [zmq_client.infer("text", {"input_ids": ids}) for ids in jobs]
    got: dict[int, dict[str, np.ndarray]] = {}

    def call(i: int) -> None:  # over HTTP (binary), or over gRPC for odd i
        if i % 2 == 0:
            client = triton.InferenceServerClient(f"127.0.0.1:{port}")
            ids = triton.InferInput("input_ids", list(jobs[i].shape), "INT32")
            ids.set_data_from_numpy(jobs[i])
            result = client.infer("text", [ids])
            got[i] = {o["name"]: result.as_numpy(o["name"])
                      for o in result.get_response()["outputs"]}
            return
        rpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{sup.grpc_port}")  # type: ignore
        ids = triton_grpc.InferInput("input_ids", list(jobs[i].shape), "INT32")
        ids.set_data_from_numpy(jobs[i])
        answer = rpc.infer("text", [ids])
        got[i] = {o.name: answer.as_numpy(o.name) for o in answer.get_response().outputs}

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(len(jobs)))
    for i, want in enumerate(expected):
        assert set(got[i]) == set(want)
        for name in want:
            np.testing.assert_allclose(got[i][name], want[name], rtol=1e-5, atol=1e-6)


def test_demo_mlp_over_grpc_equals_zeromq(served: tuple[Supervisor, int]) -> None:
    sup, _ = served
    x = np.random.default_rng(8).random((3, 64), dtype=np.float32)
    with Client(sup.endpoint, timeout=30) as zmq_client:
        expected = zmq_client.infer("demo", {"features": x})["output_0"]
    rpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{sup.grpc_port}")  # type: ignore
    assert rpc.get_model_metadata("demo").platform == "tensorflow_savedmodel"
    features = triton_grpc.InferInput("features", [3, 64], "FP32")
    features.set_data_from_numpy(x)
    np.testing.assert_array_equal(rpc.infer("demo", [features]).as_numpy("output_0"),
                                  expected)


def test_text_model_metadata_names_the_variable_length(served: tuple[Supervisor, int]) -> None:
    _, port = served
    meta: dict[str, Any] = json.loads(request(port, "GET", "/v2/models/text")[2])
    assert meta["inputs"] == [{"name": "input_ids", "datatype": "INT32", "shape": [-1, -1]}]


def test_tf_serving_layout_serves_the_highest_version_and_rolls_onto_a_new_one(
        served: tuple[Supervisor, int]) -> None:
    """A model path of numeric version directories: the highest is served and named in
    both APIs; a new version directory rolls the workers onto it, serving throughout."""
    sup, port = served
    x = np.random.default_rng(6).random((2, 64), dtype=np.float32)

    def version_status() -> list[dict[str, Any]]:
        doc: dict[str, Any] = json.loads(request(port, "GET", "/v1/models/versioned")[2])
        return list(doc["model_version_status"])

    def predict() -> list[Any]:
        status, _, raw = request(port, "POST", "/v1/models/versioned:predict",
                                 {"instances": x.tolist()})
        assert status == 200, raw
        return list(json.loads(raw)["predictions"])

    assert version_status()[0]["version"] == "1"
    assert json.loads(request(port, "GET", "/v2/models/versioned")[2])["versions"] == ["1"]
    first = predict()
    root = sup.models_path / "versioned"  # type: ignore[attr-defined]
    staging = root.parent / "staging"
    subprocess.run([sys.executable, "-c", "import sys; from worker import demo_model; "
                    "demo_model.save(sys.argv[1], seed=99)", str(staging)], check=True,
                   capture_output=True)
    staging.rename(root / "2")  # appears whole, as a deployment should make it appear
    deadline = time.monotonic() + 120
    while version_status()[0]["version"] != "2" and time.monotonic() < deadline:
        predict()  # served throughout the roll (it asserts 200)
        time.sleep(0.2)
    assert version_status()[0] == {"version": "2", "state": "AVAILABLE",
                                   "status": {"error_code": "OK", "error_message": ""}}
    assert predict() != first
    assert request(port, "GET", "/v2/models/versioned/versions/2")[0] == 200
