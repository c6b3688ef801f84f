"""A transformer encoder with random weights, saved as a SavedModel, for padding tests and
the bucketing benchmark: token ids of any length in, a mean-pooled embedding and the
per-token states out, as a small RoBERTa-like text model is served.

``masked=True``: it takes ``attention_mask`` (int32, 1 real, 0 padded), masks attention and
pools over real tokens only, so padding does not change its outputs. ``masked=False``: no
mask input, and its pooling averages every position: padding changes its outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def save_encoder(path: Path, masked: bool = True, vocab: int = 1000, width: int = 32,
                 heads: int = 4, layers: int = 2, max_length: int = 512, seed: int = 0) -> None:
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> Any:
        scale = 1.0 / np.sqrt(shape[0])
        return tf.Variable(rng.normal(0.0, scale, shape).astype(np.float32))

    class Encoder(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = weight(vocab, width)
            self.position = weight(max_length, width)
            self.blocks = [{"qkv": weight(width, 3 * width), "out": weight(width, width),
                            "up": weight(width, 4 * width), "down": weight(4 * width, width)}
                           for _ in range(layers)]

        def encode(self, ids: Any, mask: Any) -> dict[str, Any]:
            length = tf.shape(ids)[1]
            h = tf.gather(self.embed, ids) + self.position[tf.newaxis, :length]
            bias = (1.0 - mask[:, tf.newaxis, tf.newaxis, :]) * -1e9  # [B, 1, 1, L]
            for block in self.blocks:
                h = _norm(h + self._attend(h, bias, block))
                h = _norm(h + tf.nn.gelu(h @ block["up"]) @ block["down"])
            pooled = tf.reduce_sum(h * mask[:, :, tf.newaxis], axis=1) / \
                tf.reduce_sum(mask, axis=1, keepdims=True)
            return {"pooled": pooled, "tokens": h}

        def _attend(self, h: Any, bias: Any, block: dict[str, Any]) -> Any:
            batch, length = tf.shape(h)[0], tf.shape(h)[1]
            q, k, v = tf.split(h @ block["qkv"], 3, axis=-1)

            def split(x: Any) -> Any:
                x = tf.reshape(x, [batch, length, heads, width // heads])
                return tf.transpose(x, [0, 2, 1, 3])

            scores = tf.matmul(split(q), split(k), transpose_b=True) / np.sqrt(width // heads)
            attended = tf.matmul(tf.nn.softmax(scores + bias, axis=-1), split(v))
            merged = tf.reshape(tf.transpose(attended, [0, 2, 1, 3]), [batch, length, width])
            return merged @ block["out"]

    module = Encoder()
    ids_spec = tf.TensorSpec([None, None], tf.int32, name="input_ids")
    if masked:
        @tf.function(input_signature=[ids_spec,
                                      tf.TensorSpec([None, None], tf.int32, name="attention_mask")])
        def serve(input_ids: Any, attention_mask: Any) -> dict[str, Any]:
            return module.encode(input_ids, tf.cast(attention_mask, tf.float32))
    else:
        @tf.function(input_signature=[ids_spec])
        def serve(input_ids: Any) -> dict[str, Any]:
            return module.encode(input_ids, tf.ones(tf.shape(input_ids), tf.float32))
    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})


def _norm(x: Any) -> Any:
    import tensorflow as tf

    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-6)


def token_ids(length: int, seed: int, vocab: int = 1000) -> np.ndarray:
    """One job's ids: a batch of one row of ``length`` tokens (never 0, the pad id)."""
    return np.random.default_rng(seed).integers(1, vocab, (1, length)).astype(np.int32)
