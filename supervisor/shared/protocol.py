"""The wire protocol, version 1: one module, encode/decode pairs, ProtocolError on bad input.

Every message is a ZeroMQ multipart message::

    [b"TFS1", kind, job_id, header, array_0, array_1, ...]

``kind`` is ASCII, ``job_id`` opaque bytes (at most 64), ``header`` a msgpack map, and each
array one raw frame (C order, little-endian) described by an entry of the header's
``inputs`` or ``outputs`` list: ``{"name", "dtype", "shape"}``. The same layout serves the
client hop, the worker hop and the control socket. See docs/protocol.md.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack
import numpy as np
import zmq

from supervisor.shared.strings import (
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
MAX_NAME = 256
# No array may claim more bytes than numpy (and TensorFlow's int64 sizes) can address, even
# one with no elements: numpy refuses shapes like [0, 2**62, 4] when it builds the array.
MAX_ARRAY_BYTES = 2**63 - 1
# Error texts are cut to this many characters where they are made (error_message): a reply
# must fit the client's 64 KiB header limit, whatever a model's exception says.
MAX_ERROR_TEXT = 4096
# Longest list or map in a header: it bounds the jobs of one batch (max_batch_size).
MAX_BATCH_JOBS = 4096

# Plain numbers, and strings in their own frame layout (supervisor/shared/strings.py); no object,
# void or datetime dtypes: nothing that would need unpickling or evaluating.
NUMERIC_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                            "uint32", "uint64", "float16", "float32", "float64", "complex64",
                            "complex128"})
DTYPES = NUMERIC_DTYPES | {STRING}

ITEMSIZE = {name: np.dtype(name).itemsize for name in NUMERIC_DTYPES}
OBJECT_ITEMSIZE = np.dtype(object).itemsize  # a string array is an object array in numpy
# Each numeric dtype as its bytes travel (little-endian), and the set of them: an array of
# one of these is sent as it is.
WIRE_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in NUMERIC_DTYPES}
WIRE_ORDER = frozenset(WIRE_DTYPES.values())

# pyzmq copies frames smaller than this anyway; larger ones are sent without a copy.
ZERO_COPY_MIN = 64 * 1024

Frame = bytes | memoryview | zmq.Frame


class ProtocolError(Exception):
    """A message that does not follow the protocol. ``code`` is an error code to answer with."""

    def __init__(self, message: str, code: str = BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


def _show(value: object, limit: int = 60) -> str:
    """A short, safe rendering of a received value for an error message: never raises, never
    long (a hostile header may hold huge nested values or ints too long to print)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # deep nesting (RecursionError), ints past str()'s digit limit, ...
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
        """Parse one header entry; ProtocolError (never another error) on any hostile value."""
        if not isinstance(raw, Mapping):
            raise ProtocolError(f"array spec must be a map with name, dtype and shape, got "
                                f"{_show(raw)}")
        name, dtype, shape = raw.get("name"), raw.get("dtype"), raw.get("shape")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ProtocolError(f"array spec 'name' must be a non-empty string of at most "
                                f"{MAX_NAME} characters, got {_show(name)}")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ProtocolError(f"array '{name}': dtype {_show(dtype)} is not one of "
                                f"{', '.join(sorted(DTYPES))}")
        if not isinstance(shape, list | tuple) or len(shape) > MAX_NDIM:
            raise ProtocolError(f"array '{name}': shape must be a list of at most {MAX_NDIM} "
                                f"dimensions, got {_show(shape)}")
        for dim in shape:
            ok_none = dim is None and allow_none
            if not ok_none and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
                raise ProtocolError(f"array '{name}': shape {_show(list(shape))} has a bad "
                                    f"dimension {_show(dim)}")
        # Every dimension counts, zeros as ones: numpy refuses [0, 2**62, 4] as it does
        # [2**62, 4], and a spec that could never become an array is refused here.
        itemsize = ITEMSIZE.get(dtype, OBJECT_ITEMSIZE)
        if math.prod(max(d or 1, 1) for d in shape) * itemsize > MAX_ARRAY_BYTES:
            raise ProtocolError(f"array '{name}': shape {_show(list(shape))} is too large "
                                f"(more than 2**63-1 bytes of {dtype})")
        return cls(name, dtype, tuple(shape))

    # Both kept once computed: a spec parsed once (parse_specs remembers them) is checked
    # against the frames of every reply or request it describes, and working them out each
    # time was a third of unpacking a small array (measured: check_frames 1.1 -> 0.66 µs).
    @cached_property
    def concrete(self) -> tuple[int, ...]:
        """The shape of an actual array: an unknown dimension (a model's spec) counts as 0."""
        return tuple(d or 0 for d in self.shape)

    @cached_property
    def elements(self) -> int:
        return math.prod(self.concrete)

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
    # The header packed, when it is at hand already: as it came, when it is passed on as it
    # came (a worker's answer to its client: unpack_results), or packed once for many
    # answers (worker/uniform.py); encode and pack_results send these bytes rather than
    # packing it again. Whoever sets it never changes ``header`` afterwards.
    packed: bytes | None = field(default=None, compare=False, repr=False)


def encode(msg: Message) -> list[Frame]:
    """Frames of a message, ready for send_multipart."""
    header = msg.packed if msg.packed is not None else msgpack.packb(msg.header,
                                                                      use_bin_type=True)
    return [VERSION, msg.kind, msg.job_id, header, *msg.arrays]


@dataclass(frozen=True)
class Limits:
    """What one message may hold; the frontend's come from the config."""

    max_header: int = MAX_HEADER
    max_arrays: int = MAX_ARRAYS
    max_elements: int | None = None  # all arrays together


DEFAULT_LIMITS = Limits()
# Between the supervisor and its workers: every job was checked at admission already, and a
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


def frame_bytes(frame: Frame) -> bytes:
    """A frame's bytes: a bytes frame as it is, a zmq.Frame's cached copy, a view copied."""
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


def frame_head(frame: Frame, size: int) -> bytes:
    """The first ``size`` bytes of a frame, without copying the rest (a hostile frame may be
    as large as the message limit)."""
    return bytes(_buffer(frame)[:size])


def _small(frame: Frame, limit: int, what: str) -> bytes:
    # Received metadata frames are bytes already (transport.recv): no call to find that out
    data = frame if type(frame) is bytes else frame_bytes(frame)
    if len(data) > limit:
        raise ProtocolError(f"{what} frame is {len(data)} bytes, at most {limit} allowed")
    return data


def _header(frame: Frame, limit: int) -> dict[str, Any]:
    data = _small(frame, limit, "header")
    try:
        # Strings and bytes may be as long as the header itself may be: on the internal hop
        # (16 MiB) a RESULTS message may carry a long error text.
        header = msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=limit,
                                 max_bin_len=limit, max_array_len=MAX_BATCH_JOBS,
                                 max_map_len=MAX_BATCH_JOBS)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        # msgpack's own text names the bound or rule (e.g. "5000 exceeds max_array_len(4096)",
        # "int is not allowed for map key"), never the data
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__}: "
                            f"{str(exc)[:160]})") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a msgpack map")
    return header


def split_envelope(frames: Sequence[Frame]) -> tuple[list[Frame], list[Frame]]:
    """Split what a ROUTER received into (routing envelope, message frames).

    DEALER peers send the message directly; REQ peers put an empty delimiter frame first,
    which is kept in the envelope so the reply reaches them.
    """
    if len(frames) >= 2 and frame_length(frames[1]) == 0:
        return list(frames[:2]), list(frames[2:])
    return list(frames[:1]), list(frames[1:])


def frame_length(frame: Frame) -> int:
    """Bytes in a frame: a zmq.Frame's length is its size, read in C (its ``buffer``
    builds a memoryview first)."""
    return len(frame)


def _buffer(frame: Frame) -> memoryview | bytes:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return frame


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[Frame]]:
    """Specs and frames for named arrays; large arrays are passed without copying."""
    specs: list[dict[str, Any]] = []
    frames: list[Frame] = []
    for name, value in arrays.items():
        array = value if type(value) is np.ndarray else np.asarray(value)
        dtype = wire_dtype(array)
        specs.append({"name": name, "dtype": dtype, "shape": list(array.shape)})
        if dtype == STRING:
            frames.append(_pack_strings(name, array))
            continue
        if dtype not in DTYPES:
            raise ProtocolError(f"array '{name}': dtype {dtype} cannot travel")
        if array.dtype not in WIRE_ORDER or not array.flags.c_contiguous:
            array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
        frames.append(memoryview(array.data).cast("B") if array.nbytes >= ZERO_COPY_MIN
                      else array.tobytes())
    return specs, frames


# numpy computes dtype.name in Python on every access (~2 µs, for every array of every
# message): the numeric dtypes an array is sent as it is (WIRE_ORDER) are named from a table.
_WIRE_NAMES = {WIRE_DTYPES[name]: name for name in NUMERIC_DTYPES}


def wire_dtype(array: np.ndarray) -> str:
    """The protocol's dtype name for an array: numpy's, or "string" for str/bytes/object."""
    name = _WIRE_NAMES.get(array.dtype)
    if name is None:
        name = STRING if is_string_array(array) else array.dtype.name
    return name


def _pack_strings(name: str, array: np.ndarray) -> bytes:
    try:
        return pack_strings(array)
    except TypeError as exc:
        raise ProtocolError(f"array '{name}': {exc}") from None


def unpack_arrays(specs: object, frames: Sequence[Frame], max_elements: int | None = None,
                  field: str = "inputs") -> dict[str, np.ndarray]:
    """Arrays from specs and frames, each checked against its dtype and shape (no copy)."""
    return arrays_from(parse_specs(specs, field=field), frames, max_elements)


def arrays_from(parsed: Sequence[TensorSpec], frames: Sequence[Frame],
                max_elements: int | None = None) -> dict[str, np.ndarray]:
    """unpack_arrays for specs already parsed."""
    check_frames(parsed, frames, max_elements)
    out: dict[str, np.ndarray] = {}
    for spec, frame in zip(parsed, frames, strict=True):
        if spec.dtype == STRING:
            out[spec.name] = unpack_strings(_buffer(frame), spec.concrete)
            continue
        dtype = WIRE_DTYPES[spec.dtype]
        out[spec.name] = np.frombuffer(_buffer(frame), dtype=dtype).reshape(spec.concrete)
    return out


def check_frames(parsed: Sequence[TensorSpec], frames: Sequence[Frame],
                 max_elements: int | None = None) -> None:
    """Each frame's length against its spec's dtype and shape, without building arrays."""
    if len(parsed) != len(frames):
        raise ProtocolError(f"header describes {len(parsed)} arrays but {len(frames)} array "
                            "frames came")
    if max_elements is not None:
        total = sum(s.elements for s in parsed)
        if total > max_elements:
            raise ProtocolError(f"{total} elements in all, more than the {max_elements} "
                                "allowed per request")
    for spec, frame in zip(parsed, frames, strict=True):
        if spec.dtype == STRING:
            _check_strings(spec, frame)
            continue
        itemsize = ITEMSIZE.get(spec.dtype)
        if itemsize is None:  # a spec made in code, not by from_wire
            raise ProtocolError(f"array '{spec.name}': dtype {_show(spec.dtype)} cannot travel")
        expected = spec.elements * itemsize
        if (length := frame_length(frame)) != expected:
            raise ProtocolError(f"array '{spec.name}': {length} bytes do not match "
                                f"{spec.dtype} shape {list(spec.shape)} ({expected} bytes)")


def _check_strings(spec: TensorSpec, frame: Frame) -> None:
    try:
        string_lengths(_buffer(frame), spec.elements)
    except StringFrameError as exc:
        raise ProtocolError(f"array '{spec.name}' (string shape {list(spec.shape)}): "
                            f"{exc}") from None


def batch_rows(specs: Sequence[TensorSpec]) -> int | None:
    """The first dimension all arrays of one job share: its rows in a batch. None when there
    is none: no arrays, a 0-d array, an unknown first dimension, or arrays that disagree.
    Such a job must never be concatenated with another (its rows could not be split back)."""
    firsts = {spec.shape[0] if spec.shape else None for spec in specs}
    if len(firsts) != 1:
        return None
    return next(iter(firsts))


def parse_specs(specs: object, allow_none: bool = False, field: str = "inputs",
                keep: bool = True) -> list[TensorSpec]:
    """``field``: the header field the specs came from, as an error names it. Specs of plain
    values parsed once are remembered (a client reads the same output specs in every reply):
    the key holds every value the parse depends on, so a hit is what parsing would give.
    ``keep=False``: only look them up; the caller keeps them (keep_specs) once they proved
    to be what it wanted (admission: a description that passed), so a refused request's
    specs are not kept."""
    key = specs_key(specs, allow_none)
    if key is not None and (known := _PARSED.get(key)) is not None:
        return list(known)
    parsed = _parse_specs(specs, allow_none, field)
    if keep:
        keep_specs(specs, parsed, allow_none)
    return parsed


def keep_specs(specs: object, parsed: Sequence[TensorSpec], allow_none: bool = False) -> None:
    """Remember ``parsed`` as what ``specs`` parse to (the caller parsed them so)."""
    key = specs_key(specs, allow_none)
    if key is not None and len(_PARSED) < _PARSED_MAX:
        _PARSED[key] = tuple(parsed)


_PARSED: dict[tuple[Any, ...], tuple[TensorSpec, ...]] = {}
_PARSED_MAX = 1024


def specs_key(specs: object, allow_none: bool = False) -> tuple[Any, ...] | None:
    """``(allow_none, (name, dtype, shape), ...)`` when every spec is a map of a str name, a
    str dtype and a list of ints (and Nones), at most MAX_ARRAYS of them; None for anything
    else, which is parsed (and refused) the long way. Exact types only: a bool is not an int
    here."""
    # No message carries more arrays than MAX_ARRAYS, so a longer list is never remembered:
    # else 1024 refused headers of ~2,000 specs each kept ~650 MiB for good in a supervisor.
    if type(specs) is not list or len(specs) > MAX_ARRAYS:
        return None
    key: list[Any] = [allow_none]
    for spec in specs:
        if type(spec) is not dict:
            return None
        name, dtype, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
        if type(name) is not str or type(dtype) is not str or type(shape) is not list:
            return None
        if len(shape) > MAX_NDIM:
            return None
        dims = tuple(shape)
        for dim in dims:  # a loop, not all() over a generator: a third of the walk's time
            if type(dim) is not int and dim is not None:
                return None
        key.append((name, dtype, dims))
    return tuple(key)


def _parse_specs(specs: object, allow_none: bool, field: str) -> list[TensorSpec]:
    if not isinstance(specs, list | tuple):
        got = "missing" if specs is None else f"got {type(specs).__name__}"
        raise ProtocolError(f"header field '{field}' must be a list of array specs ({got})")
    parsed = [TensorSpec.from_wire(s, allow_none) for s in specs]
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise ProtocolError("array names must be unique")
    return parsed


def check_specs(specs: Sequence[TensorSpec], got: Sequence[TensorSpec]) -> None:
    """Concrete array specs against a model's input specs: names, dtypes, shapes, one batch
    size. Both admission and the worker check a request from its header alone."""
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


@dataclass
class JobEntry:
    """One job of a JOB message (supervisor -> worker): its id, wire specs and frames."""

    id: bytes
    inputs: list[dict[str, Any]]
    arrays: list[Frame]


def pack_job(entries: Sequence[JobEntry], pad_to: int) -> Message:
    """One batch for a worker as one JOB message: header ``{"jobs": [{"id": str, "inputs":
    [spec, ...]}, ...], "pad_to": int}``, then every job's array frames in entry order (passed
    through without a copy). Ids travel as ASCII text (the supervisor's own job numbers)."""
    if isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 0:
        raise ProtocolError(f"pad_to must be a non-negative integer, got {_show(pad_to)}",
                            INTERNAL)
    jobs: list[dict[str, Any]] = []
    frames: list[Frame] = []
    for entry in entries:
        if len(entry.inputs) != len(entry.arrays):
            raise ProtocolError(f"job {entry.id!r}: {len(entry.inputs)} specs but "
                                f"{len(entry.arrays)} frames", INTERNAL)
        try:
            job_id = entry.id.decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError(f"job id {entry.id!r} is not ASCII", INTERNAL) from None
        jobs.append({"id": job_id, "inputs": entry.inputs})
        frames.extend(entry.arrays)
    return Message(JOB, b"", {"jobs": jobs, "pad_to": pad_to}, frames)


def unpack_job(msg: Message) -> tuple[list[JobEntry], int]:
    """The jobs of a JOB message and the rows to pad the batch to; ProtocolError when the
    header is malformed or the frame counts do not add up. Each job's specs are checked
    only for their framing (a list of maps): their contents are the job's own business, so
    a bad one fails that job alone (parse_specs)."""
    raw_jobs, pad_to = msg.header.get("jobs"), msg.header.get("pad_to")
    if not isinstance(raw_jobs, list):
        raise ProtocolError("job header must hold a 'jobs' list", INTERNAL)
    if isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 0:
        raise ProtocolError(f"job header 'pad_to' must be a non-negative integer, got "
                            f"{_show(pad_to)}", INTERNAL)
    entries: list[JobEntry] = []
    seen: set[bytes] = set()
    start = 0
    for raw in raw_jobs:
        if not isinstance(raw, dict):
            raise ProtocolError(f"each job entry must be a map, got {_show(raw)}", INTERNAL)
        job_id = _wire_job_id(raw.get("id"))
        if job_id in seen:
            raise ProtocolError(f"job id {job_id!r} appears twice", INTERNAL)
        seen.add(job_id)
        inputs = raw.get("inputs")
        if not isinstance(inputs, list) or not all(isinstance(s, dict) for s in inputs):
            raise ProtocolError(f"job {job_id!r}: 'inputs' must be a list of array specs",
                                INTERNAL)
        if start + len(inputs) > len(msg.arrays):
            raise ProtocolError(f"job {job_id!r} names {len(inputs)} arrays, but only "
                                f"{len(msg.arrays) - start} remain of the {len(msg.arrays)} "
                                "that came", INTERNAL)
        entries.append(JobEntry(job_id, inputs, list(msg.arrays[start:start + len(inputs)])))
        start += len(inputs)
    if start != len(msg.arrays):
        raise ProtocolError(f"job entries name {start} arrays, {len(msg.arrays)} came",
                            INTERNAL)
    return entries, pad_to


def readable_job_ids(msg: Message) -> list[bytes]:
    """The ids a JOB message names, as far as they can be read (each once, in order): whom
    to answer when unpack_job refuses the message, so no job is stranded in flight."""
    raw_jobs = msg.header.get("jobs")
    ids: list[bytes] = []
    for raw in raw_jobs if isinstance(raw_jobs, list) else []:
        try:
            job_id = _wire_job_id(raw.get("id") if isinstance(raw, dict) else None)
        except ProtocolError:
            continue
        if job_id not in ids:
            ids.append(job_id)
    return ids


def _wire_job_id(raw: object) -> bytes:
    if not isinstance(raw, str) or not raw or len(raw) > MAX_JOB_ID or not raw.isascii():
        raise ProtocolError(f"job id must be 1 to {MAX_JOB_ID} ASCII characters, got "
                            f"{_show(raw)}", INTERNAL)
    return raw.encode("ascii")


def pack_results(replies: Sequence[Message], leaving: bool = False) -> Message:
    """The answers to one JOB message as one RESULTS message: one send and one receive per
    batch instead of per job. Each entry names its job, kind and header; the array frames
    follow in entry order. ``leaving``: the worker exits right after this message (its
    handler asked to be recycled), so it must be sent nothing more.

    Each header travels packed, as the client will get it: the supervisor passes it on
    without unpacking and packing it again per job (2.7 -> ~1 µs a reply, warm), and the
    header a batch's jobs share is packed once (a reply that carries its header packed
    already, as worker/uniform.py's do, is sent as it is)."""
    packed: dict[int, bytes] = {}  # by id(): every header here is alive until we return
    entries = []
    for r in replies:
        own = r.packed if r.packed is not None else packed.get(id(r.header))
        if own is None:
            own = packed[id(r.header)] = msgpack.packb(r.header, use_bin_type=True)
        entries.append({"id": r.job_id, "kind": r.kind, "header": own,
                        "arrays": len(r.arrays)})
    header: dict[str, Any] = {"jobs": entries}
    if leaving:
        header["leaving"] = True
    return Message(RESULTS, b"", header, [f for r in replies for f in r.arrays])


def unpack_results(msg: Message) -> tuple[list[Message], bool]:
    """The per-job answers of a RESULTS message, and whether the worker is leaving;
    ProtocolError if it does not add up."""
    entries = msg.header.get("jobs")
    if not isinstance(entries, list):
        raise ProtocolError("results header must hold a 'jobs' list")
    leaving = msg.header.get("leaving", False)
    if not isinstance(leaving, bool):
        raise ProtocolError(f"results header 'leaving' must be true or false, got "
                            f"{_show(leaving)}")
    replies: list[Message] = []
    headers: dict[bytes, dict[str, Any]] = {}  # each distinct header unpacked once
    start = 0
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kind") not in (RESULT, ERROR):
            raise ProtocolError("each results entry must be a map of kind result or error")
        count, job_id, packed = entry.get("arrays"), entry.get("id"), entry.get("header")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0 or \
                not isinstance(job_id, bytes) or not isinstance(packed, bytes):
            raise ProtocolError("each results entry needs id (bytes), header (a packed map) "
                                "and arrays (a count >= 0)")
        if start + count > len(msg.arrays):
            raise ProtocolError(f"results entry {job_id!r} names {count} arrays, but only "
                                f"{len(msg.arrays) - start} remain of the {len(msg.arrays)} "
                                "that came")
        header = headers.get(packed)
        if header is None:
            header = headers[packed] = _header(packed, INTERNAL_HOP.max_header)
        replies.append(Message(entry["kind"], job_id, header, msg.arrays[start:start + count],
                               packed))
        start += count
    if start != len(msg.arrays):
        raise ProtocolError(f"results entries name {start} arrays, {len(msg.arrays)} came")
    return replies, leaving


# Worker -> supervisor messages carry the worker's spawn secret in this header field: a peer
# on the backend is a worker because it holds the secret it was spawned with, not because it
# says so (supervisor/config/worker_spec.py hands it over in the worker's environment).
SECRET = "secret"


def signed(msg: Message, secret: str) -> Message:
    msg.header[SECRET] = secret
    return msg


def signed_by(msg: Message, secret: str | None) -> bool:
    given = msg.header.get(SECRET)
    return secret is not None and isinstance(given, str) and \
        hmac.compare_digest(given.encode(), secret.encode())


def error_message(job_id: bytes, code: str, message: str) -> Message:
    """An ERROR reply. The text is cut to MAX_ERROR_TEXT characters, the cut said at its
    end, so any reply fits a client's header limit whatever an exception said."""
    return Message(ERROR, job_id, {"code": code, "message": bound_text(message)})


def bound_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """``text`` if it has at most ``limit`` characters; else its head and a note of how many
    characters were cut, ``limit`` characters in all."""
    text = str(text)
    if len(text) <= limit:
        return text
    # The note's length depends on the count it names; size it for the longest count.
    width = len(_cut_note(len(text)))
    keep = max(limit - width, 0)
    return text[:keep] + _cut_note(len(text) - keep)


def _cut_note(cut: int) -> str:
    return f"... [{cut} more characters cut]"
