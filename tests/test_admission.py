"""Admission remembers descriptions that passed; whatever comes, in whatever order, its verdict
must be the full check's: the same specs, or the same error."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import msgpack
from hypothesis import given, settings

from supervisor.core.admission import MAX_KEPT, KnownDescriptions, specs_key
from supervisor.core.batching import job_key
from supervisor.core.jobs import Job
from supervisor.shared.protocol import (
    MAX_ARRAYS,
    ProtocolError,
    TensorSpec,
    check_frames,
    check_specs,
    parse_specs,
)

INPUTS = [TensorSpec("x", "float32", (None, 4)), TensorSpec("y", "int64", (None,))]
OTHER_INPUTS = [TensorSpec("x", "float32", (None, 4))]

dims = st.one_of(st.integers(0, 5), st.just(True), st.just(-1), st.none(), st.just("2"),
                 st.just(2.0))
spec = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "y", "z"]), "dtype": st.sampled_from(
        ["float32", "int64", "string", "float128"]),
     "shape": st.lists(dims, max_size=3) | st.tuples(st.integers(0, 3))},
    optional={"extra": st.integers()})
descriptions = st.lists(spec, max_size=3) | st.none() | st.just("x")
frames = st.lists(st.binary(max_size=64), max_size=3)


def full(raw: Any, arrays: list[bytes], inputs: list[TensorSpec] | None,
         max_elements: int | None) -> list[TensorSpec] | str:
    try:
        specs = parse_specs(raw)
        check_frames(specs, arrays, max_elements)
        if inputs is not None:
            check_specs(inputs, specs)
    except ProtocolError as exc:
        return str(exc)
    return specs


def known(d: KnownDescriptions, raw: Any, arrays: list[bytes], inputs: list[TensorSpec] | None,
         max_elements: int | None, header: bytes | None = None) -> list[TensorSpec] | str:
    try:
        return d.check(raw, arrays, inputs, max_elements, header).specs
    except ProtocolError as exc:
        return str(exc)


def matching_frames(raw: list[dict[str, Any]]) -> list[bytes]:
    """Frames of the right lengths for a description, where it can have any."""
    out = []
    for s in raw:
        size = {"float32": 4, "int64": 8}.get(s.get("dtype"), 1)
        n = 1
        for d in s.get("shape") or []:
            n *= d if type(d) is int and d > 0 else 1
        out.append(b"\0" * (size * n if n < 100 else 1))
    return out


def header_of(raw: Any, timeout: int | None) -> bytes | None:
    """The header bytes a client would send with this description (None: none could)."""
    try:
        return msgpack.packb({"model": "m", "inputs": raw, "timeout_ms": timeout})
    except (OverflowError, TypeError):
        return None


@settings(max_examples=300)
@given(st.lists(st.tuples(descriptions, st.booleans(), frames,
                          st.sampled_from([INPUTS, OTHER_INPUTS, None]),
                          st.sampled_from([None, 3, 100]),
                          st.sampled_from([None, 5, 1000])), min_size=1, max_size=12))
def test_admission_gives_the_full_checks_verdict_in_any_order(
        requests: list[tuple[Any, bool, list[bytes], Any, int | None, int | None]]) -> None:
    """Known by their description, or by the header bytes they came in (timeouts vary):
    a hit is the full check's verdict, whatever the frames that come with it."""
    d = KnownDescriptions()
    for raw, fit, arrays, inputs, max_elements, timeout in requests:
        if fit and isinstance(raw, list):
            arrays = matching_frames(raw)
        header = header_of(raw, timeout)
        for by in (None, header, header):  # and again: now possibly from what it kept
            assert known(d, raw, arrays, inputs, max_elements, by) == \
                full(raw, arrays, inputs, max_elements), raw
        batched_as_from_the_wire(d, raw, arrays, inputs, max_elements)


def rows_from_the_wire(raw: list[dict[str, Any]]) -> int | None:
    """The batch dimension every array of the job's wire specs shares, read from the wire
    specs alone; None when there is none."""
    firsts = set()
    for spec in raw:
        shape = spec.get("shape")
        if not isinstance(shape, list) or not shape or not isinstance(shape[0], int):
            return None
        firsts.add(shape[0])
    return firsts.pop() if len(firsts) == 1 else None


def batched_as_from_the_wire(d: KnownDescriptions, raw: Any, arrays: list[bytes],
                             inputs: list[TensorSpec] | None, max_elements: int | None) -> None:
    """The batch layout and rows admission works out once per description are what the
    batching would work out from the job's wire specs (as msgpack gives them: lists)."""
    try:
        raw = msgpack.unpackb(msgpack.packb(raw))
    except (OverflowError, TypeError):
        return  # nothing the wire could carry
    try:
        passed = d.check(raw, arrays, inputs, max_elements)
    except ProtocolError:
        return
    job = Job(1, "m", [], b"1", raw, list(arrays), received_at=0.0)
    assert (passed.layout, passed.rows) == (job_key(job), rows_from_the_wire(raw)), raw


def test_a_known_description_is_checked_by_frame_lengths_alone() -> None:
    d = KnownDescriptions()
    raw = [{"name": "x", "dtype": "float32", "shape": [2, 4]}]
    good = [b"\0" * 32]
    d.check(raw, good, OTHER_INPUTS, None)
    assert specs_key(raw) in d.passed
    passed = d.check(raw, good, OTHER_INPUTS, None)
    assert passed.specs == [TensorSpec("x", "float32", (2, 4))]
    # worked out once for every job of this description: the batching's key and rows
    assert (passed.layout, passed.rows) == ((("x", "float32", (4,)),), 2)
    assert known(d, raw, [b"\0" * 31], OTHER_INPUTS, None) == full(raw, [b"\0" * 31],
                                                                  OTHER_INPUTS, None)
    assert "31 bytes" in str(known(d, raw, [b"\0" * 31], OTHER_INPUTS, None))
    # a bool is not an int to the protocol, though True == 1 to Python
    assert specs_key([{"name": "x", "dtype": "float32", "shape": [True, 4]}]) is None


def test_what_admission_keeps_is_bounded() -> None:
    d = KnownDescriptions()
    for rows in range(3 * MAX_KEPT):
        d.check([{"name": "x", "dtype": "float32", "shape": [rows, 4]}], [b"\0" * 16 * rows],
                OTHER_INPUTS, None)
        assert len(d.passed) <= MAX_KEPT


def test_a_description_known_by_its_header_bytes_still_checks_its_frames() -> None:
    d = KnownDescriptions()
    raw = [{"name": "x", "dtype": "float32", "shape": [2, 4]}]
    header = header_of(raw, 5)
    d.check(raw, [b"\0" * 32], OTHER_INPUTS, None, header)
    assert header in d.passed
    assert "31 bytes" in str(known(d, raw, [b"\0" * 31], OTHER_INPUTS, None, header))
    assert known(d, raw, [], OTHER_INPUTS, None, header) == full(raw, [], OTHER_INPUTS, None)
    # the model's inputs changed (a reload): the full check again, against the new ones
    assert known(d, raw, [b"\0" * 32], INPUTS, None, header) == \
        full(raw, [b"\0" * 32], INPUTS, None)


def test_refused_descriptions_leave_nothing_remembered() -> None:
    """Requests refused for their frames or for not fitting the model's inputs, each with a
    description of its own: admission keeps none of them (docs/protocol.md: a message that
    is refused keeps nothing)."""
    d = KnownDescriptions()
    for n in range(300):
        wrong_frames = [{"name": "x", "dtype": "float32", "shape": [n + 1, 4]}]
        assert "bytes do not match" in str(known(d, wrong_frames, [b""], OTHER_INPUTS, None))
        not_the_models = [{"name": f"z{n}", "dtype": "float32", "shape": [1, 4]}]
        assert "do not match the model" in str(
            known(d, not_the_models, [b"\0" * 16], OTHER_INPUTS, None))
    assert not d.passed


def test_a_description_of_more_arrays_than_a_message_carries_has_no_key() -> None:
    """A key holds every spec of its description: a list longer than any message can carry
    is checked in full and never kept (1024 keys of ~2,000 specs each would hold ~650 MiB)."""
    many = [{"name": f"a{i}", "dtype": "int8", "shape": []} for i in range(MAX_ARRAYS + 1)]
    assert specs_key(many) is None
    assert specs_key(many[:MAX_ARRAYS]) is not None
