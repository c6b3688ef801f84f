"""The demo model: an MLP binary classifier (64 float32 features -> one probability).

Dense 1024-512-256-128-64-32, each with ReLU, Dropout 0.2 and LayerNormalization, then
Dense 16 ReLU + LayerNormalization, then Dense 1 sigmoid (about 0.8 M parameters). Its
weights are random (seeded): it exists to be served, not to be right.
"""

from __future__ import annotations

import os
import sys
from typing import Any

FEATURES = 64


def build(seed: int = 7) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(FEATURES,), name="features")
    x = inputs
    for units in (1024, 512, 256, 128, 64, 32):
        x = keras.layers.Dense(units, activation="relu")(x)
        x = keras.layers.Dropout(0.2)(x)
        x = keras.layers.LayerNormalization()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    x = keras.layers.LayerNormalization()(x)
    outputs = keras.layers.Dense(1, activation="sigmoid", name="probability")(x)
    return keras.Model(inputs, outputs, name="demo_mlp")


def save(path: str, seed: int = 7) -> None:
    """Write the demo model as a SavedModel (``serving_default``) at ``path``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    model = build(seed)
    model.export(path, verbose=False)


if __name__ == "__main__":
    save(sys.argv[1] if len(sys.argv) > 1 else "models/demo")
