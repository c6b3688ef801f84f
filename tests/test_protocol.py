"""Wire protocol: round trips, and no input makes decode fail other than with ProtocolError."""

from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.protocol import (
    INFER,
    NUMERIC_DTYPES,
    RESULT,
    VERSION,
    ZERO_COPY_MIN,
    Message,
    ProtocolError,
    TensorSpec,
    decode,
    encode,
    error_message,
    pack_arrays,
    pack_results,
    split_envelope,
    unpack_arrays,
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
    back = unpack_results(decode(encode(pack_results(replies))))
    assert [(m.kind, m.job_id, m.header) for m in back] == \
        [(m.kind, m.job_id, m.header) for m in replies]
    assert [len(m.arrays) for m in back] == [2, 0, 1] and back[2].arrays == [b"tail"]


@pytest.mark.parametrize(("header", "arrays", "fragment"), [
    ({}, [], "'jobs' list"),
    ({"jobs": [{"id": b"1", "kind": b"infer", "header": {}, "arrays": 0}]}, [], "kind"),
    ({"jobs": [{"id": "1", "kind": b"result", "header": {}, "arrays": 0}]}, [], "id"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": {}, "arrays": 2}]}, [b"a"], "2 arrays"),
    ({"jobs": [{"id": b"1", "kind": b"result", "header": {}, "arrays": 0}]}, [b"a"], "0 arrays"),
])
def test_unpack_results_refuses_what_does_not_add_up(header: dict[str, object],
                                                     arrays: list[bytes], fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment):
        unpack_results(Message(b"results", b"", header, list(arrays)))


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
