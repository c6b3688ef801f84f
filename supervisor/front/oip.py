"""The Open Inference Protocol v2 (KServe's REST API, which Triton and MLServer speak too),
with Triton's binary tensor data extension.

Infer: the request's JSON (or, with `Inference-Header-Content-Length`, its first bytes)
names each input; an input's data is in `data` (nested or flat) or, with
`parameters.binary_data_size`, in the bytes after the JSON, in input order. Outputs come back
as JSON `data`, or as binary after the JSON where asked (`parameters.binary_data` on an
output, or `parameters.binary_data_output` for all), which is what `tritonclient.http` asks
by default.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from supervisor.client.aclient import AsyncClient
from supervisor.client.errors import JobError
from supervisor.front import tensors
from supervisor.front.catalog import Catalog, not_loaded, platform_of, version_of
from supervisor.front.errors import HttpError, from_job
from supervisor.front.messages import (
    JSON,
    Request,
    Response,
    json_bytes,
    json_response,
    json_shown,
)
from supervisor.shared.wire import MAX_ARRAYS, Frame, frame_length

HEADER_LENGTH = b"inference-header-content-length"
BINARY = b"application/octet-stream"
# The longest deadline a request may ask for (seconds): a year, as the frontend protocol.
MAX_TIMEOUT = 365 * 86400.0
EXTENSIONS = ["binary_tensor_data"]
SERVER_NAME = "tfsupervisor"
# The id a client sends is echoed; longer ones are refused (it is a correlation id).
MAX_ID = 256


def server_metadata(version: str) -> Response:
    return json_response({"name": SERVER_NAME, "version": version, "extensions": EXTENSIONS})


def model_metadata(catalog: Catalog, name: str, version: str | None) -> Response:
    entry = catalog.model(name, version)
    if entry.get("inputs") is None:
        raise HttpError(503, not_loaded(name, entry))
    return json_response({
        "name": name, "versions": [version_of(entry)], "platform": platform_of(entry),
        "inputs": [_tensor_metadata(spec) for spec in entry["inputs"]],
        "outputs": [_tensor_metadata(spec) for spec in entry.get("outputs") or []]})


def _tensor_metadata(spec: dict[str, Any]) -> dict[str, Any]:
    return {"name": spec["name"], "datatype": tensors.WIRE_TO_OIP.get(spec["dtype"],
                                                                     spec["dtype"].upper()),
            "shape": [-1 if d is None else d for d in spec["shape"]]}


async def infer(client: AsyncClient, catalog: Catalog, request: Request, name: str,
                version: str | None, default_timeout: float) -> Response:
    entry = catalog.model(name, version)
    body = memoryview(request.body)
    head, binary = _split(request, body)
    doc = _json(head)
    specs, frames = _inputs(doc, binary)
    wanted, binary_default = _outputs(doc)
    timeout = _timeout(doc.get("parameters"), default_timeout)
    try:
        out_specs, out_frames = await client.infer_frames(name, specs, frames, timeout)
    except JobError as exc:
        raise from_job(exc) from None
    return _answer(name, version_of(entry), doc.get("id"), out_specs, out_frames, wanted,
                   binary_default)


def _split(request: Request, body: memoryview) -> tuple[memoryview, memoryview]:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return body, body[len(body):]
    if not raw.isdigit() or int(raw) > len(body):
        raise HttpError(400, f"Inference-Header-Content-Length {raw[:20].decode('latin-1')!r}"
                        f" is not a length within the body ({len(body)} bytes)")
    return body[:int(raw)], body[int(raw):]


def _json(head: memoryview) -> dict[str, Any]:
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"the request is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise HttpError(400, "the request must be a JSON object with an `inputs` list")
    if "id" in doc and (not isinstance(doc["id"], str) or len(doc["id"]) > MAX_ID):
        raise HttpError(400, f"`id` must be a string of at most {MAX_ID} characters")
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise HttpError(400, "`parameters` must be an object")
    if parameters.get("sequence_id") not in (None, 0, ""):
        raise HttpError(400, "sequence_id: sequence batching is not supported by tfsupervisor")
    return doc


def _inputs(doc: dict[str, Any], binary: memoryview) -> tuple[list[dict[str, Any]],
                                                               list[Frame]]:
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise HttpError(400, "`inputs` must be a non-empty list of tensors")
    if len(inputs) > MAX_ARRAYS:
        raise HttpError(400, f"at most {MAX_ARRAYS} inputs, got {len(inputs)}")
    specs, frames, at = [], [], 0
    for i, item in enumerate(inputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise HttpError(400, f"inputs[{i}] must be an object with a string `name`")
        name = item["name"]
        wire = tensors.OIP_DTYPES.get(item.get("datatype"))  # type: ignore[arg-type]
        if wire is None:
            raise HttpError(400, f"input {name!r}: datatype must be one of "
                            f"{', '.join(tensors.OIP_DTYPES)}, got "
                            f"{str(item.get('datatype'))[:32]!r}")
        shape = tensors.shape_of(name, item.get("shape"))
        size = _binary_size(name, item.get("parameters"))
        if size is not None and "data" in item:
            raise HttpError(400, f"input {name!r}: both `data` and binary_data_size; send "
                            "one")
        if size is None:
            if "data" not in item:
                raise HttpError(400, f"input {name!r}: no `data` and no binary_data_size")
            spec, frame = tensors.from_values(name, wire, shape, item["data"])
        else:
            if at + size > len(binary):
                raise HttpError(400, f"input {name!r}: binary_data_size {size} runs past the "
                                f"body's {len(binary) - at} binary bytes left")
            spec, frame = tensors.from_binary(name, wire, shape, binary[at:at + size])
            at += size
        specs.append(spec)
        frames.append(frame)
    if at != len(binary):
        raise HttpError(400, f"the body holds {len(binary) - at} binary bytes no input's "
                        "binary_data_size claims")
    return specs, frames


def _binary_size(name: str, parameters: object) -> int | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise HttpError(400, f"input {name!r}: `parameters` must be an object")
    size = parameters.get("binary_data_size")
    if size is None:
        return None
    if type(size) is not int or size < 0:
        raise HttpError(400, f"input {name!r}: binary_data_size must be a non-negative "
                        "integer")
    return size


def _outputs(doc: dict[str, Any]) -> tuple[dict[str, bool] | None, bool]:
    """The outputs asked for, each with whether it goes binary (None: all), and the default
    for those not named."""
    parameters = doc.get("parameters", {})
    default = parameters.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise HttpError(400, "parameters.binary_data_output must be true or false")
    outputs = doc.get("outputs")
    if outputs is None:
        return None, default
    if not isinstance(outputs, list):
        raise HttpError(400, "`outputs` must be a list of {\"name\": ...} objects")
    wanted: dict[str, bool] = {}
    for i, item in enumerate(outputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise HttpError(400, f"outputs[{i}] must be an object with a string `name`")
        params = item.get("parameters") or {}
        binary = params.get("binary_data", default) if isinstance(params, dict) else None
        if not isinstance(binary, bool):
            raise HttpError(400, f"outputs[{i}].parameters.binary_data must be true or false")
        wanted[item["name"]] = binary
    return wanted, default


def _timeout(parameters: object, default: float) -> float:
    """parameters.timeout in microseconds (Triton's unit), as the job's deadline."""
    if not isinstance(parameters, dict) or "timeout" not in parameters:
        return default
    value = parameters["timeout"]
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0 \
            or value / 1e6 > MAX_TIMEOUT:
        raise HttpError(400, "parameters.timeout must be a number of microseconds, more than "
                        f"0 and at most a year, got {json_shown(value)}")
    return max(float(value) / 1e6, 0.001)


def _answer(name: str, version: str, request_id: object, specs: list[dict[str, Any]],
            frames: list[Frame], wanted: dict[str, bool] | None,
            binary_default: bool) -> Response:
    produced = {spec["name"] for spec in specs}
    if wanted is not None and (missing := [n for n in wanted if n not in produced]):
        raise HttpError(400, f"model {name!r} has no output {missing[0][:64]!r} (outputs: "
                        f"{', '.join(sorted(produced))})")
    outputs, chunks, finite = [], [], True
    for spec, frame in zip(specs, frames, strict=True):
        if wanted is not None and spec["name"] not in wanted:
            continue
        binary = binary_default if wanted is None else wanted[spec["name"]]
        out: dict[str, Any] = {"name": spec["name"], "datatype": tensors.oip_dtype(spec),
                               "shape": spec["shape"]}
        if binary:
            chunk = tensors.binary_of(spec, frame)
            out["parameters"] = {"binary_data_size": frame_length(chunk)}
            chunks.append(chunk)
        else:
            out["data"] = tensors.json_values(spec, frame)
            finite = finite and tensors.all_finite(spec, frame)
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": name, "model_version": version, "outputs": outputs}
    if request_id is not None:
        doc["id"] = request_id
    head = json_bytes(doc, finite)
    if not chunks:
        return Response(200, [head], JSON)
    return Response(200, [head, *chunks], BINARY,
                    [(HEADER_LENGTH, str(len(head)).encode())])
