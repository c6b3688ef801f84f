"""The HTTP front on real daemons, real front processes and real clients (tritonclient,
http.client, raw sockets): the Open Inference Protocol v2 with Triton's binary extension,
TF Serving's REST API, every error path, and the fronts' supervision. TF-free: the models
are the built-in handlers (tests/test_http_tf.py serves the real models)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
import yaml
from tritonclient.utils import InferenceServerException

from supervisor.shared.exitcodes import DaemonExit
from supervisor.testing import Supervisor, start_supervisor
from tests.conftest import echo_model
from tests.test_health import free_port
from tests.test_http_framing import answers as responses_in

ECHO_INPUTS = {"x": {"dtype": "float32", "shape": [None, 4]},
               "s": {"dtype": "string", "shape": [None]}}


def http_config(port: int, **http: Any) -> dict[str, Any]:
    return {"listen": f"127.0.0.1:{port}", "processes": 2, **http}


@pytest.fixture(scope="module")
def sup() -> Iterator[Supervisor]:
    port, metrics = free_port(), free_port()
    sup = start_supervisor({
        "supervisor": {"http": http_config(port, request_timeout="1s", max_body_size="1MiB"),
                       "max_queue": 4, "metrics": f"127.0.0.1:{metrics}"},
        "models": {
            "echo": echo_model(1, sleep_on=7.0, sleep_seconds=0.5),
            "pair": echo_model(1, inputs=ECHO_INPUTS),
            "any": {"handler": "tests.live_handlers:undeclared", "workers": 1},
        }})
    try:
        sup.wait_ready()
        sup.port = port  # type: ignore[attr-defined]
        sup.metrics_port = metrics  # type: ignore[attr-defined]
        wait_http_ready(port)
        yield sup
    finally:
        sup.stop()


def wait_http_ready(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/v2/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("the HTTP front never said ready")


def request(port: int, method: str, path: str, body: bytes | dict[str, Any] | None = None,
            headers: dict[str, str] | None = None,
            timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, \
            response.read()
    finally:
        conn.close()


def error_of(raw: bytes) -> str:
    doc = json.loads(raw)
    assert set(doc) == {"error"}, doc
    assert "Traceback" not in doc["error"]
    return str(doc["error"])


def infer_json(name: str, shape: list[int], datatype: str, data: Any) -> dict[str, Any]:
    return {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}


# --- Open Inference Protocol with tritonclient ---------------------------------------------


def test_tritonclient_health_metadata_and_binary_infer(sup: Supervisor) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{sup.port}")  # type: ignore[attr-defined]
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("pair") and not client.is_model_ready("nope")
    meta = client.get_model_metadata("pair")
    assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["inputs"]} == {
        "x": ("FP32", [-1, 4]), "s": ("BYTES", [-1])}
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = np.array([b"a", b"", "\u00e9t\u00e9".encode()], dtype=object)
    inputs = [triton.InferInput("x", [3, 4], "FP32"), triton.InferInput("s", [3], "BYTES")]
    inputs[0].set_data_from_numpy(x)  # binary, the client's default
    inputs[1].set_data_from_numpy(s)
    result = client.infer("pair", inputs, request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("x"), x)
    assert list(result.as_numpy("s")) == list(s)
    assert result.get_response()["id"] == "r-1"
    # JSON both ways, and one output of two chosen
    inputs[0].set_data_from_numpy(x, binary_data=False)
    inputs[1].set_data_from_numpy(np.array([b"a", b"b", b"c"], dtype=object),
                                  binary_data=False)
    result = client.infer("pair", inputs, outputs=[
        triton.InferRequestedOutput("x", binary_data=False)])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["x"]
    np.testing.assert_array_equal(result.as_numpy("x"), x)


def test_tritonclient_errors_are_exceptions_with_the_reason(sup: Supervisor) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{sup.port}")  # type: ignore[attr-defined]
    bad = triton.InferInput("x", [2, 4], "FP64")
    bad.set_data_from_numpy(np.zeros((2, 4)))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("echo", [bad])
    assert raised.value.status() == "400"
    assert "float32" in str(raised.value)  # names what the model expects
    with pytest.raises(InferenceServerException) as raised:
        client.infer("nope", [bad])
    assert raised.value.status() == "404"


# --- JSON as curl sends it -----------------------------------------------------------------


@pytest.mark.parametrize(("datatype", "values"), [
    ("BOOL", [True, False]), ("INT8", [-128, 127]), ("INT16", [-3, 4]), ("INT32", [1, -2]),
    ("INT64", [2**62, -(2**62)]), ("UINT8", [0, 255]), ("UINT16", [65535, 1]),
    ("UINT32", [2**32 - 1, 0]), ("UINT64", [2**64 - 1, 5]), ("FP16", [0.5, -2.0]),
    ("FP32", [1.5, -0.25]), ("FP64", [1e300, -1e-300]), ("BYTES", ["ab", "\u00fc"])])
def test_every_datatype_round_trips_as_json(sup: Supervisor, datatype: str,
                                            values: list[Any]) -> None:
    status, _, raw = request(sup.port, "POST", "/v2/models/any/infer",  # type: ignore
                             infer_json("v", [2], datatype, values))
    assert status == 200, raw
    out = json.loads(raw)["outputs"][0]
    assert (out["datatype"], out["shape"], out["data"]) == (datatype, [2], values)


def test_nested_and_flat_data_and_the_versions_form(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    nested = infer_json("x", [2, 4], "FP32", [[1, 2, 3, 4], [5, 6, 7, 8]])
    flat = infer_json("x", [2, 4], "FP32", [1, 2, 3, 4, 5, 6, 7, 8])
    answers = [json.loads(request(port, "POST", path, body)[2])
               for path, body in (("/v2/models/any/infer", nested),
                                  ("/v2/models/any/versions/1/infer", flat))]
    assert answers[0]["outputs"] == answers[1]["outputs"]
    assert answers[0]["outputs"][0]["data"] == [1.0, 2, 3, 4, 5, 6, 7, 8]
    status, _, raw = request(port, "POST", "/v2/models/any/versions/2/infer", flat)
    assert status == 404 and "version" in error_of(raw)


# --- every error path --------------------------------------------------------------------


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{not json", 400, "not JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"inputs": []}, 400, "non-empty list"),
    (infer_json("x", [2, 4], "FP8", [0] * 8), 400, "datatype must be one of"),
    (infer_json("x", [2, 4], "FP32", [0] * 7), 400, "holds 8 elements, data has 7"),
    (infer_json("x", [2, "4"], "FP32", [0] * 8), 400, "shape must be"),
    (infer_json("x", [2, -4], "FP32", [0] * 8), 400, "shape must be"),
    (infer_json("x", [2, 4], "FP32", [[1, 2, 3, 4], [5, 6]]), 400, "regular array"),
    (infer_json("x", [2, 4], "FP32", ["a"] * 8), 400, "must hold numbers"),
    (infer_json("x", [2, 4], "INT32", [0.5] * 8), 400, "must hold integers"),
    (infer_json("x", [2, 4], "UINT8", [300] * 8), 400, "range [0, 255]"),
    (infer_json("x", [2, 4], "BOOL", [1] * 8), 400, "true/false"),
    (infer_json("x", [2, 4], "FP64", [0] * 8), 400, "float32"),  # the daemon's bad_request
    (infer_json("y", [2, 4], "FP32", [0] * 8), 400, "x"),  # names the expected input
    ({**infer_json("x", [1, 4], "FP32", [0] * 4), "parameters": {"timeout": "soon"}}, 400,
     "parameters.timeout"),
    ({**infer_json("x", [1, 4], "FP32", [0] * 4), "parameters": {"timeout": -1}}, 400,
     "parameters.timeout"),
    ({**infer_json("x", [1, 4], "FP32", [0] * 4), "outputs": [{"name": "zz"}]}, 400,
     "no output 'zz'"),
    ({**infer_json("x", [1, 4], "FP32", [0] * 4), "id": ["list"]}, 400, "`id`"),
    ({**infer_json("x", [1, 4], "FP32", [0] * 4), "parameters": {"sequence_id": 3}}, 400,
     "sequence"),
    (infer_json("x", [1, 4], "FP32", [[1, 2], [3, 4]]), 400, "nested data is shaped [2, 2]"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4,
                  "parameters": {"binary_data_size": 16}}]}, 400, "both `data` and"),
    ({**infer_json("x", [1, 4], "FP32", [0] * 4), "parameters": {"timeout": "100"}}, 400,
     'got "100"'),
])
def test_bad_requests_are_answered_in_one_line(sup: Supervisor, body: Any, status: int,
                                               words: str) -> None:
    got, _, raw = request(sup.port, "POST", "/v2/models/echo/infer", body)  # type: ignore
    assert got == status, raw
    assert words in error_of(raw)


def test_binary_framing_errors(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    head = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 16}}]}).encode()
    for extra, header, words in ((b"\0" * 12, str(len(head)), "runs past"),
                                 (b"\0" * 20, str(len(head)), "no input's"),
                                 (b"\0" * 16, "99999", "not a length"),
                                 (b"\0" * 16, "12x", "not a length")):
        status, _, raw = request(port, "POST", "/v2/models/echo/infer", head + extra,
                                 {"Inference-Header-Content-Length": header})
        assert status == 400 and words in error_of(raw), raw
    head = json.dumps({"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]},
        {"name": "s", "shape": [2], "datatype": "BYTES",
         "parameters": {"binary_data_size": 9}}]}).encode()
    body = head + (3).to_bytes(4, "little") + b"abc" + b"\x09\0"  # second length cut short
    status, _, raw = request(port, "POST", "/v2/models/echo/infer", body,
                             {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "BYTES" in error_of(raw)


def test_routes_methods_and_unknown_models(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    for method, path, status in (("GET", "/v2/models/nope", 404),
                                 ("GET", "/v2/models/nope/ready", 404),
                                 ("POST", "/v2/models/nope/infer", 404),
                                 ("GET", "/v2/models/echo/infer", 405),
                                 ("DELETE", "/v2/models/echo/infer", 405),
                                 ("PUT", "/v1/models/echo:predict", 405),
                                 ("GET", "/v1/models/echo/labels/stable", 404),
                                 ("POST", "/v2/health/ready", 405),
                                 ("GET", "/v3/anything", 404),
                                 ("GET", "/v1/models/nope", 404),
                                 ("POST", "/v1/models/echo:classify", 501)):
        got, headers, raw = request(port, method, path, b"{}" if method != "GET" else None)
        assert got == status, (method, path, raw)
        error_of(raw)
        if status == 405:  # says which method the route takes
            assert headers["allow"] in ("GET", "POST")
    got, _, raw = request(port, "POST", "/v2/models/nope/infer",
                          infer_json("x", [1, 4], "FP32", [0] * 4))
    assert "served: any, echo, pair" in error_of(raw)


def test_body_over_the_limit_is_refused_before_it_is_read(sup: Supervisor) -> None:
    with socket.create_connection(("127.0.0.1", sup.port), timeout=5) as conn:  # type: ignore
        conn.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 1073741824\r\n\r\n")  # and never the body
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and b"limit" in answer


def test_a_slow_client_is_cut_off_and_others_are_served(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 50"
                     b"\r\n\r\n{")  # then nothing
        assert request(port, "GET", "/v2/health/live")[0] == 200
        answer = slow.recv(4096)  # request_timeout: 1s
    assert answer.startswith(b"HTTP/1.1 408")


def test_deadline_and_queue_full_statuses(sup: Supervisor) -> None:
    """Six clients keep the one echo worker busy (0.5 s jobs) and its queue (max_queue 4) at
    or near full until both answers are seen: a probe that finds the queue full is refused
    429, one that finds a place waits behind the 0.5 s jobs and passes its 0.1 s deadline,
    504. Blockers sent once drained within a second or two, and on a loaded machine the
    probes could miss the moment the queue was full."""
    port = sup.port  # type: ignore[attr-defined]
    sleepy = {**infer_json("x", [1, 4], "FP32", [7, 0, 0, 0]),
              "parameters": {"timeout": 100_000}}  # 0.1 s, in microseconds
    done = threading.Event()

    def block() -> None:
        while not done.is_set():
            request(port, "POST", "/v2/models/echo/infer",
                    infer_json("x", [1, 4], "FP32", [7, 0, 0, 0]))

    blockers = [threading.Thread(target=block) for _ in range(6)]
    for t in blockers:
        t.start()
    statuses = {}
    deadline = time.monotonic() + 60
    try:
        while not {429, 504} <= set(statuses) and time.monotonic() < deadline:
            status, headers, raw = request(port, "POST", "/v2/models/echo/infer", sleepy)
            statuses[status] = (headers, raw)
    finally:
        done.set()
        for t in blockers:
            t.join()
    assert 429 in statuses and statuses[429][0].get("retry-after") == "1"
    assert "overloaded" in error_of(statuses[429][1])
    # The supervisor's verdict (deadline_exceeded) has a tenth of the 0.1 s to come back; on
    # a loaded machine the front's own wait can end first (no_reply). Both are the same
    # deadline to the client, and 504 is the contract.
    assert 504 in statuses
    assert error_of(statuses[504][1]).split(":")[0] in ("deadline_exceeded", "no_reply")


# --- TF Serving's REST API ---------------------------------------------------------------


def test_tf_serving_status_metadata_and_predict(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    status, _, raw = request(port, "GET", "/v1/models/pair")
    assert status == 200
    assert json.loads(raw)["model_version_status"][0]["state"] == "AVAILABLE"
    sig = json.loads(request(port, "GET", "/v1/models/pair/metadata")[2])
    inputs = sig["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert inputs["x"]["dtype"] == "DT_FLOAT" and inputs["s"]["dtype"] == "DT_STRING"
    rows = {"instances": [{"x": [1, 2, 3, 4], "s": {"b64": base64.b64encode(b"\xff").decode()}},
                          {"x": [5, 6, 7, 8], "s": "plain"}]}
    status, _, raw = request(port, "POST", "/v1/models/pair:predict", rows)
    assert status == 200, raw
    assert json.loads(raw)["predictions"][1] == {"x": [5.0, 6.0, 7.0, 8.0], "s": "plain"}
    columns = {"signature_name": "serving_default",
               "inputs": {"x": [[1, 2, 3, 4]], "s": ["a"]}}
    status, _, raw = request(port, "POST", "/v1/models/pair/versions/1:predict", columns)
    assert json.loads(raw)["outputs"] == {"x": [[1.0, 2.0, 3.0, 4.0]], "s": ["a"]}
    # TF Serving's JSON takes NaN and Infinity, and writes them back
    nan = b'{"instances": [{"x": [NaN, Infinity, -Infinity, 1], "s": "n"}]}'
    status, _, raw = request(port, "POST", "/v1/models/pair:predict", nan)
    assert status == 200 and b"NaN" in raw and b"-Infinity" in raw


@pytest.mark.parametrize(("body", "words"), [
    ({"instances": [{"x": [1, 2, 3, 4]}]}, "expected the inputs"),
    ({"instances": [[1, 2, 3, 4]]}, "each instance must be an object"),
    ({"instances": [], "inputs": {}}, "exactly one of"),
    ({"signature_name": "other", "instances": [{"x": [1, 2, 3, 4], "s": "a"}]},
     "serving_default"),
    ({"instances": [{"x": {"b64": "AAAA"}, "s": "a"}]}, "got an object"),
    ({"instances": [{"x": [1, 2, 3, 4], "s": {"b64": "!!"}}]}, "not base64"),
])
def test_tf_serving_errors(sup: Supervisor, body: dict[str, Any], words: str) -> None:
    status, _, raw = request(sup.port, "POST", "/v1/models/pair:predict", body)  # type: ignore
    assert status == 400 and words in error_of(raw), raw


# --- metrics and status ------------------------------------------------------------------


def test_http_metrics_on_the_daemons_metrics_and_fronts_in_status(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    for _ in range(3):
        assert request(port, "POST", "/v2/models/echo/infer",
                       infer_json("x", [1, 4], "FP32", [0, 0, 0, 0]))[0] == 200
    assert request(port, "GET", "/v2/models/nope")[0] == 404
    infer = 'tfsupervisor_http_requests_total{code="200",route="/v2/models/{model}/infer"}'
    deadline = time.monotonic() + 30
    while True:  # the fronts write their tallies every second
        text = request(sup.metrics_port, "GET", "/metrics")[2].decode()  # type: ignore
        samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                   for line in text.splitlines() if line.startswith("tfsupervisor_http_")}
        if samples.get(infer, 0) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert samples[infer] >= 3
    assert samples['tfsupervisor_http_request_seconds_count{route="/v2/models/{model}/infer"}'] \
        >= 3
    # an error found after routing is counted under its route; "-" is for no route at all
    assert samples['tfsupervisor_http_requests_total{code="404",route="/v2/models/{model}"}'] \
        >= 1
    assert samples["tfsupervisor_http_received_bytes_total"] > 0
    assert 'tfsupervisor_http_request_seconds_bucket{le="+Inf",route="/v2/models/{model}/infer"}' \
        in samples
    assert "tfsupervisor_http_connections" in samples
    status = sup.status()
    assert [f["state"] for f in status["http"]["fronts"]] == ["running", "running"]
    from supervisor.cli.render import render_status
    assert "2 of 2 front(s) running" in render_status(status)


# --- supervision: kills, restarts, drains ------------------------------------------------


def _infer_ok(port: int) -> bool:
    try:
        return request(port, "POST", "/v2/models/echo/infer",
                       infer_json("x", [1, 4], "FP32", [0, 0, 0, 0]), timeout=5)[0] == 200
    except OSError:
        return False


def test_a_killed_front_is_restarted_and_the_others_serve_on(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    before = {f["slot"]: f for f in sup.status()["http"]["fronts"]}
    results: list[bool] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            results.append(_infer_ok(port))

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        os.kill(before[0]["pid"], signal.SIGKILL)
        sup.wait_for(lambda s: s["http"]["fronts"][0]["restarts"] == 1 and
                     s["http"]["fronts"][0]["state"] == "running", 30, "front 0 restarted")
        served_after = len(results)
        deadline = time.monotonic() + 30
        while sum(results[served_after:]) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sum(results[served_after:]) >= 20
    after = sup.status()["http"]["fronts"]
    assert after[1]["pid"] == before[1]["pid"] and after[1]["restarts"] == 0
    assert "signal SIGKILL" in after[0]["last_exit"]
    assert sup.process.poll() is None


def test_sigterm_answers_requests_in_flight_then_stops() -> None:
    port = free_port()
    sup = start_supervisor({
        "supervisor": {"http": http_config(port)},
        "models": {"echo": echo_model(1, sleep_on=7.0, sleep_seconds=1.0)}})
    try:
        sup.wait_ready()
        wait_http_ready(port)
        answers: list[int] = []
        body = infer_json("x", [1, 4], "FP32", [7, 0, 0, 0])
        threads = [threading.Thread(target=lambda: answers.append(
            request(port, "POST", "/v2/models/echo/infer", body)[0])) for _ in range(3)]
        for t in threads:
            t.start()
        sup.wait_for(lambda s: s["models"]["echo"]["in_flight"] +
                     s["models"]["echo"]["queued"] == 3, 10, "three jobs in")
        slow = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=20) as pipelined:
            pipelined.sendall(post_bytes("/v2/models/echo/infer", slow) * 3)
            sup.wait_for(lambda s: s["models"]["echo"]["in_flight"] +
                         s["models"]["echo"]["queued"] >= 4, 10, "the pipelined job in")
            sup.process.send_signal(signal.SIGTERM)
            received = b""
            while chunk := pipelined.recv(65536):  # until the front closes it
                received += chunk
        for t in threads:
            t.join()
        assert answers == [200, 200, 200]
        # all three pipelined requests were read before the drain: all answered, the last
        # closing the connection (the 2nd and 3rd reached the daemon after its drain began:
        # 503 shutting_down, never silence)
        statuses = [status for status, _ in responses_in(received)]
        assert len(statuses) == 3 and statuses[0] == 200, received
        assert set(statuses[1:]) <= {200, 503}
        assert sup.process.wait(30) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        sup.stop()


def test_bearer_token_and_listening_rules(tmp_path: Any) -> None:
    port = free_port()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    sup = start_supervisor({"supervisor": {"http": http_config(port, processes=1,
                                                               token_file=str(token))},
                            "models": {"echo": echo_model(1)}})
    try:
        sup.wait_ready()
        wait_http_ready(port)  # health needs no token
        status, headers, _ = request(port, "GET", "/v2/models/echo")
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert request(port, "GET", "/v2/models/echo",
                       headers={"Authorization": "Bearer wrong"})[0] == 401
        assert request(port, "GET", "/v2/models/echo",
                       headers={"Authorization": "Bearer s3cret"})[0] == 200
    finally:
        sup.stop()


def test_fronts_reach_a_daemon_whose_frontend_speaks_curve(tmp_path: Any) -> None:
    """Under supervisor.curve the fronts get a key pair of their own at each start, which
    the daemon admits beside the configured clients, and which a reload keeps."""
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "supervisor", "keygen", str(keys)], check=True,
                   capture_output=True)
    port = free_port()
    sup = start_supervisor({"supervisor": {
        "http": http_config(port, processes=1),
        "curve": {"server_secret_key": str(keys / "server.key_secret"),
                  "authorized_clients": str(keys / "authorized_clients")}},
        "models": {"echo": echo_model(1)}})
    try:
        sup.wait_ready()
        wait_http_ready(port)
        assert _infer_ok(port)
        sup.admin("reload")  # raises if refused; the fronts' key stays admitted
        assert _infer_ok(port)
        secret = sup.runtime_dir / "private" / "front.key_secret"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    finally:
        sup.stop()


def test_https_beyond_loopback_rules_and_a_real_tls_handshake(tmp_path: Any) -> None:
    """tls_cert and tls_key: the fronts speak HTTPS (a client that trusts the CA is
    served, plain HTTP is not), and `check` refuses a key without its certificate and a
    non-loopback address without TLS or insecure."""
    import ssl

    import trustme

    from supervisor.config.loading import parse_config
    from supervisor.config.settings import ConfigErrors

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    models = "models: {m: {handler: 'worker.handlers:echo'}}\n"
    for section, words in (("{listen: '0.0.0.0:9'}", "without encryption"),
                        ("{listen: '127.0.0.1:9', tls_key: k.pem}", "both tls_cert and tls_key"),
                        ("{listen: 'nowhere'}", "HOST:PORT")):
        with pytest.raises(ConfigErrors, match=words):
            parse_config(f"supervisor: {{http: {section}}}\n{models}", tmp_path / "c.yaml")
    port = free_port()
    pem = str(tmp_path / "server.pem")
    sup = start_supervisor({"supervisor": {"http": http_config(port, processes=1,
                                                               tls_cert=pem, tls_key=pem,
                                                               request_timeout="1s")},
                            "models": {"echo": echo_model(1)}})
    try:
        sup.wait_ready()
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        deadline = time.monotonic() + 30
        while True:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            try:
                conn.request("GET", "/v2/health/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            finally:
                conn.close()
            assert time.monotonic() < deadline, "HTTPS never ready"
            time.sleep(0.05)
        with pytest.raises((OSError, http.client.HTTPException)):
            request(port, "GET", "/v2/health/ready", timeout=3)  # plain HTTP on a TLS port
        with socket.create_connection(("127.0.0.1", port), timeout=30) as silent:
            started = time.monotonic()
            assert silent.recv(1) == b""  # no handshake: closed at request_timeout (1 s)
            assert time.monotonic() - started < 20
    finally:
        sup.stop()


def raw_exchange(port: int, data: bytes, answers: int, timeout: float = 10.0) -> list[bytes]:
    """Send bytes on one connection; read until ``answers`` responses (or the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        got, buffer = [], b""
        deadline = time.monotonic() + timeout
        while len(got) < answers and time.monotonic() < deadline:
            chunk = conn.recv(65536)
            if not chunk:
                break
            buffer += chunk
            while b"\r\n\r\n" in buffer:
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                if len(rest) < length:
                    break
                got.append(head + b"\r\n\r\n" + rest[:length])
                buffer = rest[length:]
    return got


def post_bytes(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n"
            % (path.encode(), extra, len(body))) + body


def test_requests_before_bad_bytes_are_answered_first(sup: Supervisor) -> None:
    """A request the parser cannot read ends the connection with its 400 (or 413, 431),
    after the answers to every request read before it, the slow one included."""
    slow = json.dumps(infer_json("x", [1, 4], "FP32", [7, 0, 0, 0])).encode()
    fast = json.dumps(infer_json("x", [1, 4], "FP32", [1, 0, 0, 0])).encode()
    data = post_bytes("/v2/models/echo/infer", slow) + post_bytes("/v2/models/echo/infer",
                                                                  fast) + b"GARBAGE\0\r\n\r\n"
    got = raw_exchange(sup.port, data, 3)  # type: ignore[attr-defined]
    assert [answer.split(b" ", 2)[1] for answer in got] == [b"200", b"200", b"400"]
    assert b"connection: close" in got[2]


def test_duplicate_headers_http2_and_expect_with_a_wrong_token(sup: Supervisor) -> None:
    port = sup.port  # type: ignore[attr-defined]
    body = json.dumps(infer_json("x", [1, 4], "FP32", [0] * 4)).encode()
    got = raw_exchange(port, post_bytes("/v2/models/echo/infer", body,
                                        b"Content-Type: a\r\nContent-Type: b\r\n"), 1)
    assert got[0].startswith(b"HTTP/1.1 400") and b"twice" in got[0]
    got = raw_exchange(port, b"GET /v2/health/live HTTP/2.0\r\nHost: x\r\n\r\n", 1)
    assert got[0].startswith(b"HTTP/1.1 505")


def test_nan_and_infinity_come_back_as_tokens_and_bytes_that_are_not_text(
        sup: Supervisor) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{sup.port}")  # type: ignore[attr-defined]
    values = triton.InferInput("v", [4], "FP32")
    values.set_data_from_numpy(np.array([np.nan, np.inf, -np.inf, 1], np.float32))
    result = client.infer("any", [values], outputs=[
        triton.InferRequestedOutput("v", binary_data=False)])
    got = result.as_numpy("v")
    assert np.isnan(got[0]) and list(got[1:]) == [np.inf, -np.inf, 1]
    text = triton.InferInput("t", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=object))
    with pytest.raises(InferenceServerException, match="not UTF-8"):
        client.infer("any", [text], outputs=[triton.InferRequestedOutput("t",
                                                                          binary_data=False)])
    assert list(client.infer("any", [text]).as_numpy("t")) == [b"\xff\xfe"]  # binary: as is
    status, _, raw = request(sup.port, "POST", "/v1/models/pair:predict",  # type: ignore
                             {"instances": [{"x": [1, 2, 3, 4], "s": {"b64": "//4="}}]})
    assert status == 200 and json.loads(raw)["predictions"][0]["s"] == {"b64": "//4="}


def test_check_and_run_name_the_http_file_that_is_wrong(tmp_path: Any) -> None:
    from supervisor.cli.preflight import preflight
    from supervisor.config.loading import parse_config

    (tmp_path / "bad.pem").write_text("not a certificate\n")
    (tmp_path / "empty").write_text("\n")
    cases = (({"tls_cert": "missing.pem", "tls_key": "missing.pem"}, "tls_cert",
              "no such file"),
             ({"tls_cert": "bad.pem", "tls_key": "bad.pem"}, "tls_cert", "not a PEM"),
             ({"token_file": "nothing"}, "token_file", "No such file"),
             ({"token_file": "empty"}, "token_file", "expected one token"))
    for section, key, words in cases:
        text = yaml.safe_dump({"supervisor": {"runtime_dir": str(tmp_path / "run"),
                                              "http": {"listen": "127.0.0.1:1", **section}},
                               "models": {"m": echo_model(1)}})
        found = [f for f in preflight(parse_config(text, tmp_path / "c.yaml")) if f.error]
        assert [f.where for f in found] == [f"supervisor.http.{key}"], found
        assert words in found[0].message
        config = tmp_path / "c.yaml"
        config.write_text(text)
        run = subprocess.run([sys.executable, "-m", "supervisor", "run", "-c", str(config)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == DaemonExit.CONFIG, run.stderr
        assert f"supervisor.http.{key}" in run.stderr + run.stdout


def test_not_ready_while_no_front_runs(tmp_path: Any) -> None:
    """Fronts that cannot start (a certificate replaced by garbage) leave the daemon not
    ready, by the same rule for /readyz, status --ready and the fronts themselves."""
    import trustme

    from supervisor.core.readiness import not_ready_reason

    pem = tmp_path / "server.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    port = free_port()
    sup = start_supervisor({"supervisor": {"http": http_config(
        port, processes=1, tls_cert=str(pem), tls_key=str(pem))},
        "models": {"echo": echo_model(1)}})
    try:
        sup.wait_ready()
        assert not_ready_reason(sup.status(), None) is None
        pem.write_text("garbage\n")
        os.kill(sup.status()["http"]["fronts"][0]["pid"], signal.SIGKILL)
        sup.wait_for(lambda s: s["http"]["fronts"][0]["restarts"] >= 2, 60,
                     "the front failing to start again")
        reason = not_ready_reason(sup.status(), None)
        assert reason is not None and "no HTTP front is running" in reason
    finally:
        sup.stop()
