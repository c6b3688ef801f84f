"""Batch assembly in the worker: unpack each job, concatenate rows, pad, run once, split.

A job whose arrays are malformed is answered alone and never joins its batch; if the
combined run fails, each job is run on its own, so one bad input cannot fail its mates.
A job without one batch size (no arrays, a 0-d array, arrays that disagree on their first
dimension) is never concatenated with another: its rows could not be told apart. It runs
when it is the only job of its message, and is refused bad_request otherwise.

run_batch never raises: a JOB message it cannot read is answered, job by job, for every id
it can read (internal), and nothing is sent for what it cannot attribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor.shared.padding import array_lengths, cut, lengths, pad
from supervisor.shared.protocol import (
    BAD_REQUEST,
    INTERNAL,
    MAX_ARRAYS,
    MAX_NAME,
    MAX_NDIM,
    RESULT,
    JobEntry,
    Message,
    ProtocolError,
    arrays_from,
    batch_rows,
    check_specs,
    error_message,
    pack_arrays,
    parse_specs,
    readable_job_ids,
    unpack_job,
)
from worker.runners import Runner
from worker.uniform import BatchFailed, run_uniform

Arrays = dict[str, np.ndarray]


@dataclass
class Part:
    job_id: bytes
    inputs: Arrays
    rows: int | None  # None: no common batch size; runs only alone, never concatenated


def run_batch(runner: Runner, msg: Message) -> list[Message]:
    """Every job of a JOB message answered: a RESULT or an ERROR each."""
    try:
        entries, pad_to = unpack_job(msg)
    except ProtocolError as exc:
        text = f"the worker could not read the job message it was sent: {exc}"
        return [error_message(job_id, INTERNAL, text) for job_id in readable_job_ids(msg)]
    if not entries:
        return []
    try:
        uniform = run_uniform(runner, entries, pad_to, check_outputs)
    except BatchFailed as failed:
        return _isolate(runner, entries, failed.cause)
    if uniform is not None:
        return uniform
    return _general(runner, entries, pad_to)


def _general(runner: Runner, entries: list[JobEntry], pad_to: int) -> list[Message]:
    """Job by job: each read and checked alone, then the readable ones run together."""
    replies: list[Message] = []
    parts: list[Part] = []
    for entry in entries:
        part = _unpack(runner, entry, replies)
        if part is None:
            continue
        if part.rows is None and len(entries) > 1:
            replies.append(error_message(part.job_id, BAD_REQUEST, _no_batch_size(part)))
            continue
        parts.append(part)
    if parts:
        replies.extend(_run(runner, parts, pad_to))
    return replies


def _unpack(runner: Runner, entry: JobEntry, replies: list[Message]) -> Part | None:
    try:
        parsed = parse_specs(entry.inputs)
        inputs_known = runner.client_inputs
        if inputs_known is not None:  # defence in depth: admission checked when it knew
            check_specs(inputs_known, parsed)
        if runner.padding:
            lengths(parsed, runner.padding, at_admission=False)
        inputs = arrays_from(parsed, entry.arrays)
    except ProtocolError as exc:
        replies.append(error_message(entry.id, BAD_REQUEST, str(exc)))
        return None
    except Exception as exc:  # a bug here must cost this job, not the worker
        replies.append(error_message(entry.id, INTERNAL, f"cannot read the inputs: "
                                     f"{_describe(exc)}"))
        return None
    return Part(entry.id, inputs, batch_rows(parsed))


def _no_batch_size(part: Part) -> str:
    if not part.inputs:
        dims = "the job has no arrays"
    else:
        dims = ", ".join(f"{name} has {array.shape[0]} rows" if array.ndim else f"{name} is 0-d"
                         for name, array in part.inputs.items())
    return (f"inputs disagree on the batch size ({dims}): a job without one batch size "
            "cannot be batched with others")


def _run(runner: Runner, parts: list[Part], pad_to: int) -> list[Message]:
    try:
        return _call(runner, parts, pad_to)
    except Exception as exc:
        if len(parts) == 1:
            return [_model_error(parts[0].job_id, exc)]
    # The batch failed: isolate the culprit by running each job alone.
    return [reply for part in parts for reply in _run(runner, [part], pad_to=0)]


def _isolate(runner: Runner, entries: list[JobEntry], exc: Exception) -> list[Message]:
    """After a uniform batch failed: one job is answered with the failure; several are
    read and run one by one, so the culprit fails alone."""
    if len(entries) == 1:
        return [_model_error(entries[0].id, exc)]
    return [reply for entry in entries for reply in _general(runner, [entry], pad_to=0)]


def _model_error(job_id: bytes, exc: Exception) -> Message:
    code = BAD_REQUEST if type(exc).__name__ == "InvalidArgumentError" else INTERNAL
    return error_message(job_id, code, f"model raised {_describe(exc)}")


def _describe(exc: BaseException) -> str:
    """``Type: text`` of an exception, even one whose __str__ fails; error_message bounds
    its length."""
    try:
        text = str(exc)
    except Exception:
        text = "(its message cannot be read)"
    return f"{type(exc).__name__}: {text}"


def _call(runner: Runner, parts: list[Part], pad_to: int) -> list[Message]:
    if not runner.padding:
        return _call_padded(runner, parts, pad_to, [], {})
    dims = runner.padding
    found = [array_lengths(p.inputs, dims) for p in parts]
    buckets = {}
    for dim in dims:
        seen = {f[dim.name] for f in found if dim.name in f}
        if not seen:
            continue
        if not dim.pads and len(seen) > 1:  # the supervisor keeps such jobs apart
            raise ValueError(f"jobs of different '{dim.name}' lengths cannot be batched")
        buckets[dim.name] = dim.bucket(max(seen))
    padded = [Part(p.job_id, pad(p.inputs, dims, buckets, runner.input_dtypes), p.rows)
              for p in parts]
    return _call_padded(runner, padded, pad_to, found, buckets)


def _call_padded(runner: Runner, parts: list[Part], pad_to: int,
                 found: list[dict[str, int]], buckets: dict[str, int]) -> list[Message]:
    """Run the (padded) parts as one batch; each job's outputs cut back to its lengths."""
    def own_outputs(index: int, outputs: Arrays) -> Arrays:
        return cut(outputs, runner.padding, found[index], buckets) if found else outputs

    sized = [(p, p.rows) for p in parts if p.rows is not None]
    if len(sized) != len(parts) or not _compatible(parts):
        if len(parts) != 1:  # run_batch keeps such parts apart; never concatenate them
            raise ValueError("jobs of different layouts cannot be batched")
        # No batch dimension to pad or split on: the job runs as it came, and every output
        # is its own.
        outputs = runner(parts[0].inputs)
        check_outputs(parts[0].inputs, outputs)
        return [_result(parts[0].job_id, own_outputs(0, outputs))]
    rows = sum(count for _, count in sized)
    inputs = combine(parts, max(pad_to, rows))
    outputs = runner(inputs)
    check_outputs(inputs, outputs)
    replies = []
    start = 0
    for index, (part, count) in enumerate(sized):
        own = {name: array[start:start + count] for name, array in outputs.items()}
        start += count
        replies.append(_result(part.job_id, own_outputs(index, own)))
    return replies


def _compatible(parts: list[Part]) -> bool:
    """Whether the parts' arrays can be concatenated: the same names, dtypes and shapes past
    the first dimension (the supervisor batches only such jobs; this is defence in depth,
    since numpy would silently upcast mixed dtypes)."""
    def layout(part: Part) -> dict[str, tuple[Any, ...]]:
        return {name: (a.dtype, a.shape[1:]) for name, a in part.inputs.items()}

    first = layout(parts[0])
    return all(layout(p) == first for p in parts[1:])


def _result(job_id: bytes, outputs: Arrays) -> Message:
    specs, frames = pack_arrays(outputs)
    return Message(RESULT, job_id, {"outputs": specs}, frames)


def combine(parts: list[Part], size: int) -> Arrays:
    """Rows of every part in order, padded to ``size`` by repeating the last row (a valid
    input, unlike zeros for some models). One unpadded part is passed as it is (no copy).
    Every part must have a batch size (``rows`` not None); with no row at all there is
    nothing to repeat and the batch stays empty."""
    rows = sum(p.rows or 0 for p in parts)
    if len(parts) == 1 and (size == rows or rows == 0):
        return parts[0].inputs
    combined = {}
    for name in parts[0].inputs:
        pieces = [p.inputs[name] for p in parts]
        if size > rows > 0:
            # The batch's last row, from the last part that has one.
            last = next(piece for piece in reversed(pieces) if len(piece))[-1:]
            pieces.append(np.repeat(last, size - rows, axis=0))
        combined[name] = np.concatenate(pieces, axis=0)
    return combined


def check_outputs(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Every output must have the batch's first dimension, so it can be split by rows, and
    fit what a client accepts in a reply (else the client could not read its answer)."""
    if not outputs:
        raise ValueError("the model returned no outputs")
    if len(outputs) > MAX_ARRAYS:
        raise ValueError(f"the model returned {len(outputs)} outputs, more than the "
                         f"{MAX_ARRAYS} a reply may carry")
    for name, array in outputs.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ValueError(f"output name {name!r:.80} is not a string of 1 to {MAX_NAME} "
                             "characters")
        if array.ndim > MAX_NDIM:
            raise ValueError(f"output '{name}' has {array.ndim} dimensions, more than the "
                             f"{MAX_NDIM} a reply may carry")
    batch = {a.shape[0] for a in inputs.values() if a.ndim}
    for name, array in outputs.items():
        if batch and (array.ndim == 0 or array.shape[0] not in batch):
            raise ValueError(f"output '{name}' has shape {array.shape}, whose first dimension "
                             f"is not the batch size {sorted(batch)}")
