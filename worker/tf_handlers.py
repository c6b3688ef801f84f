"""TensorFlow handlers that reproduce the leaks tfsupervisor exists to bound.

``retracing``: a ``tf.function`` without ``input_signature`` whose Python arguments change
on every call, the most common TF2 serving leak. Each call traces a new graph, which TF keeps
for the life of the process, so memory climbs by a fixed amount per job.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from supervisor.shared.protocol import TensorSpec


class Retracing:
    def __init__(self, options: dict[str, Any]) -> None:
        import tensorflow as tf

        self.tf = tf
        width = int(options.get("width", 64))
        self.inputs = [TensorSpec("x", "float32", (None, width))]
        self.outputs = None
        rng = np.random.default_rng(0)
        self.weights = [tf.constant(rng.standard_normal((width, width)).astype(np.float32))
                        for _ in range(int(options.get("layers", 4)))]
        self.calls = 0

        def forward(x: Any, step: int) -> Any:
            for w in self.weights:
                x = tf.nn.relu(tf.matmul(x, w)) + float(step % 7)
            return tf.reduce_sum(x, axis=1, keepdims=True)

        # No input_signature, and a Python int argument: every call traces a new graph.
        self.forward = tf.function(forward)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"y": self.forward(self.tf.constant(inputs["x"]), self.calls).numpy()}


def retracing(options: dict[str, Any]) -> Retracing:
    return Retracing(options)
