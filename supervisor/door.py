"""The door's check of a request's arrays, remembered per kind of request.

A request's header describes its arrays (name, dtype, shape); the door checks that
description (parse_specs), the frames against it (check_frames) and it against the model's
inputs (check_specs), all from the header and frame lengths. Clients send the same few
descriptions again and again, so the outcome of a description that passed is kept: the next
request with the same one only has its frame lengths compared. Under saturation the full
check was a fifth of the supervisor's CPU per job (bench/results/throughput.md).

What is kept is exact: a description is remembered only when every value in it is of the
plain type the full check accepts (a str name and dtype, a list of non-bool ints as shape,
no other keys), so two descriptions with the same key pass or fail alike; anything else,
and every failure, goes through the full check, which gives the error. String arrays are
always checked in full (their frames' contents are checked, not only their lengths).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.protocol import (
    ITEMSIZE,
    MAX_NDIM,
    Frame,
    TensorSpec,
    check_frames,
    check_specs,
    concrete_shape,
    frame_length,
    parse_specs,
)

# Descriptions kept per model; past this the memory starts over (a client that sends a new
# shape every time only costs the full check, as before).
MAX_KEPT = 1024

Key = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Passed:
    inputs: Sequence[TensorSpec] | None  # the model's inputs it was checked against
    specs: list[TensorSpec]
    lengths: tuple[int, ...]  # bytes each array frame must have
    elements: int


class Door:
    """One per model: the descriptions that passed, by key."""

    def __init__(self) -> None:
        self.passed: dict[Key, Passed] = {}

    def check(self, raw: object, frames: Sequence[Frame], inputs: Sequence[TensorSpec] | None,
              max_elements: int | None) -> list[TensorSpec]:
        """The request's specs; ProtocolError, as the full check raises it, if it fails."""
        key = spec_key(raw)
        known = self.passed.get(key) if key is not None else None
        if known is not None and known.inputs is inputs and _fits(known, frames, max_elements):
            return known.specs
        specs = parse_specs(raw)
        check_frames(specs, frames, max_elements)
        if inputs is not None:
            check_specs(inputs, specs)
        if key is not None and all(s.dtype in ITEMSIZE for s in specs):
            if len(self.passed) >= MAX_KEPT:
                self.passed.clear()
            lengths = tuple(_elements(s) * ITEMSIZE[s.dtype] for s in specs)
            self.passed[key] = Passed(inputs, specs, lengths, sum(_elements(s) for s in specs))
        return specs


def _fits(known: Passed, frames: Sequence[Frame], max_elements: int | None) -> bool:
    if len(frames) != len(known.lengths):
        return False
    if max_elements is not None and known.elements > max_elements:
        return False
    return all(frame_length(f) == n for f, n in zip(frames, known.lengths, strict=True))


def spec_key(raw: object) -> Key | None:
    """A hashable key for a description made only of plain values, else None."""
    if type(raw) is not list:
        return None
    key = []
    for spec in raw:
        if type(spec) is not dict or len(spec) != 3:
            return None
        name, dtype, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
        if type(name) is not str or type(dtype) is not str or type(shape) is not list \
                or len(shape) > MAX_NDIM or not all(type(d) is int for d in shape):
            return None
        key.append((name, dtype, tuple(shape)))
    return tuple(key)


def _elements(spec: TensorSpec) -> int:
    return math.prod(concrete_shape(spec))
