"""The wire protocol, version 1: one module, encode/decode pairs, ProtocolError on bad input.

Every message is a ZeroMQ multipart message::

    [b"TFS1", kind, job_id, header, array_0, array_1, ...]

``kind`` is ASCII, ``job_id`` opaque bytes (at most 64), ``header`` a msgpack map, and each
array one raw frame (C order, little-endian) described by an entry of the header's
``inputs`` or ``outputs`` list: ``{"name", "dtype", "shape"}``. The same layout serves the
client hop, the worker hop and the control socket. See docs/protocol.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from supervisor.strings import (
    STRING,
    StringFrameError,
    is_string_array,
    pack_strings,
    string_lengths,
    unpack_strings,
)

VERSION = b"TFS1"

# Message kinds. Client -> supervisor:
INFER = b"infer"
MODELS = b"models"
# Supervisor -> client (and worker -> supervisor for RESULT / ERROR):
RESULT = b"result"
ERROR = b"error"
# Worker <-> supervisor:
READY = b"ready"
HEARTBEAT = b"heartbeat"
JOB = b"job"
STOP = b"stop"
RESULTS = b"results"  # every answer to one JOB message, in one message
# Control socket, both ways:
CONTROL = b"control"

KINDS = frozenset({INFER, MODELS, RESULT, ERROR, READY, HEARTBEAT, JOB, STOP, RESULTS,
                   CONTROL})

# Stable error codes (docs/protocol.md).
UNKNOWN_MODEL = "unknown_model"
BAD_REQUEST = "bad_request"
OVERLOADED = "overloaded"
DEADLINE_EXCEEDED = "deadline_exceeded"
WORKER_CRASHED = "worker_crashed"
TIMEOUT = "timeout"
SHUTTING_DOWN = "shutting_down"
UNAVAILABLE = "unavailable"
INTERNAL = "internal"
ERROR_CODES = frozenset({UNKNOWN_MODEL, BAD_REQUEST, OVERLOADED, DEADLINE_EXCEEDED,
                         WORKER_CRASHED, TIMEOUT, SHUTTING_DOWN, UNAVAILABLE, INTERNAL})

MAX_JOB_ID = 64
MAX_HEADER = 64 * 1024
MAX_ARRAYS = 64
MAX_NDIM = 8
# Longest list or map in a header: it bounds the jobs of one batch (max_batch_size).
MAX_BATCH_JOBS = 4096

# Plain numbers, and strings in their own frame layout (supervisor/strings.py); no object,
# void or datetime dtypes: nothing that would need unpickling or evaluating.
NUMERIC_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                            "uint32", "uint64", "float16", "float32", "float64", "complex64",
                            "complex128"})
DTYPES = NUMERIC_DTYPES | {STRING}

ITEMSIZE = {name: np.dtype(name).itemsize for name in NUMERIC_DTYPES}

# pyzmq copies frames smaller than this anyway; larger ones are sent without a copy.
ZERO_COPY_MIN = 64 * 1024

Frame = bytes | memoryview | zmq.Frame


class ProtocolError(Exception):
    """A message that does not follow the protocol. ``code`` is an error code to answer with."""

    def __init__(self, message: str, code: str = BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one array; ``None`` in a shape is any size."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_wire(cls, raw: object, allow_none: bool = False) -> TensorSpec:
        if not isinstance(raw, Mapping):
            raise ProtocolError("array spec must be a map with name, dtype and shape")
        name, dtype, shape = raw.get("name"), raw.get("dtype"), raw.get("shape")
        if not isinstance(name, str) or not name or len(name) > 256:
            raise ProtocolError("array spec 'name' must be a non-empty string")
        if dtype not in DTYPES:
            raise ProtocolError(f"array '{name}': dtype {dtype!r} is not one of "
                                f"{', '.join(sorted(DTYPES))}")
        if not isinstance(shape, list | tuple) or len(shape) > MAX_NDIM:
            raise ProtocolError(f"array '{name}': shape must be a list of at most {MAX_NDIM} "
                                "dimensions")
        for dim in shape:
            ok_none = dim is None and allow_none
            if not ok_none and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
                raise ProtocolError(f"array '{name}': shape {list(shape)} has a bad dimension")
        return cls(name, str(dtype), tuple(shape))

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    def accepts(self, other: TensorSpec) -> bool:
        """Whether a concrete array spec fits this (possibly partly unknown) spec."""
        if self.dtype != other.dtype or len(self.shape) != len(other.shape):
            return False
        return all(want is None or want == got for want, got in zip(self.shape, other.shape,
                                                                    strict=True))


@dataclass
class Message:
    kind: bytes
    job_id: bytes = b""
    header: dict[str, Any] = field(default_factory=dict)
    arrays: list[Frame] = field(default_factory=list)


def encode(msg: Message) -> list[Frame]:
    """Frames of a message, ready for send_multipart."""
    header = msgpack.packb(msg.header, use_bin_type=True)
    return [VERSION, msg.kind, msg.job_id, header, *msg.arrays]


@dataclass(frozen=True)
class Limits:
    """What one message may hold; the frontend's come from the config."""

    max_header: int = MAX_HEADER
    max_arrays: int = MAX_ARRAYS
    max_elements: int | None = None  # all arrays together


DEFAULT_LIMITS = Limits()
# Between the supervisor and its workers: every job was checked at the door already, and a
# batch of many jobs may hold more arrays and a larger header than one request may.
INTERNAL_HOP = Limits(max_header=16 * 1024**2, max_arrays=1 << 20)


def decode(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse frames into a Message; raise ProtocolError on anything malformed."""
    if len(frames) < 4:
        raise ProtocolError(f"expected at least 4 frames (version, kind, job id, header), "
                            f"got {len(frames)}")
    version = _small(frames[0], 16, "version")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version[:16]!r}; this supervisor "
                            f"speaks {VERSION.decode()}")
    kind = _small(frames[1], 32, "kind")
    if kind not in KINDS:
        raise ProtocolError(f"unknown message kind {kind!r}")
    job_id = _small(frames[2], MAX_JOB_ID, "job id")
    header = _header(frames[3], limits.max_header)
    arrays = list(frames[4:])
    if len(arrays) > limits.max_arrays:
        raise ProtocolError(f"at most {limits.max_arrays} arrays per message, got {len(arrays)}")
    return Message(kind, job_id, header, arrays)


def _small(frame: Frame, limit: int, what: str) -> bytes:
    data = frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)
    if len(data) > limit:
        raise ProtocolError(f"{what} frame is {len(data)} bytes, at most {limit} allowed")
    return data


def _header(frame: Frame, limit: int) -> dict[str, Any]:
    data = _small(frame, limit, "header")
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=MAX_HEADER,
                                 max_bin_len=MAX_HEADER, max_array_len=MAX_BATCH_JOBS,
                                 max_map_len=MAX_BATCH_JOBS)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a msgpack map")
    return header


def split_envelope(frames: Sequence[Frame]) -> tuple[list[Frame], list[Frame]]:
    """Split what a ROUTER received into (routing envelope, message frames).

    DEALER peers send the message directly; REQ peers put an empty delimiter frame first,
    which is kept in the envelope so the reply reaches them.
    """
    if len(frames) >= 2 and _length(frames[1]) == 0:
        return list(frames[:2]), list(frames[2:])
    return list(frames[:1]), list(frames[1:])


def _length(frame: Frame) -> int:
    return len(frame.buffer) if isinstance(frame, zmq.Frame) else len(frame)


def _buffer(frame: Frame) -> memoryview | bytes:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return frame


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[Frame]]:
    """Specs and frames for named arrays; large arrays are passed without copying."""
    specs: list[dict[str, Any]] = []
    frames: list[Frame] = []
    for name, value in arrays.items():
        array = np.asarray(value)
        dtype = wire_dtype(array)
        specs.append(TensorSpec(name, dtype, tuple(array.shape)).to_wire())
        if dtype == STRING:
            frames.append(_pack_strings(name, array))
            continue
        if dtype not in DTYPES:
            raise ProtocolError(f"array '{name}': dtype {dtype} cannot travel")
        array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
        frames.append(memoryview(array.data).cast("B") if array.nbytes >= ZERO_COPY_MIN
                      else array.tobytes())
    return specs, frames


def wire_dtype(array: np.ndarray) -> str:
    """The protocol's dtype name for an array: numpy's, or "string" for str/bytes/object."""
    return STRING if is_string_array(array) else array.dtype.name


def _pack_strings(name: str, array: np.ndarray) -> bytes:
    try:
        return pack_strings(array)
    except TypeError as exc:
        raise ProtocolError(f"array '{name}': {exc}") from None


def unpack_arrays(specs: object, frames: Sequence[Frame],
                  max_elements: int | None = None) -> dict[str, np.ndarray]:
    """Arrays from specs and frames, each checked against its dtype and shape (no copy)."""
    return arrays_from(parse_specs(specs), frames, max_elements)


def arrays_from(parsed: Sequence[TensorSpec], frames: Sequence[Frame],
                max_elements: int | None = None) -> dict[str, np.ndarray]:
    """unpack_arrays for specs already parsed."""
    check_frames(parsed, frames, max_elements)
    out: dict[str, np.ndarray] = {}
    for spec, frame in zip(parsed, frames, strict=True):
        if spec.dtype == STRING:
            out[spec.name] = unpack_strings(_buffer(frame), concrete_shape(spec))
            continue
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        out[spec.name] = np.frombuffer(_buffer(frame), dtype=dtype).reshape(concrete_shape(spec))
    return out


def check_frames(parsed: Sequence[TensorSpec], frames: Sequence[Frame],
                 max_elements: int | None = None) -> None:
    """Each frame's length against its spec's dtype and shape, without building arrays."""
    if len(parsed) != len(frames):
        raise ProtocolError(f"header describes {len(parsed)} arrays but {len(frames)} array "
                            "frames came")
    if max_elements is not None:
        total = sum(math.prod(concrete_shape(s)) for s in parsed)
        if total > max_elements:
            raise ProtocolError(f"{total} elements in all, more than the {max_elements} "
                                "allowed per request")
    for spec, frame in zip(parsed, frames, strict=True):
        if spec.dtype == STRING:
            _check_strings(spec, frame)
            continue
        expected = math.prod(concrete_shape(spec)) * ITEMSIZE[spec.dtype]
        if (length := _length(frame)) != expected:
            raise ProtocolError(f"array '{spec.name}': {length} bytes do not match "
                                f"{spec.dtype} shape {list(spec.shape)} ({expected} bytes)")


def _check_strings(spec: TensorSpec, frame: Frame) -> None:
    try:
        string_lengths(_buffer(frame), math.prod(concrete_shape(spec)))
    except StringFrameError as exc:
        raise ProtocolError(f"array '{spec.name}' (string shape {list(spec.shape)}): "
                            f"{exc}") from None


def concrete_shape(spec: TensorSpec) -> tuple[int, ...]:
    """The shape of an actual array (every dimension known, as unpack_arrays ensures)."""
    return tuple(d or 0 for d in spec.shape)


def parse_specs(specs: object, allow_none: bool = False) -> list[TensorSpec]:
    if not isinstance(specs, list | tuple):
        raise ProtocolError("header field 'inputs'/'outputs' must be a list of array specs")
    parsed = [TensorSpec.from_wire(s, allow_none) for s in specs]
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise ProtocolError("array names must be unique")
    return parsed


def check_specs(specs: Sequence[TensorSpec], got: Sequence[TensorSpec]) -> None:
    """Concrete array specs against a model's input specs: names, dtypes, shapes, one batch
    size. Both the door and the worker check a request from its header alone."""
    wanted = {s.name: s for s in specs}
    names = [g.name for g in got]
    if set(names) != set(wanted):
        expected = "; ".join(s.describe() for s in specs)
        raise ProtocolError(f"inputs {sorted(names)} do not match the model's inputs "
                            f"({expected})")
    batch: set[int] = set()
    for spec in got:
        if not wanted[spec.name].accepts(spec):
            raise ProtocolError(f"input {spec.describe()} does not fit the model's "
                                f"{wanted[spec.name].describe()}")
        if spec.shape and spec.shape[0] is not None:
            batch.add(spec.shape[0])
    if len(batch) > 1:
        raise ProtocolError(f"inputs disagree on the batch size: {sorted(batch)}")


def pack_results(replies: Sequence[Message]) -> Message:
    """The answers to one JOB message as one RESULTS message: one send and one receive per
    batch instead of per job. Each entry names its job, kind and header; the array frames
    follow in entry order."""
    entries = [{"id": r.job_id, "kind": r.kind, "header": r.header, "arrays": len(r.arrays)}
               for r in replies]
    return Message(RESULTS, b"", {"jobs": entries}, [f for r in replies for f in r.arrays])


def unpack_results(msg: Message) -> list[Message]:
    """The per-job answers of a RESULTS message; ProtocolError if it does not add up."""
    entries = msg.header.get("jobs")
    if not isinstance(entries, list):
        raise ProtocolError("results header must hold a 'jobs' list")
    replies, start = [], 0
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kind") not in (RESULT, ERROR):
            raise ProtocolError("each results entry must be a map of kind result or error")
        count, job_id, header = entry.get("arrays"), entry.get("id"), entry.get("header")
        if not isinstance(count, int) or not isinstance(job_id, bytes) or \
                not isinstance(header, dict):
            raise ProtocolError("each results entry needs id (bytes), header and arrays")
        replies.append(Message(entry["kind"], job_id, header, msg.arrays[start:start + count]))
        start += count
    if start != len(msg.arrays):
        raise ProtocolError(f"results entries name {start} arrays, {len(msg.arrays)} came")
    return replies


def error_message(job_id: bytes, code: str, message: str) -> Message:
    return Message(ERROR, job_id, {"code": code, "message": message})
