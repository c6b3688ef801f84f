"""Batch assembly in the worker: unpack each job, concatenate rows, pad, run once, split.

A job whose arrays are malformed is answered alone and never joins its batch; if the
combined run fails, each job is run on its own, so one bad input cannot fail its mates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor.protocol import (
    BAD_REQUEST,
    INTERNAL,
    RESULT,
    Frame,
    Message,
    ProtocolError,
    arrays_from,
    check_specs,
    error_message,
    pack_arrays,
    parse_specs,
)
from worker.runners import Runner

Arrays = dict[str, np.ndarray]


@dataclass
class Part:
    job_id: bytes
    inputs: Arrays
    rows: int


def run_batch(runner: Runner, msg: Message) -> list[Message]:
    """Every job of a JOB message answered: a RESULT or an ERROR each."""
    replies: list[Message] = []
    parts: list[Part] = []
    frames = list(msg.arrays)
    for entry in msg.header.get("jobs", []):
        job_id = str(entry.get("id", "")).encode()
        count = len(entry.get("inputs") or [])
        own, frames = frames[:count], frames[count:]
        part = _unpack(runner, job_id, entry.get("inputs"), own, replies)
        if part is not None:
            parts.append(part)
    if parts:
        replies.extend(_run(runner, parts, int(msg.header.get("pad_to") or 0)))
    return replies


def _unpack(runner: Runner, job_id: bytes, specs: object, frames: list[Frame],
            replies: list[Message]) -> Part | None:
    try:
        parsed = parse_specs(specs)
        if runner.inputs is not None:  # defence in depth: the door checked when it knew
            check_specs(runner.inputs, parsed)
        inputs = arrays_from(parsed, frames)
    except ProtocolError as exc:
        replies.append(error_message(job_id, BAD_REQUEST, str(exc)))
        return None
    first = next(iter(inputs.values()), None)
    rows = int(first.shape[0]) if first is not None and first.ndim else 1
    return Part(job_id, inputs, rows)


def _run(runner: Runner, parts: list[Part], pad_to: int) -> list[Message]:
    try:
        return _call(runner, parts, pad_to)
    except Exception as exc:
        if len(parts) == 1:
            code = BAD_REQUEST if type(exc).__name__ == "InvalidArgumentError" else INTERNAL
            return [error_message(parts[0].job_id, code,
                                  f"model raised {type(exc).__name__}: {exc}")]
    # The batch failed: isolate the culprit by running each job alone.
    return [reply for part in parts for reply in _run(runner, [part], pad_to=0)]


def _call(runner: Runner, parts: list[Part], pad_to: int) -> list[Message]:
    rows = sum(p.rows for p in parts)
    inputs = combine(parts, max(pad_to, rows))
    outputs = runner(inputs)
    check_outputs(inputs, outputs)
    replies = []
    start = 0
    for part in parts:
        own = {name: array[start:start + part.rows] for name, array in outputs.items()}
        start += part.rows
        specs, frames = pack_arrays(own)
        replies.append(Message(RESULT, part.job_id, {"outputs": specs}, frames))
    return replies


def combine(parts: list[Part], size: int) -> Arrays:
    """Rows of every part in order, padded to ``size`` by repeating the last row (a valid
    input, unlike zeros for some models). One unpadded part is passed as it is (no copy)."""
    rows = sum(p.rows for p in parts)
    if len(parts) == 1 and size == rows:
        return parts[0].inputs
    combined = {}
    for name in parts[0].inputs:
        pieces = [p.inputs[name] for p in parts]
        if size > rows:
            last = pieces[-1][-1:]
            pieces.append(np.repeat(last, size - rows, axis=0))
        combined[name] = np.concatenate(pieces, axis=0)
    return combined


def check_outputs(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    if not outputs:
        raise ValueError("the model returned no outputs")
    batch = {a.shape[0] for a in inputs.values() if a.ndim}
    for name, array in outputs.items():
        if batch and (array.ndim == 0 or array.shape[0] not in batch):
            raise ValueError(f"output '{name}' has shape {array.shape}, whose first dimension "
                             f"is not the batch size {sorted(batch)}")
