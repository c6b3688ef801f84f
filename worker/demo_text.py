"""The demo text model: a small transformer encoder, as text services serve.

Token ids of any length in (``input_ids``, int32 ``[rows, length]``) with an
``attention_mask`` (int32, 1 real, 0 padded), a mean-pooled embedding out (``pooled``,
``[rows, width]``): a RoBERTa-like encoder (learned positions, self-attention and a GELU
feed-forward per layer, each followed by a normalization), small enough to serve on a CPU.
Its weights are random (seeded, no download): it exists to be served, not to be right.

Attention is masked and pooling counts real tokens only, so padding a job does not change
its outputs: docs/batching.md's padding applies (examples/text.yaml serves it so).
``masked=False`` builds the same encoder without a mask input, pooling over every position:
a model padding *would* change, for the check that refuses it. ``per_token=True`` adds the
per-token states (``tokens``, ``[rows, length, width]``), an output cut back to each job's
length.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

# The demo's size: 4 layers of width 128 (4 heads), an 8k vocabulary, up to 256 tokens.
VOCAB = 8192
WIDTH = 128
HEADS = 4
LAYERS = 4
MAX_LENGTH = 256


def save(path: str | Path, masked: bool = True, per_token: bool = False, vocab: int = VOCAB,
         width: int = WIDTH, heads: int = HEADS, layers: int = LAYERS,
         max_length: int = MAX_LENGTH, seed: int = 0) -> None:
    """Write the encoder as a SavedModel (``serving_default``) at ``path``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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
            return {"pooled": pooled, "tokens": h} if per_token else {"pooled": pooled}

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
    mask_spec = tf.TensorSpec([None, None], tf.int32, name="attention_mask")

    def with_mask(input_ids: Any, attention_mask: Any) -> dict[str, Any]:
        return module.encode(input_ids, tf.cast(attention_mask, tf.float32))

    def without_mask(input_ids: Any) -> dict[str, Any]:
        return module.encode(input_ids, tf.ones(tf.shape(input_ids), tf.float32))

    serve = tf.function(with_mask, input_signature=[ids_spec, mask_spec]) if masked else \
        tf.function(without_mask, input_signature=[ids_spec])
    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})


def _norm(x: Any) -> Any:
    import tensorflow as tf

    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-6)


if __name__ == "__main__":
    save(sys.argv[1] if len(sys.argv) > 1 else "models/text")
