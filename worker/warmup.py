"""Before "ready": check the padding settings against the model, warm every shape traffic
will use, and prove that padding leaves the outputs alone.

TensorFlow takes memory per input shape (traced graphs, oneDNN primitive caches). Warming
each batch size in ``warmup_batch_sizes`` with each padding size puts that memory in the
worker's "ready" figure, so the supervisor's baseline holds it and the trend does not take
the first hour of traffic for a leak (docs/batching.md).
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from supervisor.shared import logs
from supervisor.shared.padding import PadDim, cut, fits_dtype, pad
from supervisor.shared.protocol import TensorSpec, wire_dtype
from supervisor.shared.strings import STRING
from worker.direct_call import prove
from worker.runners import Arrays, LoadError, Runner

log = logs.get(__name__)

# Outputs of a job padded and unpadded must agree to this (float32 sums in another order).
RTOL, ATOL = 1e-3, 1e-5


def check_padding(runner: Runner) -> None:
    """LoadError when the padding settings do not fit the model's inputs and outputs."""
    inputs = {s.name: s for s in runner.inputs or []}
    outputs = {s.name: s for s in runner.outputs or []}
    for dim in runner.padding:
        where = f"padding '{dim.name}'"
        for name, axis in dim.inputs.items():
            spec = inputs.get(name)
            if spec is None:
                if inputs:
                    raise LoadError(f"{where}: the model has no input '{name}' (it has: "
                                    f"{', '.join(sorted(inputs))})")
                continue
            _check_axis(where, spec, axis, dim)
            # The value is only used where lengths are padded (not with changes_outputs).
            if dim.pads and (spec.dtype == STRING or not fits_dtype(dim.value, spec.dtype)):
                raise LoadError(f"{where}: value {dim.value:g} cannot be held exactly by "
                                f"input '{name}' ({spec.dtype})")
        for name in dim.generated:
            if inputs and name not in inputs:
                raise LoadError(f"{where}: the model has no input '{name}' to generate")
        for name in dim.outputs:
            if outputs and name not in outputs:
                raise LoadError(f"{where}: the model has no output '{name}' (it has: "
                                f"{', '.join(sorted(outputs))})")


def _check_axis(where: str, spec: TensorSpec, axis: int, dim: PadDim) -> None:
    if spec.shape and len(spec.shape) <= axis:
        raise LoadError(f"{where}: input '{spec.name}' has {len(spec.shape)} dimensions, no "
                        f"axis {axis}")
    fixed = spec.shape[axis] if spec.shape else None
    if fixed is not None and set(dim.sizes) != {fixed}:
        raise LoadError(f"{where}: input '{spec.name}' is always {fixed} long on axis {axis}; "
                        f"it cannot be padded to {list(dim.sizes)}")


def shapes(runner: Runner, batch_sizes: tuple[int, ...] | list[int]) -> list[
        tuple[int, dict[str, int]]]:
    """(batch size, length per padded dimension) of every shape to warm."""
    dims = runner.padding
    combos = list(itertools.product(*(dim.sizes for dim in dims))) or [()]
    return [(rows, {dim.name: size for dim, size in zip(dims, combo, strict=True)})
            for rows in batch_sizes for combo in combos]


def example(runner: Runner, rows: int, lengths: dict[str, int], sizes: dict[str, int]) -> Arrays:
    """A job of ``rows`` rows whose padded dimensions are ``lengths`` long, padded up to
    ``sizes`` (with the generated inputs); real positions hold 1 (0 where 1 is the pad
    value), so padding is told from data, and everything else 0."""
    assert runner.inputs is not None
    made = {name for dim in runner.padding for name in dim.generated}
    axes = {name: (axis, dim) for dim in runner.padding for name, axis in dim.inputs.items()}
    job: Arrays = {}
    for spec in runner.inputs:
        if spec.name in made:
            continue
        shape = [rows, *(1 if d is None else d for d in spec.shape[1:])]
        fill = 0.0
        if spec.name in axes:
            axis, dim = axes[spec.name]
            shape[axis] = lengths[dim.name]
            fill = 0.0 if dim.value == 1 else 1.0
        job[spec.name] = _full(spec.dtype, tuple(shape), fill)
    return pad(job, runner.padding, sizes, runner.input_dtypes)


def _full(dtype: str, shape: tuple[int, ...], fill: float) -> np.ndarray:
    if dtype == STRING:
        return np.full(shape, b"", dtype=object)
    return np.full(shape, fill, dtype=dtype)


def warm(runner: Runner, batch_sizes: tuple[int, ...] | list[int]) -> Arrays:
    """Run every warm-up shape once (LoadError if one fails); the last outputs."""
    assert runner.inputs is not None
    started = time.monotonic()
    outputs: Arrays = {}
    todo = shapes(runner, batch_sizes)
    for rows, sizes in todo:
        try:
            outputs = runner(example(runner, rows, sizes, sizes))
        except Exception as exc:
            raise LoadError(f"warm-up inference failed (batch {rows}, lengths {sizes}): "
                            f"{type(exc).__name__}: {exc}") from exc
        _check_cut_axes(runner.padding, outputs, sizes)
    if len(todo) > 1:
        log.info("warmed_up_shapes", shapes=len(todo), seconds=round(time.monotonic() - started,
                                                                     2))
    return outputs


def adopt_direct(runner: Runner, batch_sizes: tuple[int, ...] | list[int]) -> None:
    """Serve through the runner's direct call (worker/direct_call.py) if, on the first
    warm-up shape, it answers as the model's public call does; else keep the public one."""
    if runner.direct is None or runner.inputs is None:
        return
    rows, sizes = shapes(runner, batch_sizes)[0]
    if prove(runner.call, runner.direct, example(runner, rows, sizes, sizes), _close):
        runner.call = runner.direct
        log.info("direct_call_used")
    runner.direct = None


def _check_cut_axes(dims: tuple[PadDim, ...], outputs: Arrays, sizes: dict[str, int]) -> None:
    """Each output named to be cut back must follow its padded length at every size: an
    axis that does not would be cut at random (or fail every job), whatever ``verify``."""
    for dim in dims:
        for name, axis in dim.outputs.items():
            array = outputs.get(name)
            if array is None:
                continue  # a handler without declared outputs may leave one out
            if array.ndim <= axis or array.shape[axis] != sizes[dim.name]:
                raise LoadError(f"padding '{dim.name}': output '{name}' has shape "
                                f"{array.shape} at length {sizes[dim.name]}, so its axis "
                                f"{axis} does not follow the padded length; name only outputs "
                                f"that do under padding.{dim.name}.outputs")


def output_specs(outputs: Arrays, dims: tuple[PadDim, ...]) -> list[TensorSpec]:
    """Specs of a handler's outputs, from one warm-up call: any batch size, and any length
    on an axis cut back to each job's own."""
    cut_axes = {(name, axis) for dim in dims for name, axis in dim.outputs.items()}
    return [TensorSpec(name, wire_dtype(array), tuple(
        None if i == 0 or (name, i) in cut_axes else d for i, d in enumerate(array.shape)))
        for name, array in outputs.items()]


def verify(runner: Runner) -> None:
    """LoadError if padding changes the model's outputs: a job one shorter than a padding
    size is run as it is and padded, and the outputs (cut back) must agree."""
    for dim in runner.padding:
        if not dim.pads or not dim.verify:
            continue
        length = next((n for n in range(1, dim.sizes[-1]) if dim.bucket(n) > n), None)
        if length is None:
            continue  # every length is a size: nothing is ever padded
        others = {d.name: d.sizes[0] for d in runner.padding if d is not dim}
        short = {**others, dim.name: length}
        padded = {**others, dim.name: dim.bucket(length)}
        try:
            alone = runner(example(runner, 1, short, short))
            filled = cut(runner(example(runner, 1, short, padded)), runner.padding, short,
                         padded)
        except Exception as exc:
            raise LoadError(f"padding '{dim.name}' check failed: {type(exc).__name__}: "
                            f"{exc}") from exc
        for name, want in alone.items():
            got = filled.get(name)
            if got is None or got.shape != want.shape or not _close(got, want):
                raise LoadError(
                    f"padding '{dim.name}' changes the model's output '{name}' (a job "
                    f"{length} long padded to {dim.bucket(length)}: "
                    f"{_difference(got, want)}). Padding is safe only when the model ignores "
                    "padded positions: give it a mask (mask_input, or a mask input the client "
                    "sends, padded with 0) or lengths (length_input); set changes_outputs: "
                    "true to batch only equal lengths instead, or verify: false if the "
                    "difference is expected")


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    if want.dtype.kind in "fc":
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        return bool(np.allclose(got, want, rtol=RTOL, atol=ATOL * max(1.0, scale)))
    return bool(np.array_equal(got, want))


def _difference(got: np.ndarray | None, want: np.ndarray) -> str:
    if got is None:
        return "missing"
    if got.shape != want.shape:
        return f"shape {got.shape} against {want.shape}"
    if want.dtype.kind in "fc":
        return f"max abs difference {float(np.max(np.abs(got - want))):.3g}"
    return "values differ"
