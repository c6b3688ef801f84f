"""Admission: a client's message decoded, checked and made a Job, or refused with a code.

Everything here is judged from the header and the frame lengths alone: no array is built.
The order: decode (protocol limits), the model (served, not removed), the sizes (one message
within max_message_size, its arrays within max_queue_bytes), the arrays' description against
the model's inputs, the deadline. Whether the supervisor is shutting down or the model has
no worker is the core's to say (it knows the pool); a Refusal carries the code either way.

The description check, remembered per kind of request:

A request's header describes its arrays (name, dtype, shape); admission checks that
description (parse_specs), the frames against it (check_frames) and it against the model's
inputs (check_specs), all from the header and frame lengths. Clients send the same few
descriptions again and again, so the outcome of a description that passed is kept: the next
request with the same one only has its frame lengths compared. On the MLP's batch-1
requests the full check costs ~8.5 µs more of the supervisor's CPU per job, about 5 % of
what the serving processes spend per request on the MLP peers bench (bench/HISTORY.md,
"Remembered descriptions, measured"). This is the one place a description is remembered:
the protocol's parse_specs keeps nothing, and a refused description leaves nothing behind.

What is kept is exact: a description is remembered only when every value in it is of the
plain type the full check accepts (a str name and dtype, a list of non-bool ints as shape,
no other keys), so two descriptions with the same key pass or fail alike; anything else,
and every failure, goes through the full check, which gives the error. String arrays are
always checked in full (their frames' contents are checked, not only their lengths).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from supervisor.config.keys import SupervisorSection
from supervisor.core.jobs import Job
from supervisor.shared.padding import PadDim, batch_key, batch_keys
from supervisor.shared.protocol import (
    BAD_REQUEST,
    ITEMSIZE,
    MAX_ARRAYS,
    MAX_JOB_ID,
    MAX_NDIM,
    UNKNOWN_MODEL,
    VERSION,
    Frame,
    Limits,
    Message,
    ProtocolError,
    TensorSpec,
    batch_rows,
    check_frames,
    check_specs,
    decode,
    frame_head,
    frame_length,
    parse_specs,
)

if TYPE_CHECKING:
    from supervisor.core.pool import ModelState

# The longest deadline a client may ask for (ms): a year. Longer is surely a unit mistake.
MAX_TIMEOUT_MS = 365 * 86400 * 1000.0
# Descriptions kept per model; past this the memory starts over (a client that sends a new
# shape every time costs the full check for each request, nothing more).
MAX_KEPT = 1024
# Header bytes a description may be known by, at most (a longer header is keyed by its
# description's values): a client sends one header per shape and timeout, well under this.
MAX_KEY_BYTES = 512

Key = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Passed:
    inputs: Sequence[TensorSpec] | None  # the model's inputs it was checked against
    specs: list[TensorSpec]
    lengths: tuple[int, ...]  # bytes each array frame must have
    elements: int
    # Worked out once per description rather than per job: what a batch mate must match
    # when nothing is padded, and the job's rows (Job.rows).
    layout: Key
    rows: int | None


def described(inputs: Sequence[TensorSpec] | None, specs: list[TensorSpec]) -> Passed:
    """What admission knows of a description that passed. ``lengths`` hold 0 for a string
    array, whose frame length its shape does not fix: such a description is never kept."""
    lengths = tuple(s.elements * ITEMSIZE.get(s.dtype, 0) for s in specs)
    return Passed(inputs, specs, lengths, sum(s.elements for s in specs),
                  batch_key(specs, ()), batch_rows(specs))


class Refusal(Exception):
    def __init__(self, code: str, message: str, label: str = "-") -> None:
        super().__init__(message)
        self.code = code
        self.label = label  # a served model's name, for metrics; "-" otherwise


class Admission:
    """Admission of the core: the protocol limits in force, the descriptions that passed per
    model, and the job ids handed out."""

    def __init__(self, sup: SupervisorSection) -> None:
        self.known: dict[str, KnownDescriptions] = {}
        self.next_job_id = 1
        self.configure(sup)

    def configure(self, sup: SupervisorSection) -> None:
        """The supervisor section in force (at start and at every reload)."""
        self.sup = sup
        self.limits = Limits(sup.max_header_size, sup.max_arrays, sup.max_elements)

    def decode(self, body: list[Frame]) -> Message:
        try:
            return decode(body, self.limits)
        except ProtocolError as exc:
            raise Refusal(exc.code, str(exc)) from None

    def job(self, msg: Message, envelope: list[Frame], models: Mapping[str, ModelState],
            now: float, header: Frame | None = None) -> Job:
        """An infer request made a Job, or a Refusal saying why not (the model, the sizes,
        the arrays against the model's inputs, the deadline). ``header``: the header frame
        it was decoded from, by which a description seen before is known at once."""
        model = msg.header.get("model")
        if not isinstance(model, str):
            raise Refusal(BAD_REQUEST, "header field 'model' must be a string")
        state = models.get(model)
        if state is None or state.removed:
            served = ", ".join(sorted(n for n, s in models.items() if not s.removed))
            raise Refusal(UNKNOWN_MODEL, f"no model named '{model[:256]}' (served: {served})")
        nbytes = self._sized(msg)
        known = self.known.get(model)
        if known is None:
            known = self.known[model] = KnownDescriptions()
        dims = state.serving_dims if state.serving_dims is not None else state.config.pad_dims
        try:  # from the header and the frame lengths alone: no array is built at admission
            passed = known.check(msg.header.get("inputs"), msg.arrays, state.inputs,
                                 self.limits.max_elements, header)
            key, joins = batch_keys(passed.specs, dims) if dims else (passed.layout, None)
        except ProtocolError as exc:
            raise Refusal(exc.code, _sent_generated(msg.header.get("inputs"), dims) or str(exc)) \
                from None
        job = Job(id=self.next_job_id, model=model, envelope=envelope, client_job_id=msg.job_id,
                  inputs=msg.header["inputs"], arrays=msg.arrays, received_at=now,
                  deadline=_deadline(msg.header.get("timeout_ms"), now), nbytes=nbytes,
                  key=key, joins=joins, rows=passed.rows)
        self.next_job_id += 1
        return job

    def _sized(self, msg: Message) -> int:
        """The job's array bytes, once the whole message is known to be within bounds."""
        nbytes = sum(map(frame_length, msg.arrays))
        size = nbytes + len(msg.job_id) + len(msg.kind) + len(VERSION)
        sup = self.sup
        if size > sup.max_message_size:
            raise Refusal(BAD_REQUEST, f"message is {size} bytes or more, more than "
                          f"max_message_size ({sup.max_message_size})")
        if nbytes > sup.max_queue_bytes:
            raise Refusal(BAD_REQUEST, f"the job's arrays are {nbytes} bytes, more than "
                          f"max_queue_bytes ({sup.max_queue_bytes}): it could never be queued")
        return nbytes


class KnownDescriptions:
    """One per model: the request descriptions that passed, by key."""

    def __init__(self) -> None:
        # by description (specs_key), or by the header bytes it came in
        self.passed: dict[tuple[Any, ...] | bytes, Passed] = {}

    def check(self, raw: object, frames: Sequence[Frame], inputs: Sequence[TensorSpec] | None,
              max_elements: int | None, header: Frame | None = None) -> Passed:
        """The request's description; ProtocolError, as the full check raises it, if it
        fails. ``header``: the bytes ``raw`` was parsed from, when known: the same bytes
        hold the same description, so they key it without walking it (the header's other
        fields, a timeout say, only make more keys for one description)."""
        # else by a description of plain values (None for anything else)
        key: tuple[Any, ...] | bytes | None = \
            header if type(header) is bytes and len(header) <= MAX_KEY_BYTES else specs_key(raw)
        known = self.passed.get(key) if key is not None else None
        if known is not None and known.inputs is inputs and _fits(known, frames, max_elements):
            return known
        specs = parse_specs(raw)
        check_frames(specs, frames, max_elements)
        if inputs is not None:
            check_specs(inputs, specs)
        passed = described(inputs, specs)
        if key is not None and all(s.dtype in ITEMSIZE for s in specs):
            if len(self.passed) >= MAX_KEPT:
                self.passed.clear()
            self.passed[key] = passed
        return passed


def specs_key(specs: object) -> tuple[Any, ...] | None:
    """What admission knows a description by when its header bytes are too long to:
    ``((name, dtype, shape), ...)`` when every spec is a map of a str name, a str dtype and
    a list of ints, at most MAX_ARRAYS of them; None for anything else, which is parsed (and
    refused) the long way. Exact types only: a bool is not an int here."""
    # No message carries more arrays than MAX_ARRAYS, so a longer list is never a key: a key
    # holds every spec, and 1024 of ~2,000 specs each would be ~650 MiB kept in a supervisor.
    if type(specs) is not list or len(specs) > MAX_ARRAYS:
        return None
    key: list[Any] = []
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
            if type(dim) is not int:
                return None
        key.append((name, dtype, dims))
    return tuple(key)


def _fits(known: Passed, frames: Sequence[Frame], max_elements: int | None) -> bool:
    if len(frames) != len(known.lengths):
        return False
    if max_elements is not None and known.elements > max_elements:
        return False
    return tuple(map(frame_length, frames)) == known.lengths


def _deadline(timeout_ms: object, now: float) -> float | None:
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or \
            not math.isfinite(timeout_ms) or not 0 < timeout_ms <= MAX_TIMEOUT_MS:
        raise Refusal(BAD_REQUEST, f"header field 'timeout_ms' must be a finite number of "
                      f"milliseconds, more than 0 and at most {MAX_TIMEOUT_MS:.0f}")
    return now + float(timeout_ms) / 1000.0


def job_id_of(body: list[Frame]) -> bytes:
    """The client's job id for a refusal, when there is a frame for it: an id over the limit
    is cut to its first MAX_JOB_ID bytes (docs/protocol.md), so a client that keys its jobs
    by id prefix can still tell which job was refused; a reply to garbage is harmless."""
    if len(body) >= 3:
        return frame_head(body[2], MAX_JOB_ID)
    return b""


def _sent_generated(raw: object, dims: Sequence[PadDim]) -> str | None:
    """Why a refused request was wrong when it sent an input the worker generates (a
    padding's mask or lengths): the model's own input list leaves those out, and "do not
    match" alone would not say so."""
    if not isinstance(raw, list):
        return None
    names = {s.get("name") for s in raw if isinstance(s, dict) and isinstance(s.get("name"), str)}
    for dim in dims:
        for name in dim.generated:
            if name in names:
                return (f"input '{name}' is generated by the worker (padding '{dim.name}'): "
                        "do not send it; it is made from the padded lengths")
    return None
