"""Padding of variable-length dimensions: the one definition both processes use.

A model may name dimensions that vary per request (a sequence length, say) and the sizes
they are padded up to (``models.NAME.padding``, docs/configuration.md). Padding does two
things: jobs of different lengths share a batch (padded to the longest one's bucket), and
the model sees a bounded set of shapes, so TF's per-shape caches stop growing.

The supervisor uses ``lengths`` and ``batch_key`` at admission (refusing a job whose lengths
disagree or exceed the largest size) and for batching; the worker uses ``pad``, ``cut`` and
``generated`` to build the padded batch and give each job back its own outputs. Nothing here
imports TensorFlow; the arrays are numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from supervisor.shared.protocol import ProtocolError, TensorSpec

Key = tuple[tuple[str, str, tuple[int, ...]], ...]


class Join(NamedTuple):
    """What a job of a padded model must match to ride, padded up, in a batch of longer
    jobs (supervisor/core/batching.py); ``batch_keys`` makes it at admission."""

    layout: Key  # the job's batch key with every padded axis open (0)
    dims: tuple[str, ...]  # the padded dimensions' names: other padding settings never match
    buckets: tuple[int, ...]  # the job's bucket on each of ``dims``, in order (0: absent)

    def fits_under(self, top: Join) -> bool:
        """Whether this job can ride in ``top``'s batch: the same layout and dimensions,
        and no bucket longer than ``top``'s."""
        return (self.layout == top.layout and self.dims == top.dims
                and len(self.buckets) == len(top.buckets)
                and all(b <= t for b, t in zip(self.buckets, top.buckets, strict=True)))


@dataclass(frozen=True)
class PadDim:
    """One padded dimension, as configured (``PaddingConfig`` in supervisor/config/keys.py)."""

    name: str
    inputs: Mapping[str, int]  # input name -> axis (>= 1: axis 0 is the batch)
    sizes: tuple[int, ...]  # ascending
    value: float  # what padded positions hold
    outputs: Mapping[str, int]  # output name -> axis cut back to each job's length
    mask_input: str | None  # generated input: 1 where a position is real, 0 where padded
    length_input: str | None  # generated input: each row's real length
    pads: bool  # False: the model's outputs change with padding; lengths batch only alike
    verify: bool = True  # the worker proves at load that padding leaves outputs alone

    def bucket(self, length: int) -> int:
        """The size a job of this length is padded to: its own length when not padding, or
        when longer than the largest size (admission refuses those; a worker still running
        older settings after a reload serves what admission admitted, unpadded)."""
        if not self.pads:
            return length
        return next((size for size in self.sizes if size >= length), length)

    @property
    def generated(self) -> tuple[str, ...]:
        return tuple(n for n in (self.mask_input, self.length_input) if n is not None)


def generated_inputs(dims: Sequence[PadDim]) -> frozenset[str]:
    """Inputs the worker makes itself: clients neither send them nor see them."""
    return frozenset(name for dim in dims for name in dim.generated)


def lengths(specs: Sequence[TensorSpec], dims: Sequence[PadDim],
            at_admission: bool = True) -> dict[str, int]:
    """Each dimension's length in this job; ProtocolError (bad_request) when an input lacks
    the axis, its inputs disagree, or (``at_admission``) it is longer than the largest size.
    A worker does not hold jobs to its own largest size: during a reload its settings may
    be older than admission's, and what admission admitted is served."""
    shapes = {s.name: s.shape for s in specs}
    found: dict[str, int] = {}
    for dim in dims:
        seen: dict[str, int] = {}
        for name, axis in dim.inputs.items():
            shape = shapes.get(name)
            if shape is None:
                continue  # a missing input is check_specs' to report
            size = shape[axis] if len(shape) > axis else None
            if size is None:
                raise ProtocolError(f"input '{name}' has shape {list(shape)}: "
                                    f"padding '{dim.name}' needs an axis {axis}")
            seen[name] = size
        if len(set(seen.values())) > 1:
            told = ", ".join(f"{n} {v}" for n, v in seen.items())
            raise ProtocolError(f"inputs disagree on '{dim.name}' ({told}): "
                                "they are padded together and must be equally long")
        if not seen:
            continue
        length = next(iter(seen.values()))
        if at_admission and length > dim.sizes[-1]:
            raise ProtocolError(f"'{dim.name}' is {length} long, more than the "
                                f"largest size the model is padded to ({dim.sizes[-1]})")
        found[dim.name] = length
    return found


def batch_key(specs: Sequence[TensorSpec], dims: Sequence[PadDim]) -> Key:
    """What must match for two jobs to share a batch: names, dtypes, and shapes past the
    batch dimension with each padded axis at its bucket (ProtocolError as ``lengths``)."""
    return batch_keys(specs, dims)[0]


def batch_keys(specs: Sequence[TensorSpec], dims: Sequence[PadDim]) -> tuple[Key, Join | None]:
    """``batch_key``, and what a job must match to ride in a batch of longer jobs, padded up
    to their bucket: the key with every padded axis open, and the job's bucket on each
    dimension (None when a dimension does not pad: its lengths batch only alike)."""
    found = lengths(specs, dims)
    buckets = {dim.name: dim.bucket(found[dim.name]) for dim in dims if dim.name in found}
    axes = {name: (axis, buckets[dim.name])
            for dim in dims if dim.name in found for name, axis in dim.inputs.items()}
    key, open_key = [], []
    for spec in specs:
        shape = [d if isinstance(d, int) else -1 for d in spec.shape]
        open_shape = list(shape)
        if spec.name in axes:
            axis, size = axes[spec.name]
            shape[axis], open_shape[axis] = size, 0
        key.append((spec.name, spec.dtype, tuple(shape[1:])))
        open_key.append((spec.name, spec.dtype, tuple(open_shape[1:])))
    if not dims or not all(dim.pads for dim in dims):
        return tuple(key), None
    names = tuple(dim.name for dim in dims)
    return tuple(key), Join(tuple(open_key), names, tuple(buckets.get(n, 0) for n in names))


# --- the worker's side -------------------------------------------------------------------

def array_lengths(inputs: Mapping[str, np.ndarray], dims: Sequence[PadDim]) -> dict[str, int]:
    """``lengths`` for arrays in hand, in a worker (see ``lengths``)."""
    specs = [TensorSpec(name, str(a.dtype), tuple(a.shape)) for name, a in inputs.items()]
    return lengths(specs, dims, at_admission=False)


def pad(inputs: Mapping[str, np.ndarray], dims: Sequence[PadDim], buckets: Mapping[str, int],
        dtypes: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """The job's inputs with each padded axis filled up to its bucket with the dimension's
    value, and the generated mask and length inputs added (one row per job row, in the
    model's dtype for them when ``dtypes`` names it, else int32)."""
    found = array_lengths(inputs, dims)
    out = dict(inputs)
    rows = _rows(inputs)
    for dim in dims:
        if dim.name not in found:
            continue
        length, size = found[dim.name], buckets[dim.name]
        for name, axis in dim.inputs.items():
            if name in out and size > length:
                out[name] = _pad_axis(out[name], axis, size, dim.value)
        for name, array in generated(dim, rows, length, size).items():
            dtype = (dtypes or {}).get(name)
            out[name] = array.astype(dtype) if dtype is not None else array
    return out


def generated(dim: PadDim, rows: int, length: int, size: int) -> dict[str, np.ndarray]:
    """The mask (rows x size: 1 real, 0 padded) and lengths (rows) inputs of one job."""
    made: dict[str, np.ndarray] = {}
    if dim.mask_input is not None:
        mask = np.zeros((rows, size), dtype=np.int32)
        mask[:, :length] = 1
        made[dim.mask_input] = mask
    if dim.length_input is not None:
        made[dim.length_input] = np.full((rows,), length, dtype=np.int32)
    return made


def cut(outputs: Mapping[str, np.ndarray], dims: Sequence[PadDim], found: Mapping[str, int],
        buckets: Mapping[str, int]) -> dict[str, np.ndarray]:
    """One job's outputs with each axis that follows a padded dimension cut back to the
    job's own length; ValueError if such an output does not have the padded size there."""
    out = dict(outputs)
    for dim in dims:
        if dim.name not in found:
            continue
        for name, axis in dim.outputs.items():
            array = out.get(name)
            if array is None:
                continue
            if array.ndim <= axis or array.shape[axis] != buckets[dim.name]:
                raise ValueError(f"output '{name}' has shape {array.shape}: padding "
                                 f"'{dim.name}' says its axis {axis} follows the padded "
                                 f"length {buckets[dim.name]}")
            out[name] = np.take(array, np.arange(found[dim.name]), axis=axis)
    return out


def _pad_axis(array: np.ndarray, axis: int, size: int, value: float) -> np.ndarray:
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return np.pad(array, widths, constant_values=np.asarray(value).astype(array.dtype))


def _rows(inputs: Mapping[str, np.ndarray]) -> int:
    return next((a.shape[0] for a in inputs.values() if a.ndim), 1)


def fits_dtype(value: float, dtype: str) -> bool:
    """Whether a pad value is exactly representable in the input's dtype."""
    try:
        kind = np.dtype(dtype)
    except TypeError:
        return False
    if kind.kind in "iu":
        info = np.iinfo(kind)
        return float(value).is_integer() and info.min <= value <= info.max
    if kind.kind == "b":
        return value in (0, 1)
    if kind.kind != "f":
        return False
    with np.errstate(over="ignore"):  # too large for the dtype: inf, refused below
        held = np.asarray(value).astype(kind)
    return bool(np.isfinite(held)) and float(held) == value


def from_config(padding: Mapping[str, Any]) -> tuple[PadDim, ...]:
    """PadDims from ``models.NAME.padding`` (``{name: PaddingConfig}``, validated)."""
    return tuple(PadDim(name, dict(c.inputs), tuple(sorted(c.sizes)), float(c.value),
                        dict(c.outputs), c.mask_input, c.length_input, not c.changes_outputs,
                        c.verify)
                 for name, c in padding.items())
