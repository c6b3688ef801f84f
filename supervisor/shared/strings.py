"""String arrays on the wire (dtype ``"string"``, TensorFlow's ``tf.string``).

One frame per array: every element's length as a little-endian uint32, then every element's
bytes, both in C order. In numpy a string array is an object array of ``bytes``, the form
TensorFlow accepts and returns; ``str`` elements are sent UTF-8 encoded. Text is data here:
nothing received is decoded, evaluated or unpickled.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

STRING = "string"
_LENGTH = np.dtype("<u4")


class StringFrameError(ValueError):
    """A string frame whose lengths do not add up to its size."""


def is_string_array(array: np.ndarray) -> bool:
    return array.dtype.kind in "OSU"


def pack_strings(array: np.ndarray) -> bytes:
    items = [_as_bytes(item) for item in array.ravel(order="C")]
    lengths = np.fromiter((len(item) for item in items), dtype=_LENGTH, count=len(items))
    return lengths.tobytes() + b"".join(items)


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return bytes(item)
    if isinstance(item, str):
        return item.encode()
    raise TypeError(f"a string array holds {type(item).__name__}, not str or bytes")


def string_lengths(buffer: Any, count: int) -> np.ndarray:
    """The element lengths of a frame said to hold ``count`` strings, checked against its
    size without touching the text."""
    view = memoryview(buffer)
    head = count * _LENGTH.itemsize
    if view.nbytes < head:
        raise StringFrameError(f"{view.nbytes} bytes cannot hold the lengths of {count} strings")
    lengths = np.frombuffer(view, dtype=_LENGTH, count=count)
    if head + int(lengths.sum(dtype=np.uint64)) != view.nbytes:
        raise StringFrameError(f"{count} string lengths add up to {int(lengths.sum())} bytes, "
                               f"but {view.nbytes - head} bytes of text came")
    return lengths


def unpack_strings(buffer: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An object array of bytes (each element one copy: Python strings own their bytes)."""
    count = math.prod(shape)
    lengths = string_lengths(buffer, count)
    text = memoryview(buffer)[count * _LENGTH.itemsize:]
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    out = np.empty(count, dtype=object)
    start = 0
    for i, end in enumerate(ends):
        out[i] = bytes(text[start:end])
        start = end
    return out.reshape(shape)
