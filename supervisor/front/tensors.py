"""Tensors as the HTTP APIs carry them, to and from the frames of the daemon's protocol.

A tensor here is a spec (`{"name", "dtype", "shape"}`, the protocol's own, docs/protocol.md)
and one frame of raw little-endian bytes. Binary tensor data (Triton's extension) travels
through as it came, without a copy into numpy: numeric data is already in the protocol's
layout. Strings differ only in where the lengths sit: each element's 4-byte length right
before it (Triton) against all lengths first (ours).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from supervisor.front.errors import HttpError
from supervisor.shared.arrays import ITEMSIZE, WIRE_DTYPES
from supervisor.shared.strings import STRING
from supervisor.shared.wire import MAX_NDIM, Frame, frame_buffer

Spec = dict[str, Any]
Tensor = tuple[Spec, Frame]

# The Open Inference Protocol's datatypes and the protocol's dtype names. BF16 has no numpy
# dtype and complex numbers no OIP datatype: neither can cross this front.
OIP_DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
              "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
              "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64",
              "BYTES": STRING}
WIRE_TO_OIP = {wire: oip for oip, wire in OIP_DTYPES.items()}
_LENGTH = struct.Struct("<I")
# numpy kinds JSON numbers may arrive as, per target kind: JSON has no bool for numbers, no
# fraction for an integer tensor.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def oip_dtype(spec: Spec) -> str:
    """The OIP datatype of a spec, or an error naming one this front cannot carry."""
    try:
        return WIRE_TO_OIP[spec["dtype"]]
    except KeyError:
        raise HttpError(500, f"tensor {spec['name']!r}: dtype {spec['dtype']} has no Open "
                        "Inference Protocol datatype") from None


def shape_of(name: str, shape: object) -> list[int]:
    """A shape from a request: a list of at most MAX_NDIM non-negative integers."""
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(
            type(d) is int and 0 <= d < 2**63 for d in shape):
        raise HttpError(400, f"input {name!r}: shape must be a list of at most {MAX_NDIM} "
                        f"non-negative integers, got {_shown(shape)}")
    return shape


def count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def from_values(name: str, wire: str, shape: list[int] | None, data: object) -> Tensor:
    """A tensor from JSON values (nested or flat lists, or one scalar): numbers for numeric
    dtypes (booleans for bool), text or bytes for strings. ``shape`` None: the data's own."""
    if wire == STRING:
        return _strings_tensor(name, shape, data)
    try:
        array = np.asarray(data)
    except ValueError:  # ragged nesting
        raise HttpError(400, f"input {name!r}: data is not a regular array (rows of "
                        "different lengths)") from None
    target = WIRE_DTYPES[wire]
    if target.kind in "iu" and array.dtype.kind in "fO":
        array = _exact_ints(name, wire, array, data)  # past int64 numpy reads floats
    if target.kind in "iu" and array.dtype.kind == "f" and array.size and \
            bool(np.isfinite(array).all()) and bool((array == np.trunc(array)).all()):
        array = _integral(name, wire, array)  # 1.0 is an integer; 1.5 is not
    if array.size and array.dtype.kind not in _ACCEPTED_KINDS[target.kind]:
        want = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}
        raise HttpError(400, f"input {name!r}: {wire} data must hold {want[target.kind]}, "
                        f"got {_kind_name(array)}")
    if target.kind in "iu" and array.size:
        info = np.iinfo(target)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise HttpError(400, f"input {name!r}: a value is out of {wire}'s range "
                            f"[{info.min}, {info.max}]")
    try:
        with np.errstate(over="raise", invalid="raise"):
            array = array.astype(target, copy=False)
    except FloatingPointError:
        raise HttpError(400, f"input {name!r}: a value is out of {wire}'s range") from None
    if shape is not None:
        if array.size != count(shape):
            raise HttpError(400, f"input {name!r}: shape {shape} holds {count(shape)} "
                            f"elements, data has {array.size}")
        if array.ndim > 1 and list(array.shape) != shape:
            raise HttpError(400, f"input {name!r}: nested data is shaped "
                            f"{list(array.shape)}, not {shape} (or send it flat)")
        array = array.reshape(shape)
    return ({"name": name, "dtype": wire, "shape": list(array.shape)},
            np.ascontiguousarray(array).tobytes())


def _integral(name: str, wire: str, array: np.ndarray) -> np.ndarray:
    info = np.iinfo(WIRE_DTYPES[wire])
    if float(array.min()) < info.min or float(array.max()) > info.max:
        raise HttpError(400, f"input {name!r}: a value is out of {wire}'s range "
                        f"[{info.min}, {info.max}]")
    return array.astype(np.int64 if info.min < 0 else np.uint64)


def _exact_ints(name: str, wire: str, array: np.ndarray, data: object) -> np.ndarray:
    """Integers as Python holds them (exact), when every value is one; else ``array``."""
    exact = np.asarray(data, dtype=object)
    if not exact.size or not all(type(v) is int for v in exact.ravel()):
        return array
    low, high = min(exact.ravel()), max(exact.ravel())
    if low < -(2**63) or high >= 2**64 or (low < 0 and high >= 2**63):
        info = np.iinfo(WIRE_DTYPES[wire])
        raise HttpError(400, f"input {name!r}: a value is out of {wire}'s range "
                        f"[{info.min}, {info.max}]")
    return np.asarray(exact.tolist(), dtype=np.uint64 if low >= 0 else np.int64)


def from_binary(name: str, wire: str, shape: list[int], chunk: memoryview) -> Tensor:
    """A tensor from Triton's binary data: numeric as it is (the daemon checks its length
    against the shape), strings re-framed."""
    if wire != STRING:
        want = count(shape) * ITEMSIZE[wire]
        if len(chunk) != want:
            raise HttpError(400, f"input {name!r}: {wire}{shape} is {want} bytes, its "
                            f"binary data {len(chunk)}")
        if wire == "bool" and want and int(np.frombuffer(chunk, np.uint8).max()) > 1:
            raise HttpError(400, f"input {name!r}: BOOL data must be bytes 0 or 1")
        return {"name": name, "dtype": wire, "shape": shape}, chunk
    return _strings_tensor(name, shape, split_strings(name, chunk, count(shape)))


def split_strings(name: str, chunk: memoryview, expected: int) -> list[bytes]:
    """Triton's BYTES framing: each element as a 4-byte little-endian length, then its
    bytes; exactly ``expected`` elements filling the chunk."""
    items: list[bytes] = []
    at, end = 0, len(chunk)
    while at < end:
        if at + 4 > end:
            raise HttpError(400, f"input {name!r}: BYTES data ends inside an element's length")
        (length,) = _LENGTH.unpack_from(chunk, at)
        at += 4
        if at + length > end:
            raise HttpError(400, f"input {name!r}: a BYTES element of {length} bytes runs "
                            "past the data")
        items.append(bytes(chunk[at:at + length]))
        at += length
        if len(items) > expected:
            break
    if len(items) != expected:
        raise HttpError(400, f"input {name!r}: shape holds {expected} elements, BYTES data "
                        f"has {len(items)}{' or more' if at < end else ''}")
    return items


def join_strings(items: Sequence[bytes]) -> bytes:
    """Triton's BYTES framing of elements."""
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


def _strings_tensor(name: str, shape: list[int] | None, data: object) -> Tensor:
    items = _flat_strings(name, data)
    if shape is None:
        shape = _nested_shape(data)
    if len(items) != count(shape):
        raise HttpError(400, f"input {name!r}: shape {shape} holds {count(shape)} elements, "
                        f"data has {len(items)}")
    frame = b"".join(_LENGTH.pack(len(item)) for item in items) + b"".join(items)
    return {"name": name, "dtype": STRING, "shape": list(shape)}, frame


def _flat_strings(name: str, data: object) -> list[bytes]:
    out: list[bytes] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item.encode())
        elif isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        else:
            raise HttpError(400, f"input {name!r}: BYTES data must hold strings, got "
                            f"{_shown(item)}")
    return out


def _nested_shape(data: object) -> list[int]:
    shape = []
    while isinstance(data, list):
        shape.append(len(data))
        data = data[0] if data else None
    return shape


def array_of(spec: Spec, frame: Frame) -> np.ndarray:
    """An output frame as a numpy array (strings: an object array of bytes)."""
    shape = spec["shape"]
    if spec["dtype"] == STRING:
        return np.array(strings_of(frame, count(shape)), dtype=object).reshape(shape)
    return np.frombuffer(frame_buffer(frame), WIRE_DTYPES[spec["dtype"]]).reshape(shape)


def strings_of(frame: Frame, n: int) -> list[bytes]:
    """The elements of a string frame in the protocol's layout (all lengths, then bytes)."""
    view = memoryview(frame_buffer(frame)).cast("B")
    lengths = struct.unpack_from(f"<{n}I", view, 0)
    at, items = 4 * n, []
    for length in lengths:
        items.append(bytes(view[at:at + length]))
        at += length
    return items


def binary_of(spec: Spec, frame: Frame) -> Frame:
    """An output in Triton's binary layout."""
    if spec["dtype"] != STRING:
        return frame
    return join_strings(strings_of(frame, count(spec["shape"])))


def json_values(spec: Spec, frame: Frame) -> list[Any]:
    """An output's elements, flat, as JSON values; strings must be UTF-8 text (other bytes
    cannot be JSON: the error says to ask for the output binary)."""
    if spec["dtype"] == STRING:
        try:
            return [item.decode() for item in strings_of(frame, count(spec["shape"]))]
        except UnicodeDecodeError:
            raise HttpError(400, f"output {spec['name']!r} holds bytes that are not UTF-8 "
                            "text, which JSON cannot carry: ask for it binary "
                            "(parameters.binary_data: true)") from None
    values: list[Any] = np.frombuffer(frame_buffer(frame), WIRE_DTYPES[spec["dtype"]]).tolist()
    return values


def all_finite(spec: Spec, frame: Frame) -> bool:
    """No NaN or infinity in a float output (others are finite by type)."""
    if spec["dtype"] not in ("float16", "float32", "float64"):
        return True
    return bool(np.isfinite(np.frombuffer(frame_buffer(frame),
                                          WIRE_DTYPES[spec["dtype"]])).all())


def _kind_name(array: np.ndarray) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "non-integers",
            "U": "text", "S": "bytes", "O": "mixed values"}.get(array.dtype.kind,
                                                                 array.dtype.name)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
