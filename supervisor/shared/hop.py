"""The internal hop between the supervisor and its workers: a batch of jobs in one JOB
message, their answers in one RESULTS message, and the spawn secret that signs what a worker
sends. Every job on it was admitted already (supervisor/core/admission.py)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from supervisor.shared.wire import (
    ERROR,
    INTERNAL,
    INTERNAL_HOP,
    JOB,
    MAX_JOB_ID,
    RESULT,
    RESULTS,
    Frame,
    Message,
    ProtocolError,
    parse_header,
    show_value,
)


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
        raise ProtocolError(f"pad_to must be a non-negative integer, got {show_value(pad_to)}",
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
                            f"{show_value(pad_to)}", INTERNAL)
    entries: list[JobEntry] = []
    seen: set[bytes] = set()
    start = 0
    for raw in raw_jobs:
        if not isinstance(raw, dict):
            raise ProtocolError(f"each job entry must be a map, got {show_value(raw)}", INTERNAL)
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
                            f"{show_value(raw)}", INTERNAL)
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
                            f"{show_value(leaving)}")
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
            header = headers[packed] = parse_header(packed, INTERNAL_HOP.max_header)
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


