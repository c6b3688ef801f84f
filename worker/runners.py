"""Model runners: a SavedModel signature, a Keras model, or a user handler, behind one shape.

A runner is called with ``dict[str, np.ndarray]`` (first dimension = batch) and returns
``dict[str, np.ndarray]`` with the same first dimension. TensorFlow is imported only by the
runners that need it, so handler workers that do not use TF start in a fraction of a second.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from supervisor.shared.padding import PadDim, generated_inputs
from supervisor.shared.protocol import DTYPES, TensorSpec
from supervisor.shared.versions import served_version
from worker.direct_call import direct_call

Arrays = dict[str, np.ndarray]


class LoadError(Exception):
    """The model cannot be loaded; the worker exits with LOAD_ERROR and says why."""


@dataclass
class Runner:
    """A loaded model: its input/output specs (None when a handler does not say) and a call."""

    call: Callable[[Arrays], Mapping[str, Any]]
    inputs: list[TensorSpec] | None
    outputs: list[TensorSpec] | None
    keepalive: Any = None  # objects the call needs alive (a loaded SavedModel)
    padding: tuple[PadDim, ...] = ()  # variable-length dimensions padded per batch
    # A cheaper call of the same model, used once proven (worker/direct_call.py)
    direct: Callable[[Arrays], Mapping[str, Any]] | None = None
    version: int | None = None  # the version directory loaded (TF Serving's layout)

    @property
    def client_inputs(self) -> list[TensorSpec] | None:
        """The inputs a client sends: the model's, less those the worker generates (a
        padding mask or lengths)."""
        made = generated_inputs(self.padding)
        if self.inputs is None or not made:
            return self.inputs
        return [s for s in self.inputs if s.name not in made]

    @functools.cached_property
    def input_dtypes(self) -> dict[str, str]:
        return {s.name: s.dtype for s in self.inputs or []}

    def __call__(self, inputs: Arrays) -> Arrays:
        return {name: np.asarray(value) for name, value in self.call(inputs).items()}


def load(source: str, location: str, signature: str, options: dict[str, Any]) -> Runner:
    loaders = {"saved_model": lambda: load_saved_model(location, signature),
               "keras": lambda: load_keras(location),
               "handler": lambda: load_handler(location, options)}
    if source not in loaders:
        raise LoadError(f"unknown model source {source!r}")
    return loaders[source]()


def _spec(name: str, tensor_spec: Any) -> TensorSpec:
    dtype = tensor_spec.dtype.name
    if dtype not in DTYPES:
        raise LoadError(f"input/output '{name}' has dtype {dtype}, which cannot travel")
    shape = tensor_spec.shape
    dims = tuple(shape.as_list()) if shape.rank is not None else ()
    return TensorSpec(name, dtype, dims)


def load_saved_model(root: str, signature: str) -> Runner:
    """The SavedModel at ``root``, or the highest version under it (TF Serving's layout)."""
    import tensorflow as tf

    found, version = served_version(Path(root))
    path = str(found)
    try:
        loaded = tf.saved_model.load(path)
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot load SavedModel {path}: {exc}") from exc
    if signature not in loaded.signatures:
        names = ", ".join(sorted(loaded.signatures)) or "none"
        raise LoadError(f"SavedModel {path} has no signature {signature!r} (it has: {names})")
    fn = loaded.signatures[signature]
    _, kwargs = fn.structured_input_signature
    inputs = [_spec(name, spec) for name, spec in sorted(kwargs.items())]
    outputs = [_spec(name, spec) for name, spec in sorted(fn.structured_outputs.items())]

    def call(arrays: Arrays) -> dict[str, Any]:
        result = fn(**{name: tf.constant(value) for name, value in arrays.items()})
        return {name: tensor.numpy() for name, tensor in result.items()}

    return Runner(call, inputs, outputs, keepalive=loaded, direct=direct_call(fn),
                  version=version)


def load_keras(path: str) -> Runner:
    import keras
    import tensorflow as tf

    try:
        model = keras.models.load_model(path, compile=False)
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot load Keras model {path}: {exc}") from exc
    inputs = [_spec(t.name, tf.TensorSpec(t.shape, t.dtype)) for t in model.inputs]
    out_names = list(getattr(model, "output_names", None) or
                     [f"output_{i}" for i in range(len(model.outputs))])
    outputs = [_spec(n, tf.TensorSpec(t.shape, t.dtype))
               for n, t in zip(out_names, model.outputs, strict=True)]
    signature = [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in inputs]

    # One traced graph for every batch size: model(x, training=False), never predict(),
    # which grows memory when called in a loop.
    def forward_eager(*tensors: Any) -> Any:
        return model(list(tensors) if len(tensors) > 1 else tensors[0], training=False)

    forward = tf.function(forward_eager, input_signature=signature)

    def call(arrays: Arrays) -> dict[str, Any]:
        result = forward(*(tf.constant(arrays[s.name]) for s in inputs))
        results = result if isinstance(result, list | tuple) else [result]
        return {name: t.numpy() for name, t in zip(out_names, results, strict=True)}

    return Runner(call, inputs, outputs, keepalive=model)


def load_handler(target: str, options: dict[str, Any]) -> Runner:
    module_name, _, factory_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, factory_name)
    except ImportError as exc:
        raise LoadError(f"cannot import handler module {module_name!r}: {exc}") from exc
    except AttributeError:
        raise LoadError(f"module {module_name!r} has no factory {factory_name!r}") from None
    try:
        handler = factory(options)
    except Exception as exc:
        raise LoadError(f"handler factory {target} raised {type(exc).__name__}: {exc}") from exc
    if not callable(handler):
        raise LoadError(f"handler factory {target} returned {type(handler).__name__}, "
                        "not a callable")
    return Runner(handler, _declared(handler, "inputs"), _declared(handler, "outputs"))


def _declared(handler: Any, attribute: str) -> list[TensorSpec] | None:
    """Specs a handler may declare as ``handler.inputs`` / ``.outputs``: list of TensorSpec."""
    specs = getattr(handler, attribute, None)
    if specs is None:
        return None
    return [s if isinstance(s, TensorSpec) else TensorSpec.from_wire(s, allow_none=True)
            for s in specs]
