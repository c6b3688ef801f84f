"""Message framing, version 1: the frames every message has, their limits, the message kinds
and error codes, and ProtocolError for anything that does not follow them.

Every message is a ZeroMQ multipart message::

    [b"TFS1", kind, job_id, header, array_0, array_1, ...]

``kind`` is ASCII, ``job_id`` opaque bytes (at most 64), ``header`` a msgpack map, and each
array one raw frame (supervisor/shared/arrays.py). The same layout serves the client hop, the
worker hop (supervisor/shared/hop.py) and the control socket. See docs/protocol.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

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

# pyzmq copies frames smaller than this anyway; larger ones are sent without a copy.
ZERO_COPY_MIN = 64 * 1024

Frame = bytes | memoryview | zmq.Frame


class ProtocolError(Exception):
    """A message that does not follow the protocol. ``code`` is an error code to answer with."""

    def __init__(self, message: str, code: str = BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


def show_value(value: object, limit: int = 60) -> str:
    """A short, safe rendering of a received value for an error message: never raises, never
    long (a hostile header may hold huge nested values or ints too long to print)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:  # deep nesting (RecursionError), ints past str()'s digit limit, ...
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
    header = parse_header(frames[3], limits.max_header)
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
    return bytes(frame_buffer(frame)[:size])


def _small(frame: Frame, limit: int, what: str) -> bytes:
    # Received metadata frames are bytes already (transport.recv): no call to find that out
    data = frame if type(frame) is bytes else frame_bytes(frame)
    if len(data) > limit:
        raise ProtocolError(f"{what} frame is {len(data)} bytes, at most {limit} allowed")
    return data


def parse_header(frame: Frame, limit: int) -> dict[str, Any]:
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
        said = str(exc)[:160]  # empty for some (FormatError: truncated data, StackError)
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__}"
                            f"{': ' + said if said else ''})") from None
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


def frame_buffer(frame: Frame) -> memoryview | bytes:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return frame


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
