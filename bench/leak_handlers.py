"""Handlers that grow a worker's memory, one cause each, for the leak probes (worker/probes.py).

Importable by workers (they run from the repository root). Each factory takes ``options``
and returns a callable from a dict of arrays to a dict of arrays. What each one grows, and
what the probes show for it, is measured by ``bench/leak_probes.py``:

- ``retrace_shapes``: a ``tf.function`` without ``input_signature``; every new batch size
  traces a new graph, kept for the life of the process. (A changing Python scalar argument
  is ``worker.tf_handlers:retracing``.)
- ``python_hoard``: keeps a few small Python objects per call, forever.
- ``native_leak``: mallocs ``bytes_per_call`` through ctypes and never frees it; with
  ``keep_pointers`` it also keeps each pointer, an int, in a list (one small Python object
  a call, whose bytes are nothing beside the native ones).
- ``array_cache``: keeps a 32 KiB numpy array per call in a dict that is never evicted.
- ``keras_predict``: the demo MLP called with ``model.predict()`` per call.
- ``keras_encoder_predict``: a Keras transformer encoder over ``input_ids: int32[None, None]``
  called with ``model.predict()`` per call, as a text service is often first written: memory
  ramps over the first minute of mixed lengths, then levels off (bench/predict_ramp.py).
- ``eager_text``: the demo text encoder per request, its length a Python argument of a
  ``tf.function``: a graph per new length (bench/night.py).
- :func:`save_embedding_model`: a SavedModel with an ``int32[None, None]`` input (an
  embedding, mean-pooled), to be served with many sequence lengths.
- ``leak_on_demand``: ``native_leak`` for marked jobs only (first value >= 1000): a
  plateau under ordinary traffic, a leak under marked traffic, in one worker.

The Python and native leaks run a small traced model too (one graph, whatever the batch
size), so their workers are TF workers whose graphs stay flat.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from supervisor.shared.protocol import TensorSpec

Arrays = dict[str, np.ndarray]
WIDTH = 16


class _Dense:
    """A few dense layers over ``x: float32[None, WIDTH]``, traced with or without an
    input signature."""

    def __init__(self, options: dict[str, Any], signature: bool) -> None:
        import tensorflow as tf

        self.tf = tf
        self.inputs = [TensorSpec("x", "float32", (None, WIDTH))]
        self.outputs = None
        rng = np.random.default_rng(int(options.get("seed", 0)))
        weights = [tf.constant(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))
                   for _ in range(int(options.get("layers", 4)))]

        def forward(x: Any) -> Any:
            for w in weights:
                x = tf.nn.relu(tf.matmul(x, w))
            return tf.reduce_sum(x, axis=1, keepdims=True)

        spec = [tf.TensorSpec([None, WIDTH], tf.float32)] if signature else None
        self.forward = tf.function(forward, input_signature=spec)

    def __call__(self, inputs: Arrays) -> Arrays:
        return {"y": self.forward(self.tf.constant(inputs["x"])).numpy()}


class PythonHoard(_Dense):
    """Keeps, per call, a dict holding a list of small floats and a string (a request log
    that is never trimmed)."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options, signature=True)
        self.per_call = int(options.get("objects_per_call", 20))
        self.log: list[dict[str, Any]] = []

    def __call__(self, inputs: Arrays) -> Arrays:
        row = inputs["x"][0]
        self.log.append({"call": len(self.log), "tag": f"call-{len(self.log)}",
                         "values": [float(row[i % WIDTH]) + i for i in range(self.per_call)]})
        return super().__call__(inputs)


class NativeLeak(_Dense):
    """Mallocs ``bytes_per_call`` (touched, so resident) per call through ctypes; the
    pointers are dropped, as a C extension that forgets a free would, or with
    ``keep_pointers`` appended to a list, as a wrapper that means to free them one day."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options, signature=True)
        self.size = int(options.get("bytes_per_call", 64 * 1024))
        self.pointers: list[int] | None = [] if options.get("keep_pointers") else None
        libc = ctypes.CDLL(None)
        self.malloc = libc.malloc
        self.malloc.restype = ctypes.c_void_p
        self.malloc.argtypes = [ctypes.c_size_t]

    def __call__(self, inputs: Arrays) -> Arrays:
        pointer = self.malloc(self.size)
        if pointer:
            ctypes.memset(pointer, 1, self.size)
            if self.pointers is not None:
                self.pointers.append(pointer)
        return super().__call__(inputs)


class ArrayCache(_Dense):
    """Caches a 32 KiB numpy array per request in a plain dict keyed by the request's bytes,
    never evicted (a hand-written feature cache). The arrays' bytes are the native heap's;
    and the dict, holding only bytes and arrays, is one the garbage collector does not track
    (CPython untracks dicts of atomic values): only its holder leads to it."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options, signature=True)
        self.size = int(options.get("floats_per_call", 4096))
        self.cache: dict[bytes, np.ndarray] = {}

    def __call__(self, inputs: Arrays) -> Arrays:
        key = inputs["x"].tobytes()
        if key not in self.cache:
            self.cache[key] = np.random.default_rng(len(self.cache)).standard_normal(self.size)
        return super().__call__(inputs)


class KerasPredict:
    """The demo MLP through ``model.predict()`` on every call (Keras's own loop, not
    ``model(x, training=False)``)."""

    def __init__(self, options: dict[str, Any]) -> None:
        from worker import demo_model

        self.model = demo_model.build(int(options.get("seed", 7)))
        self.inputs = [TensorSpec("features", "float32", (None, demo_model.FEATURES))]
        self.outputs = None

    def __call__(self, inputs: Arrays) -> Arrays:
        return {"probability": np.asarray(self.model.predict(inputs["features"], verbose=0))}


class KerasEncoderPredict:
    """A Keras transformer encoder (random weights; ``layers`` blocks of ``width`` with
    ``heads`` heads over a ``vocab`` embedding, mean-pooled) through ``model.predict()`` on
    every call."""

    def __init__(self, options: dict[str, Any]) -> None:
        import keras

        width, heads = int(options.get("width", 256)), int(options.get("heads", 4))
        keras.utils.set_random_seed(int(options.get("seed", 0)))
        ids = keras.Input((None,), dtype="int32", name="input_ids")
        h = keras.layers.Embedding(int(options.get("vocab", 30_000)), width)(ids)
        for _ in range(int(options.get("layers", 6))):
            attended = keras.layers.MultiHeadAttention(heads, width // heads)(h, h)
            h = keras.layers.LayerNormalization()(h + attended)
            up = keras.layers.Dense(4 * width, activation="gelu")(h)
            h = keras.layers.LayerNormalization()(h + keras.layers.Dense(width)(up))
        pooled = keras.layers.GlobalAveragePooling1D()(h)
        self.model = keras.Model(ids, {"pooled": pooled})
        self.inputs = [TensorSpec("input_ids", "int32", (None, None))]
        self.outputs = None

    def __call__(self, inputs: Arrays) -> Arrays:
        out = self.model.predict(inputs["input_ids"], verbose=0)
        return {"pooled": np.asarray(out["pooled"])}


def keras_encoder_predict(options: dict[str, Any]) -> KerasEncoderPredict:
    return KerasEncoderPredict(options)


def retrace_shapes(options: dict[str, Any]) -> _Dense:
    return _Dense(options, signature=False)


def python_hoard(options: dict[str, Any]) -> PythonHoard:
    return PythonHoard(options)


def native_leak(options: dict[str, Any]) -> NativeLeak:
    return NativeLeak(options)


def array_cache(options: dict[str, Any]) -> ArrayCache:
    return ArrayCache(options)


def keras_predict(options: dict[str, Any]) -> KerasPredict:
    return KerasPredict(options)


def save_embedding_model(path: str, vocab: int = 1000, dim: int = 32,
                         jit_compile: bool = False) -> None:
    """A SavedModel whose ``serving_default`` takes ``input_ids: int32[None, None]`` (batch,
    sequence length both unknown) and returns ``score: float32[None, 1]``: an embedding, a
    dense layer per token (a matmul whose shape follows the sequence length, as in any
    sequence model), mean-pooled over the sequence, then one dense layer.

    With ``jit_compile`` the function is compiled by XLA, which keeps one executable per
    input shape for the life of the process (measured: ~0.3 MB per new sequence length on
    CPU); without, TF 2.21 on CPU runs every length through one graph and barely grows."""
    import tensorflow as tf

    class Embedder(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            rng = np.random.default_rng(3)
            self.table = tf.Variable(rng.standard_normal((vocab, dim)).astype(np.float32))
            self.token = tf.Variable(rng.standard_normal((dim, 2 * dim)).astype(np.float32))
            self.dense = tf.Variable(rng.standard_normal((2 * dim, 1)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")],
                     jit_compile=jit_compile)
        def serve(self, input_ids: Any) -> dict[str, Any]:
            embedded = tf.nn.embedding_lookup(self.table, input_ids % vocab)
            tokens = tf.nn.relu(tf.matmul(tf.reshape(embedded, [-1, dim]), self.token))
            pooled = tf.reduce_mean(tf.reshape(tokens, [tf.shape(input_ids)[0], -1, 2 * dim]),
                                    axis=1)
            return {"score": tf.matmul(pooled, self.dense)}

    module = Embedder()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


class LeakOnDemand(NativeLeak):
    """Healthy, until a job asks: a job whose first value is at least ``marker`` (1000)
    mallocs ``bytes_per_call`` per row and never frees it. One worker thus shows a plateau
    under ordinary traffic and a steady leak under marked traffic (tests/test_tuning_live.py)."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.marker = float(options.get("marker", 1000.0))

    def __call__(self, inputs: Arrays) -> Arrays:
        x = inputs["x"]
        if x.size and float(x.flat[0]) >= self.marker:
            for _ in range(x.shape[0]):
                pointer = self.malloc(self.size)
                if pointer:
                    ctypes.memset(pointer, 1, self.size)
        return _Dense.__call__(self, inputs)


def leak_on_demand(options: dict[str, Any]) -> LeakOnDemand:
    return LeakOnDemand(options)


class EagerText:
    """The common text service's kind of handler: the demo text encoder (the SavedModel at
    ``options["model"]``) served one request at a time on its own length, through a
    ``tf.function`` without ``input_signature`` that takes the length as a Python argument,
    as a service written around eager calls often does: every new length traces a new graph,
    which TensorFlow keeps for the life of the process."""

    def __init__(self, options: dict[str, Any]) -> None:
        import tensorflow as tf

        self.loaded = tf.saved_model.load(options["model"])  # its variables live with it
        serve = self.loaded.signatures["serving_default"]
        self.tf = tf
        self.inputs = [TensorSpec("input_ids", "int32", (None, None))]
        self.outputs = None

        def encode(ids: Any, length: int) -> Any:
            mask = tf.ones([tf.shape(ids)[0], length], tf.int32)
            return serve(input_ids=ids, attention_mask=mask)["pooled"]

        self.encode = tf.function(encode)

    def __call__(self, inputs: Arrays) -> Arrays:
        ids = inputs["input_ids"]
        return {"pooled": self.encode(self.tf.constant(ids), int(ids.shape[1])).numpy()}


def eager_text(options: dict[str, Any]) -> EagerText:
    return EagerText(options)
