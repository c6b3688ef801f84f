"""The Open Inference Protocol over gRPC (KServe v2's GRPCInferenceService, what
tritonclient.grpc and perf_analyzer speak) and grpc.health.v1, in the front processes.

Same translation as the HTTP front (supervisor/front/oip.py): tensors to frames (raw
contents go through as they came; typed contents are converted), the daemon's answer back
as raw output contents, and errors as the status codes gRPC clients expect: NOT_FOUND,
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL (from the
same HttpError the HTTP routes raise, so one place decides what a problem is).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from supervisor.client.errors import JobError
from supervisor.front import metrics, tensors
from supervisor.front.catalog import not_loaded, platform_of, version_of
from supervisor.front.errors import HttpError, from_job
from supervisor.front.oip import EXTENSIONS, MAX_ID, MAX_TIMEOUT, SERVER_NAME
from supervisor.front.proto import health_pb2, health_pb2_grpc, inference_pb2
from supervisor.front.proto import inference_pb2_grpc as service
from supervisor.front.routes import Front
from supervisor.shared.wire import MAX_ARRAYS, Frame, frame_buffer

pb = inference_pb2
# HTTP statuses (front/errors.py) as gRPC codes.
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
         429: grpc.StatusCode.RESOURCE_EXHAUSTED, 501: grpc.StatusCode.UNIMPLEMENTED,
         503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
# The typed contents field of each datatype (FP16 travels raw only, as in the protocol).
CONTENTS = {"bool": "bool_contents", "int8": "int_contents", "int16": "int_contents",
            "int32": "int_contents", "int64": "int64_contents", "uint8": "uint_contents",
            "uint16": "uint_contents", "uint32": "uint_contents", "uint64": "uint64_contents",
            "float32": "fp32_contents", "float64": "fp64_contents", "string": "bytes_contents"}


async def _fail(context: grpc.aio.ServicerContext, error: HttpError) -> None:
    await context.abort(CODES.get(error.status, grpc.StatusCode.INTERNAL), error.message)


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    """Errors as status codes with one line, never a traceback; every call counted in the
    fronts' metrics under ``grpc:<Method>``, with the HTTP status its answer stands for."""
    route = f"grpc:{method.__name__}"

    async def call(self: InferenceService, request: Any,
                   context: grpc.aio.ServicerContext) -> Any:
        started, status = time.perf_counter(), 200
        metrics.TALLIES.in_flight += 1
        try:
            return await method(self, request, context)
        except HttpError as error:
            status = error.status
            await _fail(context, error)
        finally:
            metrics.TALLIES.in_flight -= 1
            metrics.observe(route, status, time.perf_counter() - started, 0, 0)
    call.__doc__, call.__name__ = method.__doc__, method.__name__
    return call


class InferenceService(service.GRPCInferenceServiceServicer):
    def __init__(self, front: Front) -> None:
        self.front = front

    @_guarded
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    @_guarded
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.front.catalog.not_ready() is None)

    @_guarded
    async def ModelReady(self, request: Any, context: Any) -> Any:
        """Not ready (no error) for a model or version not served, as Triton answers."""
        try:
            self.front.catalog.model(request.name, request.version or None)
        except HttpError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.front.catalog.model_ready(request.name))

    @_guarded
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=self.front.version,
                                         extensions=EXTENSIONS)

    @_guarded
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        entry = self.front.catalog.model(request.name, request.version or None)
        if entry.get("inputs") is None:
            raise HttpError(503, not_loaded(request.name, entry))
        meta = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name, versions=[version_of(entry)], platform=platform_of(entry),
            inputs=[meta(name=s["name"], datatype=_oip(s), shape=_shape(s))
                    for s in entry["inputs"]],
            outputs=[meta(name=s["name"], datatype=_oip(s), shape=_shape(s))
                     for s in entry.get("outputs") or []])

    @_guarded
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        name = request.model_name
        entry = self.front.catalog.model(name, request.model_version or None)
        if len(request.id) > MAX_ID:
            raise HttpError(400, f"id is over {MAX_ID} characters")
        specs, frames = _inputs(request)
        timeout = _timeout(request.parameters, self.front.default_timeout,
                           context.time_remaining())
        try:
            out_specs, out_frames = await self.front.client.infer_frames(
                name, specs, frames, timeout)
        except JobError as exc:
            raise from_job(exc) from None
        return _answer(request, name, version_of(entry), out_specs, out_frames)


def _oip(spec: dict[str, Any]) -> str:
    return tensors.WIRE_TO_OIP.get(spec["dtype"], str(spec["dtype"]).upper())


def _shape(spec: dict[str, Any]) -> list[int]:
    return [-1 if d is None else d for d in spec["shape"]]


def _inputs(request: Any) -> tuple[list[dict[str, Any]], list[Frame]]:
    if not request.inputs:
        raise HttpError(400, "inputs must name at least one tensor")
    if len(request.inputs) > MAX_ARRAYS:
        raise HttpError(400, f"at most {MAX_ARRAYS} inputs, got {len(request.inputs)}")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise HttpError(400, f"raw_input_contents holds {len(raw)} tensors for "
                        f"{len(request.inputs)} inputs: give every input's, in order")
    specs, frames = [], []
    for i, item in enumerate(request.inputs):
        wire = tensors.OIP_DTYPES.get(item.datatype)
        if wire is None:
            raise HttpError(400, f"input {item.name!r}: datatype must be one of "
                            f"{', '.join(tensors.OIP_DTYPES)}, got {item.datatype[:32]!r}")
        shape = tensors.shape_of(item.name, list(item.shape))
        if raw:
            spec, frame = tensors.from_binary(item.name, wire, shape, memoryview(raw[i]))
        else:
            spec, frame = tensors.from_values(item.name, wire, shape, _contents(item, wire))
        specs.append(spec)
        frames.append(frame)
    return specs, frames


def _contents(item: Any, wire: str) -> list[Any]:
    field = CONTENTS.get(wire)
    if field is None:
        raise HttpError(400, f"input {item.name!r}: {item.datatype} travels in "
                        "raw_input_contents only")
    if not item.HasField("contents"):
        raise HttpError(400, f"input {item.name!r}: no contents and no raw_input_contents")
    others = [f.name for f, _ in item.contents.ListFields() if f.name != field]
    if others:
        raise HttpError(400, f"input {item.name!r}: a {item.datatype} tensor's values go in "
                        f"contents.{field}, not {others[0]}")
    return list(getattr(item.contents, field))


def _timeout(parameters: Any, default: float, remaining: float | None) -> float:
    """parameters["timeout"] in microseconds (Triton's), else the call's own gRPC deadline,
    else the default."""
    timeout = default if remaining is None else max(0.001, remaining)
    if "timeout" in parameters:
        value = _number(parameters["timeout"])
        if value is None or not math.isfinite(value) or value <= 0 or value / 1e6 > MAX_TIMEOUT:
            raise HttpError(400, "parameters[\"timeout\"] must be a number of microseconds, "
                            "more than 0 and at most a year")
        timeout = min(timeout, max(value / 1e6, 0.001))
    return timeout


def _number(parameter: Any) -> float | None:
    choice = parameter.WhichOneof("parameter_choice")
    if choice in ("int64_param", "uint64_param", "double_param"):
        return float(getattr(parameter, choice))
    return None


def _answer(request: Any, name: str, version: str, specs: Sequence[dict[str, Any]],
            frames: Sequence[Frame]) -> Any:
    wanted = [o.name for o in request.outputs]
    produced = {spec["name"] for spec in specs}
    missing = [n for n in wanted if n not in produced]
    if missing:
        raise HttpError(400, f"model {name!r} has no output {missing[0][:64]!r} (outputs: "
                        f"{', '.join(sorted(produced))})")
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request.id)
    for spec, frame in zip(specs, frames, strict=True):
        if wanted and spec["name"] not in wanted:
            continue
        response.outputs.add(name=spec["name"], datatype=tensors.oip_dtype(spec),
                             shape=spec["shape"])
        response.raw_output_contents.append(bytes(frame_buffer(tensors.binary_of(spec,
                                                                                 frame))))
    return response


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: "" is the server (SERVING when ready, as /v2/health/ready), a model
    name is that model (SERVING with a ready worker); any other name SERVICE_UNKNOWN."""

    def __init__(self, front: Front) -> None:
        self.front = front

    def status(self, service_name: str) -> Any:
        status = health_pb2.HealthCheckResponse
        catalog = self.front.catalog
        if service_name in ("", "inference.GRPCInferenceService"):
            return status.SERVING if catalog.not_ready() is None else status.NOT_SERVING
        if service_name in catalog.models:
            return status.SERVING if catalog.model_ready(service_name) else \
                status.NOT_SERVING
        return status.SERVICE_UNKNOWN

    async def Check(self, request: Any, context: Any) -> Any:
        found = self.status(request.service)
        if found == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service "
                                f"{request.service[:64]!r}")
        return health_pb2.HealthCheckResponse(status=found)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not served: poll Check")
        yield health_pb2.HealthCheckResponse()  # never reached: abort raises


def server(front: Front, listen: str, max_message: int,
           credentials: grpc.ServerCredentials | None) -> grpc.aio.Server:
    """A gRPC server on ``listen`` (SO_REUSEPORT: every front binds the same port, and the
    daemon holds it unlistened so nobody else can), message sizes from max_message_size."""
    options = [("grpc.max_receive_message_length", max_message),
               ("grpc.max_send_message_length", max_message), ("grpc.so_reuseport", 1)]
    grpc_server = grpc.aio.server(options=options)
    service.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        InferenceService(front), grpc_server)
    health_pb2_grpc.add_HealthServicer_to_server(  # type: ignore[no-untyped-call]
        HealthService(front), grpc_server)
    if credentials is None:
        grpc_server.add_insecure_port(listen)
    else:
        grpc_server.add_secure_port(listen, credentials)
    return grpc_server
