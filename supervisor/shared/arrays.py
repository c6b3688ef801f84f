"""Arrays on the wire: their specs (name, dtype, shape), numpy arrays packed into raw frames
(C order, little-endian) and back without a copy, frames checked against specs, and specs
against a model's inputs. A header's ``inputs`` or ``outputs`` list describes its arrays."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from supervisor.shared.strings import (
    STRING,
    StringFrameError,
    is_string_array,
    pack_strings,
    string_lengths,
    unpack_strings,
)
from supervisor.shared.wire import (
    MAX_ARRAY_BYTES,
    MAX_NAME,
    MAX_NDIM,
    ZERO_COPY_MIN,
    Frame,
    ProtocolError,
    frame_buffer,
    frame_length,
    show_value,
)

# Plain numbers, and strings in their own frame layout (supervisor/shared/strings.py); no object,
# void or datetime dtypes: nothing that would need unpickling or evaluating.
NUMERIC_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                            "uint32", "uint64", "float16", "float32", "float64", "complex64",
                            "complex128"})
DTYPES = NUMERIC_DTYPES | {STRING}

ITEMSIZE = {name: np.dtype(name).itemsize for name in NUMERIC_DTYPES}
OBJECT_ITEMSIZE = np.dtype(object).itemsize  # a string array is an object array in numpy
# Each numeric dtype as its bytes travel (little-endian), and the set of them: an array of
# one of these is sent as it is.
WIRE_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in NUMERIC_DTYPES}
WIRE_ORDER = frozenset(WIRE_DTYPES.values())


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one array; ``None`` in a shape is any size."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_wire(cls, raw: object, allow_none: bool = False) -> TensorSpec:
        """Parse one header entry; ProtocolError (never another error) on any hostile value."""
        if not isinstance(raw, Mapping):
            raise ProtocolError(f"array spec must be a map with name, dtype and shape, got "
                                f"{show_value(raw)}")
        name, dtype, shape = raw.get("name"), raw.get("dtype"), raw.get("shape")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ProtocolError(f"array spec 'name' must be a non-empty string of at most "
                                f"{MAX_NAME} characters, got {show_value(name)}")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ProtocolError(f"array '{name}': dtype {show_value(dtype)} is not one of "
                                f"{', '.join(sorted(DTYPES))}")
        if not isinstance(shape, list | tuple) or len(shape) > MAX_NDIM:
            raise ProtocolError(f"array '{name}': shape must be a list of at most {MAX_NDIM} "
                                f"dimensions, got {show_value(shape)}")
        for dim in shape:
            ok_none = dim is None and allow_none
            if not ok_none and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
                raise ProtocolError(f"array '{name}': shape {show_value(list(shape))} has a bad "
                                    f"dimension {show_value(dim)}")
        # Every dimension counts, zeros as ones: numpy refuses [0, 2**62, 4] as it does
        # [2**62, 4], and a spec that could never become an array is refused here.
        itemsize = ITEMSIZE.get(dtype, OBJECT_ITEMSIZE)
        if math.prod(max(d or 1, 1) for d in shape) * itemsize > MAX_ARRAY_BYTES:
            raise ProtocolError(f"array '{name}': shape {show_value(list(shape))} is too large "
                                f"(more than 2**63-1 bytes of {dtype})")
        return cls(name, dtype, tuple(shape))

    # Both kept once computed: unpacking reads them twice per spec (check_frames, then
    # arrays_from), and admission once more for the description it keeps.
    @cached_property
    def concrete(self) -> tuple[int, ...]:
        """The shape of an actual array: an unknown dimension (a model's spec) counts as 0."""
        return tuple(d or 0 for d in self.shape)

    @cached_property
    def elements(self) -> int:
        return math.prod(self.concrete)

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    def accepts(self, other: TensorSpec) -> bool:
        """Whether a concrete array spec fits this (possibly partly unknown) spec."""
        if self.dtype != other.dtype or len(self.shape) != len(other.shape):
            return False
        return all(want is None or want == got for want, got in zip(self.shape, other.shape,
                                                                    strict=True))


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[list[dict[str, Any]], list[Frame]]:
    """Specs and frames for named arrays; large arrays are passed without copying."""
    specs: list[dict[str, Any]] = []
    frames: list[Frame] = []
    for name, value in arrays.items():
        array = value if type(value) is np.ndarray else np.asarray(value)
        dtype = wire_dtype(array)
        specs.append({"name": name, "dtype": dtype, "shape": list(array.shape)})
        if dtype == STRING:
            frames.append(_pack_strings(name, array))
            continue
        if dtype not in DTYPES:
            raise ProtocolError(f"array '{name}': dtype {dtype} cannot travel")
        if array.dtype not in WIRE_ORDER or not array.flags.c_contiguous:
            array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
        frames.append(memoryview(array.data).cast("B") if array.nbytes >= ZERO_COPY_MIN
                      else array.tobytes())
    return specs, frames


# numpy computes dtype.name in Python on every access (~2 µs, for every array of every
# message): the numeric dtypes an array is sent as it is (WIRE_ORDER) are named from a table.
_WIRE_NAMES = {WIRE_DTYPES[name]: name for name in NUMERIC_DTYPES}


def wire_dtype(array: np.ndarray) -> str:
    """The protocol's dtype name for an array: numpy's, or "string" for str/bytes/object."""
    name = _WIRE_NAMES.get(array.dtype)
    if name is None:
        name = STRING if is_string_array(array) else array.dtype.name
    return name


def _pack_strings(name: str, array: np.ndarray) -> bytes:
    try:
        return pack_strings(array)
    except TypeError as exc:
        raise ProtocolError(f"array '{name}': {exc}") from None


def unpack_arrays(specs: object, frames: Sequence[Frame], max_elements: int | None = None,
                  field: str = "inputs") -> dict[str, np.ndarray]:
    """Arrays from specs and frames, each checked against its dtype and shape (no copy)."""
    return arrays_from(parse_specs(specs, field=field), frames, max_elements)


def arrays_from(parsed: Sequence[TensorSpec], frames: Sequence[Frame],
                max_elements: int | None = None) -> dict[str, np.ndarray]:
    """unpack_arrays for specs already parsed."""
    check_frames(parsed, frames, max_elements)
    out: dict[str, np.ndarray] = {}
    for spec, frame in zip(parsed, frames, strict=True):
        if spec.dtype == STRING:
            out[spec.name] = unpack_strings(frame_buffer(frame), spec.concrete)
            continue
        dtype = WIRE_DTYPES[spec.dtype]
        out[spec.name] = np.frombuffer(frame_buffer(frame), dtype=dtype).reshape(spec.concrete)
    return out


def check_frames(parsed: Sequence[TensorSpec], frames: Sequence[Frame],
                 max_elements: int | None = None) -> None:
    """Each frame's length against its spec's dtype and shape, without building arrays."""
    if len(parsed) != len(frames):
        raise ProtocolError(f"header describes {len(parsed)} arrays but {len(frames)} array "
                            "frames came")
    if max_elements is not None:
        total = sum(s.elements for s in parsed)
        if total > max_elements:
            raise ProtocolError(f"{total} elements in all, more than the {max_elements} "
                                "allowed per request")
    for spec, frame in zip(parsed, frames, strict=True):
        if spec.dtype == STRING:
            _check_strings(spec, frame)
            continue
        itemsize = ITEMSIZE.get(spec.dtype)
        if itemsize is None:  # a spec made in code, not by from_wire
            raise ProtocolError(f"array '{spec.name}': dtype {show_value(spec.dtype)} cannot "
                                "travel")
        expected = spec.elements * itemsize
        if (length := frame_length(frame)) != expected:
            raise ProtocolError(f"array '{spec.name}': {length} bytes do not match "
                                f"{spec.dtype} shape {list(spec.shape)} ({expected} bytes)")


def _check_strings(spec: TensorSpec, frame: Frame) -> None:
    try:
        string_lengths(frame_buffer(frame), spec.elements)
    except StringFrameError as exc:
        raise ProtocolError(f"array '{spec.name}' (string shape {list(spec.shape)}): "
                            f"{exc}") from None


def batch_rows(specs: Sequence[TensorSpec]) -> int | None:
    """The first dimension all arrays of one job share: its rows in a batch. None when there
    is none: no arrays, a 0-d array, an unknown first dimension, or arrays that disagree.
    Such a job must never be concatenated with another (its rows could not be split back)."""
    firsts = {spec.shape[0] if spec.shape else None for spec in specs}
    if len(firsts) != 1:
        return None
    return next(iter(firsts))


def parse_specs(specs: object, allow_none: bool = False,
                field: str = "inputs") -> list[TensorSpec]:
    """The header field ``field`` (as an error names it) parsed: one TensorSpec per entry,
    names unique; ProtocolError on anything else. Nothing is remembered here: the supervisor
    keeps the descriptions that passed admission (supervisor/core/admission.py), and a
    worker parses a uniform batch's specs once for the whole batch (worker/uniform.py)."""
    if not isinstance(specs, list | tuple):
        got = "missing" if specs is None else f"got {type(specs).__name__}"
        raise ProtocolError(f"header field '{field}' must be a list of array specs ({got})")
    parsed = [TensorSpec.from_wire(s, allow_none) for s in specs]
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise ProtocolError("array names must be unique")
    return parsed


def check_specs(specs: Sequence[TensorSpec], got: Sequence[TensorSpec]) -> None:
    """Concrete array specs against a model's input specs: names, dtypes, shapes, one batch
    size. Both admission and the worker check a request from its header alone."""
    wanted = {s.name: s for s in specs}
    names = [g.name for g in got]
    if set(names) != set(wanted):
        expected = "; ".join(s.describe() for s in specs)
        raise ProtocolError(f"inputs {sorted(names)} do not match the model's inputs "
                            f"({expected})")
    batch: set[int] = set()
    for spec in got:
        if not wanted[spec.name].accepts(spec):
            raise ProtocolError(f"input {spec.describe()} does not fit the model's "
                                f"{wanted[spec.name].describe()}")
        if spec.shape and spec.shape[0] is not None:
            batch.add(spec.shape[0])
    if len(batch) > 1:
        raise ProtocolError(f"inputs disagree on the batch size: {sorted(batch)}")


