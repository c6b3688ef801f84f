"""The common batch, taken in one piece: every job with the same array specs.

Why: on the demo MLP under load (batches of ~16 batch-1 jobs) the worker's general path spent
~28 µs of Python per job around the model call (spec parsing and checking, one array view
per job, the concatenation, then per job a slice, a dtype check, a spec and a bytes copy),
as much as the model call itself costs per job at that batch size. Clients of one
model nearly always send the same layout, and the supervisor batches only jobs of one
layout, so the specs of a batch are usually equal, entry for entry.

When they are, the first job is read and checked as the general path reads any job, the
other jobs need only the same specs and the same frame lengths (compared in C: list and dict
equality, ``len``), every input is joined into one buffer and viewed as one array, and
every output is cut per job into byte slices of one buffer under one shared header.

Anything else (differing specs, a frame of the wrong length, padding dimensions, an input
without a batch dimension, string arrays, a model that raises or returns outputs that do
not fit) returns None, and the general path in worker/batch.py answers the batch as it
always has: every job its own result or error, a bad job never failing its mates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from supervisor.shared.protocol import (
    NUMERIC_DTYPES,
    RESULT,
    WIRE_DTYPES,
    ZERO_COPY_MIN,
    JobEntry,
    Message,
    ProtocolError,
    check_specs,
    pack_arrays,
    parse_specs,
    wire_dtype,
)
from supervisor.shared.strings import STRING
from worker.runners import Runner

Arrays = dict[str, np.ndarray]


class BatchFailed(Exception):
    """The uniform batch's model call (or its outputs) failed: the caller isolates the
    culprit job by job, as it does for a failed general batch, without running the whole
    batch a second time."""

    def __init__(self, cause: Exception) -> None:
        super().__init__("the uniform batch failed")  # never str(cause): it may raise
        self.cause = cause


def run_uniform(runner: Runner, entries: list[JobEntry], pad_to: int,
                check: Callable[[Arrays, Arrays], None]) -> list[Message] | None:
    """Every job's RESULT; None when the batch is not uniform (nothing was run); BatchFailed
    when the call failed. ``check``: worker.batch's output check, applied as the general
    path applies it."""
    try:
        joined = _joined(runner, entries, pad_to)
    except Exception:  # MemoryError, say: the general path answers each job with its error
        return None
    if joined is None:
        return None
    arrays, each = joined
    try:
        outputs = runner(arrays)
        check(arrays, outputs)
        return _split(entries, outputs, each)
    except Exception as exc:
        raise BatchFailed(exc) from exc


def _joined(runner: Runner, entries: list[JobEntry], pad_to: int) -> tuple[Arrays, int] | None:
    """The batch's inputs, each job's frames joined into one array, and each job's rows;
    None unless every job has the first job's specs and frame lengths."""
    first = entries[0].inputs
    if runner.padding or not first or any(e.inputs != first for e in entries):
        return None
    layout = _layout(runner, first)
    if layout is None:
        return None
    arrays: Arrays = {}
    count = len(entries)
    for index, (name, dtype, size, tail) in enumerate(layout.inputs):
        frames = [e.arrays[index] for e in entries]
        if any(len(f) != size for f in frames):
            return None
        # zmq.Frame is a buffer (its typing stub does not say so). Joined into a bytearray:
        # the handler gets a writable array, as the general path's concatenation gives it.
        data = frames[0] if count == 1 else bytearray().join(frames)  # type: ignore[arg-type]
        array = np.frombuffer(data, dtype=dtype)  # type: ignore[arg-type]
        arrays[name] = _padded(array.reshape(count * layout.rows, *tail), pad_to)
    return arrays, layout.rows


@dataclass(frozen=True)
class Layout:
    """How one job's arrays of given specs are read: per input its name, wire dtype, bytes
    and shape past the first dimension; and the rows every input shares."""

    inputs: tuple[tuple[str, np.dtype[Any], int, tuple[int, ...]], ...]
    rows: int


def _layout(runner: Runner, wire: list[dict[str, Any]]) -> Layout | None:
    """The layout of jobs with these wire specs, None when they cannot take this path (the
    general path reads, and refuses, what does not parse)."""
    try:
        specs = parse_specs(wire)
        if runner.client_inputs is not None:
            check_specs(runner.client_inputs, specs)
    except ProtocolError:
        return None
    if any(s.dtype == STRING or not s.shape for s in specs):
        return None
    rows = specs[0].shape[0]
    if not rows or any(s.shape[0] != rows for s in specs):
        return None
    inputs = []
    for spec in specs:
        dtype = WIRE_DTYPES[spec.dtype]
        inputs.append((spec.name, dtype, spec.elements * dtype.itemsize,
                       tuple(spec.concrete[1:])))
    return Layout(tuple(inputs), rows)


def _padded(array: np.ndarray, size: int) -> np.ndarray:
    """Up to ``size`` rows by repeating the last row, as worker.batch.combine pads."""
    missing = size - len(array)
    if missing <= 0:
        return array
    return np.concatenate([array, np.repeat(array[-1:], missing, axis=0)], axis=0)


def _split(entries: list[JobEntry], outputs: Arrays, each: int) -> list[Message]:
    """One RESULT per job: ``each`` rows of every output, in entry order. Numeric outputs are
    cut as byte slices of one buffer under one header shared by every job; anything else
    (strings) is packed job by job."""
    form = _form(outputs, each)
    if form is None:
        replies = []
        for i, entry in enumerate(entries):
            own = {name: array[i * each:(i + 1) * each] for name, array in outputs.items()}
            own_specs, frames = pack_arrays(own)
            replies.append(Message(RESULT, entry.id, {"outputs": own_specs}, frames))
        return replies
    count = len(entries)
    rows = each * count
    pieces: list[list[Any]] = []
    for (dtype, step), value in zip(form.outputs, outputs.values(), strict=True):
        if step == 0:  # an output with a dimension of 0 (no detections, say)
            pieces.append([b""] * count)
            continue
        array = np.ascontiguousarray(value[:rows], dtype=dtype)
        # Slices of a memoryview share the array (no copy) where pyzmq sends without one.
        data: Any = (array.reshape(-1).view(np.uint8).data if step >= ZERO_COPY_MIN
                     else array.tobytes())
        pieces.append([data[i:i + step] for i in range(0, step * count, step)])
    return [Message(RESULT, entry.id, form.header, [piece[i] for piece in pieces], form.packed)
            for i, entry in enumerate(entries)]


@dataclass(frozen=True)
class Form:
    """The shared answer of a uniform batch's jobs: its header (packed once, and passed on
    as packed), and per output the wire's dtype and the bytes of one job's rows."""

    header: dict[str, Any]
    packed: bytes
    outputs: tuple[tuple[np.dtype[Any], int], ...]


def _form(outputs: Arrays, each: int) -> Form | None:
    """The form of numeric outputs cut ``each`` rows a job; None when one is not numeric."""
    if not all(wire_dtype(a) in NUMERIC_DTYPES for a in outputs.values()):
        return None
    specs: list[dict[str, Any]] = []
    layout = []
    for name, value in outputs.items():
        wire = wire_dtype(value)
        dtype = WIRE_DTYPES[wire]
        tail = list(value.shape[1:])
        specs.append({"name": name, "dtype": wire, "shape": [each, *tail]})
        layout.append((dtype, dtype.itemsize * math.prod(tail) * each))
    header = {"outputs": specs}
    return Form(header, msgpack.packb(header, use_bin_type=True), tuple(layout))
