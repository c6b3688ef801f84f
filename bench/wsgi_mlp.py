"""The gunicorn baseline: a minimal WSGI app serving the same SavedModel, one request per
call, as users write it. POST raw float32 rows of 64 features; the answer is raw float32."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import tensorflow as tf

_serve = tf.saved_model.load(os.environ["MLP_PATH"]).signatures["serving_default"]


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    x = np.frombuffer(body, np.float32).reshape(-1, 64)
    y = _serve(features=tf.constant(x))["output_0"].numpy()
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [y.tobytes()]
