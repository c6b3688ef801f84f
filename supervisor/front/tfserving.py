"""TF Serving's REST API: model status, metadata and `:predict` in the row (`instances`) and
columnar (`inputs`) forms, `{"b64": ...}` for binary strings, and the NaN / Infinity tokens
TF Serving's JSON accepts and writes.

Every model is one signature, `serving_default` (what the worker runs); naming another is
an error.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np
import orjson

from supervisor.client.aclient import AsyncClient
from supervisor.client.errors import JobError
from supervisor.front import tensors
from supervisor.front.catalog import Catalog, not_loaded, version_of
from supervisor.front.errors import HttpError, from_job
from supervisor.front.messages import JSON, Request, Response, json_bytes, json_response
from supervisor.shared.strings import STRING
from supervisor.shared.wire import Frame

SIGNATURE = "serving_default"
# TF Serving's names of the dtypes.
TF_DTYPES = {"bool": "DT_BOOL", "int8": "DT_INT8", "int16": "DT_INT16", "int32": "DT_INT32",
             "int64": "DT_INT64", "uint8": "DT_UINT8", "uint16": "DT_UINT16",
             "uint32": "DT_UINT32", "uint64": "DT_UINT64", "float16": "DT_HALF",
             "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "complex64": "DT_COMPLEX64",
             "complex128": "DT_COMPLEX128", STRING: "DT_STRING"}


def status(catalog: Catalog, name: str, version: str | None) -> Response:
    entry = catalog.model(name, version)
    if entry.get("ready_workers"):
        state, code, message = "AVAILABLE", "OK", ""
    elif entry.get("failing_to_start"):
        state, code, message = "END", "UNKNOWN", "the model's workers fail to start"
    else:
        state, code, message = "LOADING", "OK", ""
    return json_response({"model_version_status": [{
        "version": version_of(entry), "state": state,
        "status": {"error_code": code, "error_message": message}}]})


def metadata(catalog: Catalog, name: str, version: str | None) -> Response:
    entry = catalog.model(name, version)
    if entry.get("inputs") is None:
        raise HttpError(503, not_loaded(name, entry))
    signature = {"inputs": _signature_tensors(entry["inputs"]),
                 "outputs": _signature_tensors(entry.get("outputs") or []),
                 "method_name": "tensorflow/serving/predict"}
    return json_response({
        "model_spec": {"name": name, "signature_name": "", "version": version_of(entry)},
        "metadata": {"signature_def": {"signature_def": {SIGNATURE: signature}}}})


def _signature_tensors(specs: list[dict[str, Any]]) -> dict[str, Any]:
    return {spec["name"]: {
        "dtype": TF_DTYPES.get(spec["dtype"], "DT_INVALID"), "name": spec["name"],
        "tensor_shape": {"dim": [{"size": str(-1 if d is None else d), "name": ""}
                                 for d in spec["shape"]], "unknown_rank": False}}
        for spec in specs}


async def predict(client: AsyncClient, catalog: Catalog, request: Request, name: str,
                  version: str | None, timeout: float) -> Response:
    entry = catalog.model(name, version)
    specs = entry.get("inputs")
    if specs is None:
        raise HttpError(503, not_loaded(name, entry))
    doc = _parse(request.body)
    signature = doc.get("signature_name", SIGNATURE) or SIGNATURE
    if signature != SIGNATURE:
        raise HttpError(400, f"signature_name {str(signature)[:64]!r}: this model serves "
                        f"only {SIGNATURE!r}")
    rows = "instances" in doc
    if rows == ("inputs" in doc):
        raise HttpError(400, 'expected exactly one of "instances" (row format) or "inputs" '
                        "(columnar format)")
    values = _from_rows(doc["instances"], specs) if rows else _from_columns(doc["inputs"],
                                                                           specs)
    in_specs, frames = [], []
    for spec in specs:
        tensor_spec, frame = tensors.from_values(spec["name"], spec["dtype"], None,
                                                 _decoded(spec, values[spec["name"]]))
        in_specs.append(tensor_spec)
        frames.append(frame)
    try:
        out_specs, out_frames = await client.infer_frames(name, in_specs, frames, timeout)
    except JobError as exc:
        raise from_job(exc) from None
    return _answer(out_specs, out_frames, rows)


def _parse(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:  # TF Serving's JSON also takes NaN, Infinity and -Infinity
            doc = json.loads(body)
        except RecursionError:
            raise HttpError(400, "the request's JSON is nested too deeply") from None
        except ValueError as exc:
            raise HttpError(400, f"the request is not JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise HttpError(400, 'the request must be a JSON object with "instances" or "inputs"')
    return doc


def _from_rows(instances: object, specs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    if not isinstance(instances, list) or not instances:
        raise HttpError(400, '"instances" must be a non-empty list, one item per row')
    names = [spec["name"] for spec in specs]
    named = all(isinstance(row, dict) and not _is_b64(row) for row in instances)
    if not named:
        if len(names) != 1:
            raise HttpError(400, f"this model has inputs {', '.join(names)}: each instance "
                            "must be an object naming them")
        return {names[0]: instances}
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for i, row in enumerate(instances):
        if set(row) != set(names):
            raise HttpError(400, f"instances[{i}] has {sorted(row)[:8]}, expected the "
                            f"inputs {names}")
        for name in names:
            columns[name].append(row[name])
    return columns


def _from_columns(inputs: object, specs: list[dict[str, Any]]) -> dict[str, Any]:
    names = [spec["name"] for spec in specs]
    if isinstance(inputs, dict) and not _is_b64(inputs):
        if set(inputs) != set(names):
            raise HttpError(400, f'"inputs" has {sorted(inputs)[:8]}, expected the inputs '
                            f"{names}")
        return inputs
    if len(names) != 1:
        raise HttpError(400, f'this model has inputs {", ".join(names)}: "inputs" must be an '
                        "object naming them")
    return {names[0]: inputs}


def _is_b64(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _decoded(spec: dict[str, Any], value: Any) -> Any:
    """``{"b64": ...}`` objects as bytes (string inputs only)."""
    if isinstance(value, list):
        return [_decoded(spec, item) for item in value]
    if isinstance(value, dict):
        if not _is_b64(value) or spec["dtype"] != STRING:
            raise HttpError(400, f"input {spec['name']!r}: expected {spec['dtype']} values, "
                            "got an object")
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise HttpError(400, f"input {spec['name']!r}: a b64 value is not base64") \
                from None
    return value


def _answer(specs: list[dict[str, Any]], frames: list[Frame], rows: bool) -> Response:
    arrays = {spec["name"]: _values(spec, frame) for spec, frame in zip(specs, frames,
                                                                        strict=True)}
    if rows:
        if len(arrays) == 1:
            body: Any = {"predictions": next(iter(arrays.values()))}
        else:
            count = min(len(v) for v in arrays.values())
            body = {"predictions": [{name: values[i] for name, values in arrays.items()}
                                    for i in range(count)]}
    else:
        body = {"outputs": next(iter(arrays.values())) if len(arrays) == 1 else arrays}
    finite = all(tensors.all_finite(spec, frame)
                 for spec, frame in zip(specs, frames, strict=True))
    return Response(200, [json_bytes(body, finite)], JSON)


def _values(spec: dict[str, Any], frame: Frame) -> Any:
    array = tensors.array_of(spec, frame)
    if spec["dtype"] != STRING:
        return array.tolist()
    as_b64 = spec["name"].endswith("_bytes")
    flat = [_b64(item) if as_b64 else _text_or_b64(item) for item in array.ravel()]
    return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else \
        flat[0]




def _b64(item: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(item).decode()}


def _text_or_b64(item: bytes) -> str | dict[str, str]:
    """Text as text; bytes that are not UTF-8 as {"b64": ...}, never altered."""
    try:
        return item.decode()
    except UnicodeDecodeError:
        return _b64(item)
