"""The gRPC front (the Open Inference Protocol's GRPCInferenceService and grpc.health.v1)
on a real daemon and real front processes, called with the real tritonclient.grpc: health,
metadata, raw and typed tensors, every status code, many calls in flight on one channel,
the fronts killed and drained. TF-free (tests/test_http_tf.py serves the real models)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from supervisor.config.loading import parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.front.proto import health_pb2
from supervisor.testing import Supervisor, free_port, start_supervisor
from tests.conftest import echo_model

PROTO = Path(__file__).resolve().parent.parent / "supervisor" / "front" / "proto"
ECHO_INPUTS = {"x": {"dtype": "float32", "shape": [None, 4]},
               "s": {"dtype": "string", "shape": [None]}}


@pytest.fixture(scope="module")
def sup() -> Iterator[Supervisor]:
    port, metrics_port = free_port(), free_port()
    sup = start_supervisor({
        "supervisor": {"grpc": {"listen": f"127.0.0.1:{port}"},
                       "metrics": f"127.0.0.1:{metrics_port}"},
        "models": {"echo": echo_model(1, inputs=ECHO_INPUTS, sleep_on=7.0, sleep_seconds=0.5),
                   "any": {"handler": "tests.live_handlers:undeclared", "workers": 1},
                   "broken": {"handler": "tests.live_handlers:big_error", "workers": 1,
                              "options": {"size": 100}}}})
    try:
        sup.wait_ready()
        sup.port = port  # type: ignore[attr-defined]
        sup.metrics_port = metrics_port  # type: ignore[attr-defined]
        wait_ready(port)
        yield sup
    finally:
        sup.stop()


def wait_ready(port: int, timeout: float = 30.0) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.is_server_ready():
                return
        except InferenceServerException:
            pass
        time.sleep(0.05)
    raise AssertionError("the gRPC front never said ready")


def client_of(sup: Supervisor) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{sup.port}")  # type: ignore[attr-defined]


def tensor(name: str, value: np.ndarray, datatype: str) -> triton.InferInput:
    item = triton.InferInput(name, list(value.shape), datatype)
    item.set_data_from_numpy(value)
    return item


def test_our_proto_is_the_protocols_field_for_field() -> None:
    """Every message of our .proto, compiled apart (never registered beside tritonclient's),
    has the fields of the same message in tritonclient's compiled descriptors: same
    numbers, names, types and labels."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"tfs-proto-{os.getpid()}.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}",
                    f"--descriptor_set_out={out}", "inference.proto"], check=True)
    ours = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    out.unlink()
    theirs = service_pb2.DESCRIPTOR

    def compare(message: Any, prefix: str) -> int:
        found = theirs.message_types_by_name.get(prefix) if "." not in prefix else None
        descriptor = found or theirs.pool.FindMessageTypeByName(f"inference.{prefix}")
        for field in message.field:
            other = descriptor.fields_by_number[field.number]
            repeated = field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
            assert (other.name, other.type, other.is_repeated) == (
                field.name, field.type, repeated), (prefix, field.name)
        return 1 + sum(compare(nested, f"{prefix}.{nested.name}")
                       for nested in message.nested_type if not nested.options.map_entry)

    # every message compared: 14 at the top, 4 nested
    assert sum(compare(message, message.name) for message in ours.message_type) == 18
    names = {m.name for m in ours.service[0].method}
    assert names <= {m.name for m in theirs.services_by_name[
        "GRPCInferenceService"].methods}


def test_health_metadata_and_infer_raw_and_typed(sup: Supervisor) -> None:
    client = client_of(sup)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo") and not client.is_model_ready("nope")
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    meta = client.get_model_metadata("echo")
    assert {t.name: (t.datatype, list(t.shape)) for t in meta.inputs} == {
        "x": ("FP32", [-1, 4]), "s": ("BYTES", [-1])}
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = np.array([b"a", b"", "\u00e9".encode()], dtype=object)
    result = client.infer("echo", [tensor("x", x, "FP32"), tensor("s", s, "BYTES")],
                          request_id="g-1")
    np.testing.assert_array_equal(result.as_numpy("x"), x)
    assert list(result.as_numpy("s")) == list(s)
    assert result.get_response().id == "g-1"
    # typed contents instead of raw, and one output chosen
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
        [1, 2, 3, 4])
    request.inputs.add(name="s", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"t")
    request.outputs.add(name="x")
    response = client._client_stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["x"]
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(("datatype", "values"), [
    ("BOOL", [True, False]), ("INT8", [-128, 127]), ("INT16", [-3, 4]), ("INT32", [1, -2]),
    ("INT64", [2**62, -(2**62)]), ("UINT8", [0, 255]), ("UINT16", [65535, 1]),
    ("UINT32", [2**32 - 1, 0]), ("UINT64", [2**64 - 1, 5]), ("FP16", [0.5, -2.0]),
    ("FP32", [1.5, -0.25]), ("FP64", [1e300, -1e-300])])
def test_every_datatype_round_trips(sup: Supervisor, datatype: str, values: list[Any]) -> None:
    from tritonclient.utils import triton_to_np_dtype

    value = np.array(values, dtype=triton_to_np_dtype(datatype))
    got = client_of(sup).infer("any", [tensor("v", value, datatype)]).as_numpy("v")
    assert got.dtype == value.dtype and got.tolist() == value.tolist()


def status_of(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as raised:
        call()
    assert "Traceback" not in str(raised.value)
    return str(raised.value.status()), str(raised.value.message())


def test_every_status_code(sup: Supervisor) -> None:
    client = client_of(sup)
    x = np.zeros((1, 4), np.float32)
    s = np.array([b"a"], dtype=object)
    assert status_of(lambda: client.infer("nope", [tensor("x", x, "FP32")]))[0] == \
        "StatusCode.NOT_FOUND"
    code, message = status_of(lambda: client.infer("echo", [
        tensor("x", x.astype(np.float64), "FP64"), tensor("s", s, "BYTES")]))
    assert code == "StatusCode.INVALID_ARGUMENT" and "float32" in message
    code, message = status_of(lambda: client.infer("broken", [
        tensor("x", np.ones((1, 4), np.float32), "FP32")]))
    assert code == "StatusCode.INTERNAL" and "xxx" in message
    slow = [tensor("x", np.full((1, 4), 7.0, np.float32), "FP32"), tensor("s", s, "BYTES")]
    code, message = status_of(lambda: client.infer("echo", slow, client_timeout=0.1))
    assert code == "StatusCode.DEADLINE_EXCEEDED"
    # UNAVAILABLE (draining) and RESOURCE_EXHAUSTED (queue full): the test below


def test_many_calls_in_flight_on_one_channel(sup: Supervisor) -> None:
    client = client_of(sup)
    done: dict[int, Any] = {}
    finished = threading.Event()
    total = 40

    def callback(i: int) -> Any:
        def got(result: Any, error: Any) -> None:
            done[i] = error or result.as_numpy("x")
            if len(done) == total:
                finished.set()
        return got

    for i in range(total):
        x = np.full((1, 4), float(i), np.float32)
        client.async_infer("any", [tensor("x", x, "FP32")], callback(i))
    assert finished.wait(60)
    assert all(isinstance(done[i], np.ndarray) and done[i][0, 0] == i for i in range(total))


def test_large_messages_pass_the_grpc_default_limit(sup: Supervisor) -> None:
    big = np.random.default_rng(0).random((3, 1024 * 512), dtype=np.float32)  # 6 MiB
    got = client_of(sup).infer("any", [tensor("x", big, "FP32")]).as_numpy("x")
    np.testing.assert_array_equal(got, big)


def test_grpc_health_protocol(sup: Supervisor) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{sup.port}") as channel:  # type: ignore[attr-defined]
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert check(health_pb2.HealthCheckRequest()).status == serving
        assert check(health_pb2.HealthCheckRequest(service="echo")).status == serving
        with pytest.raises(grpc.RpcError) as raised:
            check(health_pb2.HealthCheckRequest(service="nope"))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_listening_rules(tmp_path: Path) -> None:
    models = "models: {m: {handler: 'worker.handlers:echo'}}\n"
    for grpc_section, words in (("{listen: '0.0.0.0:9'}", "supervisor.grpc.insecure"),
                                ("{listen: '127.0.0.1:9', tls_cert: c.pem}", "both tls_cert"),
                                ("{listen: 'x'}", "HOST:PORT")):
        with pytest.raises(ConfigErrors, match=words):
            parse_config(f"supervisor: {{grpc: {grpc_section}}}\n{models}", tmp_path / "c")
    with pytest.raises(ConfigErrors, match="ports of their own"):
        parse_config("supervisor: {grpc: {listen: '127.0.0.1:9'}, http: {listen: "
                     f"'127.0.0.1:9'}}}}\n{models}", tmp_path / "c")


def test_a_killed_front_is_restarted_and_sigterm_finishes_calls_in_flight() -> None:
    port = free_port()
    sup = start_supervisor({"supervisor": {"grpc": {"listen": f"127.0.0.1:{port}"},
                                           "http": {"processes": 2}, "max_queue": 3},
                            "models": {"echo": echo_model(1, sleep_on=7.0,
                                                          sleep_seconds=1.0)}})
    slow = np.full((1, 4), 7.0, np.float32)
    try:
        sup.wait_ready()
        wait_ready(port)
        codes: list[str] = []

        def call() -> None:
            try:
                client_of_port(port).infer("echo", [tensor("x", slow, "FP32")])
            except InferenceServerException as exc:
                codes.append(str(exc.status()))

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "StatusCode.RESOURCE_EXHAUSTED" in codes  # 3 queued at most
        first = sup.status()["http"]["fronts"][0]["pid"]
        os.kill(first, signal.SIGKILL)
        sup.wait_for(lambda s: s["http"]["fronts"][0]["restarts"] == 1 and
                     s["http"]["fronts"][0]["state"] == "running", 30, "front 0 back")
        wait_ready(port)
        answers: list[Any] = []
        threads = [threading.Thread(target=lambda: answers.append(
            client_of_port(port).infer("echo", [tensor("x", slow, "FP32")]).as_numpy("x")))
            for _ in range(3)]
        for t in threads:
            t.start()
        sup.wait_for(lambda s: s["models"]["echo"]["in_flight"] +
                     s["models"]["echo"]["queued"] == 3, 10, "three calls in")
        sup.process.send_signal(signal.SIGTERM)
        sup.wait_for(lambda s: s["stopping"], 10, "the drain")
        assert status_of(lambda: client_of_port(port).infer(
            "echo", [tensor("x", np.zeros((1, 4), np.float32), "FP32")]))[0] == \
            "StatusCode.UNAVAILABLE"
        for t in threads:
            t.join()
        assert len(answers) == 3 and all(a[0, 0] == 7.0 for a in answers)
        assert sup.process.wait(30) == 0
    finally:
        sup.stop()


def client_of_port(port: int) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(f"127.0.0.1:{port}")


def test_calls_are_counted_on_the_daemons_metrics(sup: Supervisor) -> None:
    import urllib.request

    client_of(sup).infer("any", [tensor("x", np.zeros((1, 4), np.float32), "FP32")])
    with pytest.raises(InferenceServerException):
        client_of(sup).infer("nope", [tensor("x", np.zeros((1, 4), np.float32), "FP32")])
    ok = 'tfsupervisor_http_requests_total{code="200",route="grpc:ModelInfer"}'
    missing = 'tfsupervisor_http_requests_total{code="404",route="grpc:ModelInfer"}'
    url = f"http://127.0.0.1:{sup.metrics_port}/metrics"  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while True:  # the fronts write their tallies every second
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        if (ok in text and missing in text) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert ok in text and missing in text
