"""A SavedModel signature called without TensorFlow's per-call argument handling.

The public call of a loaded signature (``fn(features=x)``) binds the keyword arguments to
the function's type, casts each tensor against its TensorSpec and looks up the handle of
every captured variable (30 for the demo MLP), on every call, though none of it changes
between calls of a loaded model. Measured on the demo MLP (TF 2.21, one thread per op, CPU
time per call, the median of 5 rounds of 1,500 calls): 698 µs for one row through the public
call against 444 µs here, 1,139 against 1,001 µs for 32 rows. The saving is a fixed cost per
call, so it matters most where batches are small: one job in flight, a quiet service.

It calls TensorFlow's own ``ConcreteFunction._call_flat`` (what the public call ends in),
which is not public API, so it is used only where it is proven for this model on this
TensorFlow (:func:`prove`): this TensorFlow has it, no captured input is a distributed
variable (whose handle the public call resolves per call), and on a sample batch of random
values it returns what the public call returns. Anywhere else the public call is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from supervisor.shared import logs

log = logs.get(__name__)

Arrays = dict[str, np.ndarray]
Call = Callable[[Arrays], Mapping[str, Any]]


def direct_call(fn: Any) -> Call | None:
    """The signature ``fn`` called straight through its flat inputs, or None where this
    TensorFlow or this function does not allow it (then the public call serves)."""
    try:
        import tensorflow as tf
        from tensorflow.python.distribute import distribute_utils
        from tensorflow.python.eager.polymorphic_function.concrete_function import (
            ConcreteFunction,
        )

        call_flat = ConcreteFunction._call_flat
        # The order TensorFlow flattens the keyword arguments in: its own function type's.
        order = [p.name for p in fn.function_type.parameters.values()]
        captures = list(fn.captured_inputs)
    except (ImportError, AttributeError, TypeError):
        return None
    _, kwargs = fn.structured_input_signature
    if sorted(order) != sorted(kwargs) or \
            any(distribute_utils.is_distributed_variable(c) for c in captures):
        return None

    def call(arrays: Arrays) -> dict[str, Any]:
        result = call_flat(fn, [tf.constant(arrays[name]) for name in order], captures)
        return {name: tensor.numpy() for name, tensor in result.items()}

    return call


def prove(public: Call, direct: Call, sample: Arrays,
          close: Callable[[np.ndarray, np.ndarray], bool]) -> bool:
    """Whether ``direct`` answers like ``public`` on ``sample`` with its float inputs made
    random (so inputs given in the wrong order could not agree by chance, as zeros could);
    ``close`` says when two outputs agree."""
    rng = np.random.default_rng(0)
    varied = {name: rng.standard_normal(array.shape).astype(array.dtype)
              if array.dtype.kind == "f" else array for name, array in sample.items()}
    try:
        want = {name: np.asarray(value) for name, value in public(varied).items()}
        got = {name: np.asarray(value) for name, value in direct(varied).items()}
    except Exception as exc:  # the public call's own failure is reported by the warm-up
        log.info("direct_call_unused", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
        return False
    agree = want.keys() == got.keys() and all(
        got[name].shape == array.shape and got[name].dtype == array.dtype and
        close(got[name], array) for name, array in want.items())
    if not agree:
        log.info("direct_call_unused", reason="its outputs differ from the public call's")
    return agree
