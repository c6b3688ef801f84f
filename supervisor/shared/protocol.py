"""The wire protocol, version 1, in one import: encode/decode pairs, ProtocolError on bad input.

Every message is a ZeroMQ multipart message::

    [b"TFS1", kind, job_id, header, array_0, array_1, ...]

``kind`` is ASCII, ``job_id`` opaque bytes (at most 64), ``header`` a msgpack map, and each
array one raw frame (C order, little-endian) described by an entry of the header's
``inputs`` or ``outputs`` list: ``{"name", "dtype", "shape"}``. The same layout serves the
client hop, the worker hop and the control socket. See docs/protocol.md.

Three modules, one job each: supervisor/shared/wire.py frames a message (kinds, limits, error
codes), supervisor/shared/arrays.py puts arrays in frames and checks them against their
specs, supervisor/shared/hop.py carries batches between the supervisor and its workers.
"""

from __future__ import annotations

from supervisor.shared.arrays import (
    DTYPES,
    ITEMSIZE,
    NUMERIC_DTYPES,
    OBJECT_ITEMSIZE,
    WIRE_DTYPES,
    WIRE_ORDER,
    TensorSpec,
    arrays_from,
    batch_rows,
    check_frames,
    check_specs,
    pack_arrays,
    parse_specs,
    unpack_arrays,
    wire_dtype,
)
from supervisor.shared.hop import (
    SECRET,
    JobEntry,
    pack_job,
    pack_results,
    readable_job_ids,
    signed,
    signed_by,
    unpack_job,
    unpack_results,
)
from supervisor.shared.wire import (
    BAD_REQUEST,
    CONTROL,
    DEADLINE_EXCEEDED,
    DEFAULT_LIMITS,
    ERROR,
    ERROR_CODES,
    HEARTBEAT,
    INFER,
    INTERNAL,
    INTERNAL_HOP,
    JOB,
    KINDS,
    MAX_ARRAY_BYTES,
    MAX_ARRAYS,
    MAX_BATCH_JOBS,
    MAX_ERROR_TEXT,
    MAX_HEADER,
    MAX_JOB_ID,
    MAX_NAME,
    MAX_NDIM,
    MODELS,
    OVERLOADED,
    READY,
    RESULT,
    RESULTS,
    SHUTTING_DOWN,
    STOP,
    TIMEOUT,
    UNAVAILABLE,
    UNKNOWN_MODEL,
    VERSION,
    WORKER_CRASHED,
    ZERO_COPY_MIN,
    Frame,
    Limits,
    Message,
    ProtocolError,
    bound_text,
    decode,
    encode,
    error_message,
    frame_buffer,
    frame_bytes,
    frame_head,
    frame_length,
    parse_header,
    show_value,
    split_envelope,
)

__all__ = [
    "BAD_REQUEST", "CONTROL", "DEADLINE_EXCEEDED", "DEFAULT_LIMITS", "DTYPES", "ERROR",
    "ERROR_CODES", "HEARTBEAT", "INFER", "INTERNAL", "INTERNAL_HOP", "ITEMSIZE", "JOB",
    "KINDS", "MAX_ARRAYS", "MAX_ARRAY_BYTES", "MAX_BATCH_JOBS", "MAX_ERROR_TEXT", "MAX_HEADER",
    "MAX_JOB_ID", "MAX_NAME", "MAX_NDIM", "MODELS", "NUMERIC_DTYPES", "OBJECT_ITEMSIZE",
    "OVERLOADED", "READY", "RESULT", "RESULTS", "SECRET", "SHUTTING_DOWN", "STOP", "TIMEOUT",
    "UNAVAILABLE", "UNKNOWN_MODEL", "VERSION", "WIRE_DTYPES", "WIRE_ORDER", "WORKER_CRASHED",
    "ZERO_COPY_MIN", "Frame", "JobEntry", "Limits", "Message", "ProtocolError", "TensorSpec",
    "arrays_from", "batch_rows", "bound_text", "check_frames", "check_specs", "decode",
    "encode", "error_message", "frame_buffer", "frame_bytes", "frame_head", "frame_length",
    "pack_arrays", "pack_job", "pack_results", "parse_header", "parse_specs",
    "readable_job_ids", "show_value", "signed", "signed_by", "split_envelope",
    "unpack_arrays", "unpack_job", "unpack_results", "wire_dtype",
]
