"""How a client reaches a server: one request (named arrays) in, the answer's values out.

A transport is built in the bench process and connected in each client process (after the
fork): ``connect()`` returns the call a client thread makes. Every call answers the flat
values of the server's answer (a float32 array) or raises; the workload checks them.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Inputs = Mapping[str, np.ndarray]
Call = Callable[[Inputs], np.ndarray]


class Transport(Protocol):
    @property
    def name(self) -> str: ...

    def connect(self) -> Call: ...


@dataclass(frozen=True)
class Zmq:
    """tfsupervisor's own protocol: ``supervisor.client.Client`` (one per client process;
    it keeps a socket per thread), answering the model's output ``output``."""

    endpoint: str
    model: str
    output: str
    name: str = "zmq"

    def connect(self) -> Call:
        from supervisor.client import Client

        client = Client(self.endpoint, timeout=60)

        def infer(inputs: Inputs) -> np.ndarray:
            return client.infer(self.model, inputs)[self.output].ravel()

        return infer


@dataclass(frozen=True)
class Codec:
    """An HTTP body: how a request is written and an answer read."""

    content_type: str
    encode: Callable[[Inputs], bytes]
    decode: Callable[[bytes], np.ndarray]


def raw_codec() -> Codec:
    """The first input's raw bytes in, raw float32 out."""
    return Codec("application/octet-stream",
                 lambda inputs: next(iter(inputs.values())).tobytes(),
                 lambda data: np.frombuffer(data, np.float32))


def json_codec(field_in: str, field_out: str) -> Codec:
    """``{field_in: the first input's one row}`` in, ``{field_out: values}`` out."""
    return Codec("application/json",
                 lambda inputs: json.dumps({field_in: next(iter(inputs.values()))[0].tolist()}
                                           ).encode(),
                 lambda data: np.asarray(json.loads(data)[field_out], np.float32).ravel())


DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64",
             np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}


def oip_encode(inputs: Inputs) -> bytes:
    """An Open Inference Protocol v2 REST request body (every input, flat data)."""
    return json.dumps({"inputs": [{"name": name, "shape": list(array.shape),
                                   "datatype": DATATYPES[array.dtype],
                                   "data": array.ravel().tolist()}
                                  for name, array in inputs.items()]}).encode()


def oip_codec(output: str) -> Codec:
    """Open Inference Protocol v2 (KServe) JSON in and out; the answer is output ``output``."""
    def decode(data: bytes) -> np.ndarray:
        outputs = json.loads(data)["outputs"]
        [found] = [o for o in outputs if o["name"] == output]
        return np.asarray(found["data"], np.float32)

    return Codec("application/json", oip_encode, decode)


@dataclass(frozen=True)
class Http:
    """POST to ``127.0.0.1:port`` + ``path``, one keep-alive ``http.client`` connection per
    client thread (reopened after an error, or when the server closes it); any status but
    200 raises. The same client for every HTTP server: only the body's codec differs."""

    port: int
    path: str
    codec: Codec
    name: str = "http"

    def connect(self) -> Call:
        local = threading.local()
        headers = {"Content-Type": self.codec.content_type}
        encode, decode = self.codec.encode, self.codec.decode

        def post(inputs: Inputs) -> np.ndarray:
            conn: http.client.HTTPConnection | None = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                               timeout=60)
            try:
                conn.request("POST", self.path, body=encode(inputs), headers=headers)
                response = conn.getresponse()
                data = response.read()
            except BaseException:
                conn.close()
                local.conn = None
                raise
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
            return decode(data)

        return post



# The Open Inference Protocol's datatypes of the numpy dtypes the benches send.
_OIP = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}


@dataclass(frozen=True)
class Grpc:
    """The Open Inference Protocol over gRPC, as ``tritonclient.grpc`` sends it: inputs in
    ``raw_input_contents``, the output read from ``raw_output_contents``. One channel per
    client process, shared by its threads (HTTP/2 carries their calls at once)."""

    port: int
    model: str
    name: str = "grpc"

    def connect(self) -> Call:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=[
            ("grpc.max_send_message_length", 2**30),
            ("grpc.max_receive_message_length", 2**30)])
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def infer(inputs: Inputs) -> np.ndarray:
            request = service_pb2.ModelInferRequest(model_name=self.model)
            for name, value in inputs.items():
                array = np.ascontiguousarray(value)
                request.inputs.add(name=name, datatype=_OIP[array.dtype], shape=array.shape)
                request.raw_input_contents.append(array.tobytes())
            response = stub.ModelInfer(request, timeout=60)
            return np.frombuffer(response.raw_output_contents[0], np.float32)

        return infer
