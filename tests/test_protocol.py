"""Wire protocol: round trips, and no input makes decode fail other than with ProtocolError."""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import example, given, settings
from hypothesis import strategies as st

from supervisor.shared import protocol
from supervisor.shared.protocol import (
    ERROR,
    INFER,
    INTERNAL_HOP,
    JOB,
    MAX_ERROR_TEXT,
    NUMERIC_DTYPES,
    RESULT,
    RESULTS,
    VERSION,
    ZERO_COPY_MIN,
    JobEntry,
    Message,
    ProtocolError,
    TensorSpec,
    arrays_from,
    batch_rows,
    check_frames,
    check_specs,
    decode,
    encode,
    error_message,
    pack_arrays,
    pack_job,
    pack_results,
    parse_specs,
    readable_job_ids,
    split_envelope,
    unpack_arrays,
    unpack_job,
    unpack_results,
)


def test_message_round_trip() -> None:
    specs, frames = pack_arrays({"x": np.arange(6, dtype=np.int64).reshape(2, 3)})
    msg = Message(INFER, b"job-1", {"model": "m", "inputs": specs, "timeout_ms": 50}, frames)
    back = decode(encode(msg))
    assert (back.kind, back.job_id, back.header) == (INFER, b"job-1", msg.header)
    arrays = unpack_arrays(back.header["inputs"], back.arrays)
    np.testing.assert_array_equal(arrays["x"], np.arange(6).reshape(2, 3))


@pytest.mark.parametrize("dtype", sorted(NUMERIC_DTYPES))
def test_every_allowed_dtype_round_trips(dtype: str) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal((3, 2)) * 10).astype(dtype)
    specs, frames = pack_arrays({"a": array})
    out = unpack_arrays(specs, frames)["a"]
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, array)


def test_strings_round_trip_as_bytes() -> None:
    array = np.array([["héllo", b"raw\x00bytes"], ["", "TensorFlow"]], dtype=object)
    specs, frames = pack_arrays({"s": array, "u": np.array(["ab", "c"]),
                                 "b": np.array([b"x", b"yz"])})
    assert [s["dtype"] for s in specs] == ["string"] * 3
    out = unpack_arrays(specs, [zmq.Frame(bytes(f)) for f in frames])
    assert out["s"].dtype == object and out["s"].shape == (2, 2)
    assert out["s"].tolist() == [["héllo".encode(), b"raw\x00bytes"], [b"", b"TensorFlow"]]
    assert out["u"].tolist() == [b"ab", b"c"] and out["b"].tolist() == [b"x", b"yz"]
    assert unpack_arrays(*pack_arrays({"e": np.empty((0, 3), object)}))["e"].shape == (0, 3)


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_string_round_trip_property(items: list[bytes]) -> None:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    specs, frames = pack_arrays({"s": array})
    assert unpack_arrays(specs, frames)["s"].tolist() == items


def test_a_string_array_holding_other_objects_cannot_travel() -> None:
    with pytest.raises(ProtocolError, match="holds int"):
        pack_arrays({"s": np.array(["a", 3], dtype=object)})


@pytest.mark.parametrize(("frame", "fragment"), [
    (b"\x05\x00\x00", "cannot hold the lengths of 2"),
    (b"\x01\x00\x00\x00\x01\x00\x00\x00a", "add up to 2 bytes, but 1"),
    (b"\x01\x00\x00\x00\x00\x00\x00\x00abc", "add up to 1 bytes, but 3"),
    (b"\xff\xff\xff\xff\x00\x00\x00\x00", "add up to 4294967295"),
])
def test_malformed_string_frames_are_refused(frame: bytes, fragment: str) -> None:
    spec = [{"name": "s", "dtype": "string", "shape": [2]}]
    with pytest.raises(ProtocolError, match=fragment):
        unpack_arrays(spec, [frame])


def test_large_arrays_are_not_copied_when_packed() -> None:
    big = np.ones(ZERO_COPY_MIN // 4, np.float32)
    _, frames = pack_arrays({"big": big, "small": np.ones(3, np.float32)})
    assert isinstance(frames[0], memoryview)  # the array's own memory
    assert isinstance(frames[1], bytes)


def test_non_contiguous_and_big_endian_arrays_are_normalised() -> None:
    array = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    specs, frames = pack_arrays({"a": array})
    np.testing.assert_array_equal(unpack_arrays(specs, frames)["a"], array)


def test_zero_size_arrays() -> None:
    specs, frames = pack_arrays({"a": np.zeros((0, 4), np.float32)})
    assert unpack_arrays(specs, frames)["a"].shape == (0, 4)


def test_unpack_reads_zmq_frames_without_copy() -> None:
    array = np.arange(4, dtype=np.float32)
    specs, frames = pack_arrays({"a": array})
    frame = zmq.Frame(bytes(frames[0]))
    out = unpack_arrays(specs, [frame])["a"]
    assert not out.flags.owndata  # a view on the frame's buffer
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize(("specs", "frames", "fragment"), [
    ([{"name": "a", "dtype": "object", "shape": [1]}], [b"x" * 8], "dtype 'object'"),
    ([{"name": "a", "dtype": "V8", "shape": [1]}], [b"x" * 8], "dtype 'V8'"),
    ([{"name": "a", "dtype": "float32", "shape": [2]}], [b"x" * 4], "do not match"),
    ([{"name": "a", "dtype": "float32", "shape": [-1]}], [b""], "bad dimension"),
    ([{"name": "a", "dtype": "float32", "shape": [None]}], [b""], "bad dimension"),
    ([{"name": "a", "dtype": "float32", "shape": [1] * 9}], [b"x" * 4], "at most 8"),
    ([{"name": "a", "dtype": "float32", "shape": [1]}], [], "1 arrays but 0"),
    ([{"name": "a", "dtype": "uint8", "shape": [1]}] * 2, [b"x", b"y"], "unique"),
    ([{"dtype": "uint8", "shape": [1]}], [b"x"], "'name'"),
    ("nope", [], "must be a list"),
])
def test_unpack_refuses_bad_arrays(specs: object, frames: list[bytes], fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment.replace("[", r"\[")):
        unpack_arrays(specs, frames)


def test_spec_accepts() -> None:
    want = TensorSpec("x", "float32", (None, 4))
    assert want.accepts(TensorSpec("x", "float32", (7, 4)))
    assert not want.accepts(TensorSpec("x", "float32", (7, 5)))
    assert not want.accepts(TensorSpec("x", "float64", (7, 4)))
    assert not want.accepts(TensorSpec("x", "float32", (7,)))


def test_results_round_trip() -> None:
    _, frames = pack_arrays({"y": np.ones((2, 3), np.float32), "z": np.zeros(2, np.int64)})
    replies = [Message(RESULT, b"1", {"outputs": ["specs"]}, frames),
               error_message(b"2", "bad_request", "no"),
               Message(RESULT, b"3", {"outputs": []}, [b"tail"])]
    back, leaving = unpack_results(decode(encode(pack_results(replies)), INTERNAL_HOP))
    assert [(m.kind, m.job_id, m.header) for m in back] == \
        [(m.kind, m.job_id, m.header) for m in replies]
    assert [len(m.arrays) for m in back] == [2, 0, 1] and back[2].arrays == [b"tail"]
    assert leaving is False and "leaving" not in pack_results(replies).header
    # Passed on as it came: what the client gets decodes to what the worker answered.
    for reply, sent in zip(back, replies, strict=True):
        assert decode(encode(Message(reply.kind, b"client", reply.header, reply.arrays,
                                     reply.packed))).header == sent.header


def test_a_header_jobs_share_is_packed_and_unpacked_once() -> None:
    shared = {"outputs": [{"name": "y", "dtype": "float32", "shape": [1, 1]}]}
    replies = [Message(RESULT, str(i).encode(), shared, [b"abcd"]) for i in range(5)]
    replies.append(Message(RESULT, b"own", {"outputs": []}, []))
    msg = pack_results(replies)
    packed = [e["header"] for e in msg.header["jobs"]]
    assert len({id(h) for h in packed[:5]}) == 1 and packed[5] != packed[0]
    back, _ = unpack_results(decode(encode(msg), INTERNAL_HOP))
    assert len({id(m.header) for m in back[:5]}) == 1 and back[0].header == shared
    assert back[5].header == {"outputs": []}


def test_results_say_when_the_worker_is_leaving() -> None:
    msg = pack_results([error_message(b"7", "internal", "x")], leaving=True)
    assert msg.header["leaving"] is True
    back, leaving = unpack_results(decode(encode(msg), INTERNAL_HOP))
    assert leaving is True and [m.job_id for m in back] == [b"7"]
    assert unpack_results(decode(encode(pack_results([], leaving=True)), INTERNAL_HOP)) == \
        ([], True)


def test_a_long_error_text_crosses_the_internal_hop() -> None:
    """A worker's answer with a 100 KiB error text: once undecodable, its batch stranded."""
    text = "e" * 100 * 1024
    msg = pack_results([Message(ERROR, b"1", {"code": "internal", "message": text}),
                        Message(RESULT, b"2", {"outputs": []}, [])])
    frames = encode(msg)
    with pytest.raises(ProtocolError):
        decode(frames)  # a client's limits: 64 KiB headers
    back, _ = unpack_results(decode(frames, INTERNAL_HOP))
    assert back[0].header["message"] == text and back[1].job_id == b"2"


def test_error_texts_are_bounded_where_they_are_made() -> None:
    assert error_message(b"j", "internal", "short").header == {"code": "internal",
                                                                 "message": "short"}
    exact = "x" * MAX_ERROR_TEXT
    assert error_message(b"j", "internal", exact).header["message"] == exact
    long = "y" * (MAX_ERROR_TEXT + 1) + "z" * 1_000_000
    text = error_message(b"j", "internal", long).header["message"]
    assert len(text) <= MAX_ERROR_TEXT and text.startswith("y" * 4000)
    kept = text.index("...")
    assert text.endswith(f"... [{len(long) - kept} more characters cut]")
    # The reply fits a client's 64 KiB header, whatever the text was.
    decode(encode(error_message(b"j", "internal", "\u20ac" * 100_000)))


EMPTY = msgpack.packb({})


@pytest.mark.parametrize(("header", "arrays", "fragment"), [
    ({}, [], "'jobs' list"),
    ({"jobs": [{"id": b"1", "kind": b"infer", "header": EMPTY, "arrays": 0}]}, [], "kind"),
    ({"jobs": [{"id": "1", "kind": b"result", "header": EMPTY, "arrays": 0}]}, [], "id"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": EMPTY, "arrays": 2}]}, [b"a"],
     "2 arrays"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": EMPTY, "arrays": 0}]}, [b"a"],
     "0 arrays"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": EMPTY, "arrays": -1}]}, [], "arrays"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": EMPTY, "arrays": True}]}, [b"a"],
     "arrays"),
    # A header unpacked (the format before headers travelled packed) or packed wrong.
    ({"jobs": [{"id": b"1", "kind": b"result", "header": {}, "arrays": 0}]}, [], "header"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": msgpack.packb([]), "arrays": 0}]}, [],
     "header must be a msgpack map"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": b"\xc1", "arrays": 0}]}, [],
     "header is not valid msgpack"),
    # Counts of 2 and -1 add up to the 1 frame that came, but the first names 2 of it.
    ({"jobs": [{"id": b"1", "kind": b"result", "header": EMPTY, "arrays": 2},
               {"id": b"2", "kind": b"result", "header": EMPTY, "arrays": -1}]}, [b"a"],
     "remain"),
    ({"jobs": [], "leaving": 1}, [], "leaving"),
    ({"jobs": [], "leaving": [True]}, [], "leaving"),
    ({"jobs": [{"id": b"1", "kind": [b"result"], "header": EMPTY, "arrays": 0}]}, [], "kind"),
])
def test_unpack_results_refuses_what_does_not_add_up(header: dict[str, object],
                                                     arrays: list[bytes], fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment):
        unpack_results(Message(RESULTS, b"", header, list(arrays)))


def test_envelopes() -> None:
    assert split_envelope([b"id", b"TFS1", b"k"]) == ([b"id"], [b"TFS1", b"k"])
    assert split_envelope([b"id", b"", b"TFS1"]) == ([b"id", b""], [b"TFS1"])


@pytest.mark.parametrize("frames", [
    [], [VERSION, INFER, b"j"], [b"TFS2", INFER, b"", msgpack.packb({})],
    [VERSION, b"nope", b"", msgpack.packb({})], [VERSION, INFER, b"x" * 65, msgpack.packb({})],
    [VERSION, INFER, b"", b"\xc1"], [VERSION, INFER, b"", msgpack.packb("str")],
    [VERSION, INFER, b"", b"\x81" + b"\x01" * 3],  # a map with an int key
    [VERSION, INFER, b"", msgpack.packb({"a": "x" * 70000})],
    [VERSION, RESULT, b"", msgpack.packb({})] + [b""] * 65,
])
def test_decode_refuses_malformed(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        decode(frames)


@pytest.mark.parametrize(("header", "fragment"), [
    (b"\x81\x01\x01", "int is not allowed for map key"),
    (msgpack.packb({"shape": [1] * 5000}), "5000 exceeds max_array_len(4096)"),
])
def test_a_header_past_a_decoding_rule_names_the_rule(header: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        decode([VERSION, INFER, b"", header])
    assert "header is not valid msgpack (ValueError: " in str(raised.value)
    assert fragment in str(raised.value)


@pytest.mark.parametrize(("specs", "fragment"), [
    (None, "header field 'outputs' must be a list of array specs (missing)"),
    ({"name": "x"}, "header field 'outputs' must be a list of array specs (got dict)"),
])
def test_a_missing_spec_list_names_its_field(specs: object, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(fragment)):
        unpack_arrays(specs, [], field="outputs")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=8))
def test_decode_never_fails_otherwise(frames: list[bytes]) -> None:
    try:
        msg = decode(frames)
        unpack_arrays(msg.header.get("inputs"), msg.arrays)
    except ProtocolError:
        pass


header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=10), header_values, max_size=6),
       st.lists(st.binary(max_size=64), max_size=4))
def test_fuzzed_headers_never_crash_unpacking(header: dict[str, object],
                                              arrays: list[bytes]) -> None:
    msg = decode(encode(Message(INFER, b"j", header, list(arrays))))
    assert msg.header == header
    with contextlib.suppress(ProtocolError):
        unpack_arrays(msg.header.get("inputs"), msg.arrays)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(NUMERIC_DTYPES)),
       st.lists(st.integers(0, 5), min_size=0, max_size=4))
def test_array_round_trip_property(dtype: str, shape: list[int]) -> None:
    array = np.zeros(shape, dtype=dtype)
    specs, frames = pack_arrays({"a": array})
    out = unpack_arrays(specs, [bytes(f) for f in frames])["a"]
    assert out.shape == array.shape and out.dtype == array.dtype


# --- hostile specs: ProtocolError, never TypeError / ValueError / OverflowError / KeyError ---

HOSTILE = [[1], {"a": 1}, b"float32", None, 3, 2.5, float("nan"), True, "", ["float32"],
           {"float32": 1}, 2**70, "x" * 100_000]


@pytest.mark.parametrize("dtype", HOSTILE)
def test_hostile_dtypes_are_protocol_errors(dtype: object) -> None:
    with pytest.raises(ProtocolError, match=r"dtype .* is not one of"):
        parse_specs([{"name": "a", "dtype": dtype, "shape": [1]}])


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_protocol_errors(name: object) -> None:
    with pytest.raises(ProtocolError, match="'name' must be a non-empty string"):
        parse_specs([{"name": name, "dtype": "float32", "shape": [1]}])


@pytest.mark.parametrize("shape", [
    [2**70], [0, 2**70], [0, 2**62, 4], [2**31, 0, 2**33], [2**64 - 1], [0, 2**63],
    [2**40] * 8, [0] + [2**20] * 7,
])
def test_absurd_shapes_are_refused_even_with_no_elements(shape: list[int]) -> None:
    spec = [{"name": "a", "dtype": "float32", "shape": shape}]
    with pytest.raises(ProtocolError, match="too large"):
        unpack_arrays(spec, [b""])
    with pytest.raises(ProtocolError, match="too large"):
        parse_specs([dict(spec[0], dtype="string")])


def test_the_largest_addressable_empty_array_still_unpacks() -> None:
    out = unpack_arrays([{"name": "a", "dtype": "uint8", "shape": [0, 2**62]}], [b""])
    assert out["a"].shape == (0, 2**62)
    out = unpack_arrays([{"name": "s", "dtype": "string", "shape": [2**59, 0]}], [b""])
    assert out["s"].shape == (2**59, 0)


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"name": "a", "dtype": "float32", "shape": [[1]]}, "bad dimension"),
    ({"name": "a", "dtype": "float32", "shape": [1.0]}, "bad dimension"),
    ({"name": "a", "dtype": "float32", "shape": [True]}, "bad dimension"),
    ({"name": "a", "dtype": "float32", "shape": {"0": 1}}, "shape must be a list"),
    ({"name": "a", "dtype": "float32", "shape": b"\x01"}, "shape must be a list"),
    ({"name": "a", "dtype": "float32", "shape": "1"}, "shape must be a list"),
    ({"name": "a", "dtype": "float32"}, "shape must be a list"),
    ({"name": "a" * 257, "dtype": "float32", "shape": [1]}, "at most 256 characters"),
    ([("name", "a")], "must be a map"),
])
def test_malformed_specs(spec: object, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment):
        parse_specs([spec])


def test_error_messages_about_hostile_values_stay_short() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_specs([{"name": "a", "dtype": ["x" * 100_000], "shape": [1]}])
    assert len(str(info.value)) < 400
    nested: object = 1
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(ProtocolError) as info:  # repr would recurse too deeply
        parse_specs([{"name": "a", "dtype": nested, "shape": [1]}])
    assert "dtype a list is not one of" in str(info.value)


def test_check_functions_refuse_specs_made_in_code() -> None:
    with pytest.raises(ProtocolError, match="cannot travel"):
        check_frames([TensorSpec("a", "object", (1,))], [b"12345678"])
    with pytest.raises(ProtocolError, match="disagree on the batch size"):
        check_specs([TensorSpec("a", "float32", (None,)), TensorSpec("b", "float32", (None,))],
                    [TensorSpec("a", "float32", (1,)), TensorSpec("b", "float32", (2,))])


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=12) | st.binary(max_size=12)
    | st.sampled_from(["float32", "string", "uint8", 2**62, 2**63, 2**64 - 1, -1, 0, 1]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=10)
# Beyond what msgpack can carry: the same parsers read handler options and config values.
any_values = msgpack_values | st.integers() | st.sampled_from([2**70, -(2**70), 10**400])
HUGE_DIMS = st.sampled_from([2**31, 2**61, 2**62, 2**63, 2**64 - 1, 2**70])
dims = st.integers(0, 4) | st.integers(0, 4) | HUGE_DIMS | HUGE_DIMS | any_values


ITEMSIZES = {"float32": 4, "uint8": 1, "bool": 1}


def _fitting_frame(spec: object) -> bytes:
    """The frame a spec asks for, where it can be made (so the arrays get built, too)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list):
        return b""
    shape = spec["shape"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return b""
    count = math.prod(shape)
    if count > 64:
        return b""
    if spec.get("dtype") == "string":
        return b"\x00\x00\x00\x00" * count
    return b"\x00" * count * ITEMSIZES.get(str(spec.get("dtype")), 1)


@st.composite
def hostile_specs(draw: st.DrawFn) -> tuple[object, list[bytes]]:
    """A spec list with each field either sensible or hostile, and its frames: random, or
    the ones the specs ask for (empty arrays with absurd dimensions get that far)."""
    count = draw(st.integers(0, 4))
    specs: list[object] = []
    for i in range(count):
        if draw(st.integers(0, 9)) == 0:
            specs.append(draw(any_values))
            continue
        spec: dict[str, object] = {}
        for key, good in (("name", st.sampled_from([f"a{i}", "a0"])),
                          ("dtype", st.sampled_from(["float32", "string", "uint8", "bool"])),
                          ("shape", st.lists(dims, max_size=9))):
            choice = draw(st.integers(0, 5))
            if choice == 0:
                continue  # missing
            spec[key] = draw(any_values if choice == 1 else good)
        specs.append(spec)
    if draw(st.booleans()):
        return specs, [_fitting_frame(spec) for spec in specs]
    return specs, draw(st.lists(st.binary(max_size=16), max_size=4))


def _parse_and_check(specs: object, frames: list[bytes]) -> None:
    try:
        parsed = parse_specs(specs)
        check_frames(parsed, frames, max_elements=10**6)
        arrays_from(parsed, frames)
        batch_rows(parsed)
    except ProtocolError as exc:
        assert len(str(exc)) < 2000


@settings(max_examples=500, deadline=None)
@given(any_values, st.lists(st.binary(max_size=16), max_size=3))
def test_fuzzed_inputs_lists_raise_only_protocol_errors(specs: object,
                                                        frames: list[bytes]) -> None:
    _parse_and_check(specs, frames)


@settings(max_examples=800, deadline=None)
@given(hostile_specs())
@example(([{"name": "a", "dtype": ["float32"], "shape": [1]}], [b"abcd"]))
@example(([{"name": "a", "dtype": {"x": 1}, "shape": [1]}], [b"abcd"]))
@example(([{"name": "a", "dtype": "float32", "shape": [0, 2**63]}], [b""]))
@example(([{"name": "a", "dtype": "string", "shape": [0, 2**62, 4]}], [b""]))
@example(([{"name": "a", "dtype": "uint8", "shape": [2**70, 0]}], [b""]))
def test_fuzzed_spec_fields_raise_only_protocol_errors(case: tuple[object, list[bytes]]) -> None:
    specs, frames = case
    _parse_and_check(specs, frames)
    try:
        packed = encode(Message(INFER, b"j", {"inputs": specs}, list(frames)))
    except (OverflowError, TypeError, ValueError):
        return  # not msgpack-able (an int beyond 64 bits): cannot arrive on the wire
    with contextlib.suppress(ProtocolError):
        msg = decode(packed)
        _parse_and_check(msg.header.get("inputs"), list(map(bytes, msg.arrays)))


# --- JOB messages ---------------------------------------------------------------------------

def _entry(job_id: bytes, **arrays: np.ndarray) -> JobEntry:
    specs, frames = pack_arrays(arrays)
    return JobEntry(job_id, specs, frames)


def test_job_round_trip() -> None:
    entries = [_entry(b"17", x=np.ones((2, 3), np.float32)), _entry(b"18"),
               _entry(b"19", x=np.zeros((1, 3), np.float32), s=np.array(["a"], object))]
    msg = pack_job(entries, pad_to=4)
    assert msg.kind == JOB and msg.job_id == b""
    assert msg.header["pad_to"] == 4 and [j["id"] for j in msg.header["jobs"]] == \
        ["17", "18", "19"]  # the same wire layout as before: ids as text
    back, pad_to = unpack_job(decode([bytes(f) for f in encode(msg)], INTERNAL_HOP))
    assert pad_to == 4
    assert [(e.id, e.inputs, len(e.arrays)) for e in back] == \
        [(e.id, e.inputs, len(e.arrays)) for e in entries]
    np.testing.assert_array_equal(unpack_arrays(back[2].inputs, back[2].arrays)["s"],
                                  np.array([b"a"], object))
    assert readable_job_ids(msg) == [b"17", b"18", b"19"]


def test_pack_job_refuses_what_it_could_not_frame() -> None:
    with pytest.raises(ProtocolError, match="not ASCII"):
        pack_job([JobEntry("é".encode(), [], [])], 0)
    with pytest.raises(ProtocolError, match="1 specs but 0 frames"):
        pack_job([JobEntry(b"1", [{"name": "x"}], [])], 0)
    with pytest.raises(ProtocolError, match="pad_to"):
        pack_job([], -1)


SPEC = {"name": "x", "dtype": "uint8", "shape": [1]}


@pytest.mark.parametrize(("header", "arrays", "fragment"), [
    ({"pad_to": 0}, [], "'jobs' list"),
    ({"jobs": {}, "pad_to": 0}, [], "'jobs' list"),
    ({"jobs": []}, [], "pad_to"),
    ({"jobs": [], "pad_to": -1}, [], "pad_to"),
    ({"jobs": [], "pad_to": True}, [], "pad_to"),
    ({"jobs": [], "pad_to": 1.5}, [], "pad_to"),
    ({"jobs": [[]], "pad_to": 0}, [], "must be a map"),
    ({"jobs": [{"id": 1, "inputs": []}], "pad_to": 0}, [], "job id"),
    ({"jobs": [{"id": b"1", "inputs": []}], "pad_to": 0}, [], "job id"),
    ({"jobs": [{"id": "", "inputs": []}], "pad_to": 0}, [], "job id"),
    ({"jobs": [{"id": "x" * 65, "inputs": []}], "pad_to": 0}, [], "job id"),
    ({"jobs": [{"id": "é", "inputs": []}], "pad_to": 0}, [], "job id"),
    ({"jobs": [{"id": "1", "inputs": []}, {"id": "1", "inputs": []}], "pad_to": 0}, [],
     "twice"),
    ({"jobs": [{"id": "1", "inputs": "x"}], "pad_to": 0}, [], "list of array specs"),
    ({"jobs": [{"id": "1", "inputs": [1]}], "pad_to": 0}, [b"a"], "list of array specs"),
    ({"jobs": [{"id": "1"}], "pad_to": 0}, [], "list of array specs"),
    ({"jobs": [{"id": "1", "inputs": [SPEC, SPEC]}], "pad_to": 0}, [b"a"], "only 1 remain"),
    ({"jobs": [{"id": "1", "inputs": [SPEC]}], "pad_to": 0}, [b"a", b"b"], "name 1 arrays, 2"),
])
def test_unpack_job_refuses_malformed_headers(header: dict[str, object], arrays: list[bytes],
                                              fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment) as info:
        unpack_job(Message(JOB, b"", header, list(arrays)))
    assert info.value.code == "internal"  # the supervisor's fault, never the client's


def test_readable_job_ids_of_a_malformed_job_message() -> None:
    header = {"jobs": [{"id": "1"}, {"id": 2}, "junk", {"id": "3", "inputs": 5}, {"id": "1"}],
              "pad_to": "x"}
    assert readable_job_ids(Message(JOB, b"", header)) == [b"1", b"3"]
    assert readable_job_ids(Message(JOB, b"", {"jobs": "x"})) == []


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["jobs", "pad_to", "x"]),
                       any_values | st.lists(st.dictionaries(
                           st.sampled_from(["id", "inputs"]), any_values), max_size=3)),
       st.lists(st.binary(max_size=4), max_size=3))
def test_fuzzed_job_headers_raise_only_protocol_errors(header: dict[str, object],
                                                       arrays: list[bytes]) -> None:
    msg = Message(JOB, b"", header, list(arrays))
    readable_job_ids(msg)
    with contextlib.suppress(ProtocolError):
        entries, pad_to = unpack_job(msg)
        assert pad_to >= 0 and sum(len(e.arrays) for e in entries) == len(arrays)


# --- batch rows -------------------------------------------------------------------------

@pytest.mark.parametrize(("shapes", "rows"), [
    ([(3, 2), (3,)], 3), ([(0, 4)], 0), ([(1, 2), (0, 2)], None), ([(2,), ()], None),
    ([()], None), ([], None), ([(None, 4)], None), ([(5,), (5, 1, 1)], 5),
])
def test_batch_rows(shapes: list[tuple[int | None, ...]], rows: int | None) -> None:
    specs = [TensorSpec(f"a{i}", "float32", shape) for i, shape in enumerate(shapes)]
    assert batch_rows(specs) == rows


def _parsed_or_error(parse: Any, specs: object, allow_none: bool) -> object:
    try:
        return parse(specs, allow_none, "inputs")
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


spec_values = st.none() | st.booleans() | st.integers(-3, 2**63) | st.floats() | \
    st.sampled_from(["x", "y", "", "float32", "int64", "string", "bogus"]) | \
    st.lists(st.none() | st.booleans() | st.integers(-2, 5) | st.floats(), max_size=10)
raw_specs = st.lists(
    st.dictionaries(st.sampled_from(["name", "dtype", "shape", "extra"]), spec_values)
    | st.fixed_dictionaries({"name": st.sampled_from(["x", "y"]),
                             "dtype": st.sampled_from(["float32", "int8", "string", "f4"]),
                             "shape": st.lists(st.none() | st.booleans() | st.integers(-1, 4),
                                               max_size=9)}),
    max_size=3) | spec_values


@settings(max_examples=500, deadline=None)
@given(raw_specs, st.booleans())
def test_parsing_any_specs_gives_specs_or_a_protocol_error(specs: object,
                                                           allow_none: bool) -> None:
    """Whatever a header holds where specs belong: TensorSpecs of exactly its entries, or a
    ProtocolError (never another error)."""
    got = _parsed_or_error(parse_specs, specs, allow_none)
    if isinstance(got, list):
        assert isinstance(specs, list) and len(got) == len(specs)
        assert all(isinstance(s, TensorSpec) for s in got)


def _unpacked_or_error(spec: TensorSpec, frame: bytes) -> object:
    try:
        check_frames([spec], [frame], max_elements=10**4)
        return {name: (a.dtype, a.shape, a.tobytes() if a.dtype != object else a.tolist())
                for name, a in arrays_from([spec], [frame]).items()}
    except ProtocolError as exc:
        return f"ProtocolError: {exc}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | st.integers(0, 5), max_size=4),
       st.sampled_from(sorted(NUMERIC_DTYPES | {"string", "object"})),
       st.lists(st.binary(max_size=24), max_size=3))
def test_a_spec_used_again_checks_frames_as_a_new_one(shape: list[int | None], dtype: str,
                                                      frames: list[bytes]) -> None:
    """A spec keeps its concrete shape and element count once worked out (admission keeps
    the specs of a description that passed): a spec used before gives, frame after frame,
    what a spec made afresh gives, and what the shape says."""
    kept = TensorSpec("a", dtype, tuple(shape))
    count = math.prod(d or 0 for d in shape)
    fitting = b"\x00\x00\x00\x00" * count if dtype == "string" else \
        b"\x00" * count * protocol.ITEMSIZE.get(dtype, 1)
    for frame in [fitting, *frames, fitting, *frames]:
        assert _unpacked_or_error(kept, frame) == \
            _unpacked_or_error(TensorSpec("a", dtype, tuple(shape)), frame)
        assert kept.concrete == tuple(d or 0 for d in shape) and kept.elements == count


def test_a_header_msgpack_says_nothing_about_is_named_without_an_empty_reason() -> None:
    with pytest.raises(ProtocolError) as raised:
        decode([VERSION, INFER, b"", b"\xc1"])  # a byte msgpack never uses
    assert str(raised.value).endswith("header is not valid msgpack (FormatError)"), raised.value
