"""TensorFlow runtime setup, done before anything loads a model.

Thread counts and GPU memory growth are also exported as the environment variables TF reads
at import, so a user handler that imports TensorFlow itself gets the same settings.

``tf_settings`` is the spec's ``tf`` dict (supervisor/config/worker_spec.py): every field of
TfConfig is present, so no default is written here a second time.
"""

from __future__ import annotations

import os
from typing import Any


def export_environment(tf_settings: dict[str, Any]) -> None:
    # C++ INFO lines off; warnings stay (the supervisor wraps them as worker_output events).
    # TF 2.21 prints its absl and oneDNN start-up lines before absl reads this, at any
    # level, and there is no cheap safe switch for them (TF_ENABLE_ONEDNN_OPTS=0 changes
    # the numbers): the supervisor's capture of worker output is what keeps the logs JSON.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if tf_settings["intra_op_threads"]:
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(tf_settings["intra_op_threads"])
    if tf_settings["inter_op_threads"]:
        os.environ["TF_NUM_INTEROP_THREADS"] = str(tf_settings["inter_op_threads"])
    if tf_settings["gpu_memory_growth"] and not tf_settings["gpu_memory_limit"]:
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")


def configure_tensorflow(tf_settings: dict[str, Any]) -> None:
    """Apply thread and GPU settings through tf.config; must run before any op executes."""
    import tensorflow as tf

    if tf_settings["intra_op_threads"]:
        tf.config.threading.set_intra_op_parallelism_threads(tf_settings["intra_op_threads"])
    if tf_settings["inter_op_threads"]:
        tf.config.threading.set_inter_op_parallelism_threads(tf_settings["inter_op_threads"])
    limit = tf_settings["gpu_memory_limit"]
    for gpu in tf.config.list_physical_devices("GPU"):
        if limit:
            # TF takes the limit in MiB; growth and a fixed logical device exclude each other.
            config = tf.config.LogicalDeviceConfiguration(memory_limit=max(1, limit // 2**20))
            tf.config.set_logical_device_configuration(gpu, [config])
        elif tf_settings["gpu_memory_growth"]:
            tf.config.experimental.set_memory_growth(gpu, True)


def tf_memory_info() -> dict[str, int] | None:
    """TF's own allocator figures for the first GPU, if TensorFlow is loaded and has one."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None:
        return None
    try:
        if not tf.config.list_logical_devices("GPU"):
            return None
        info = tf.config.experimental.get_memory_info("GPU:0")
        return {"current": int(info["current"]), "peak": int(info["peak"])}
    except Exception:  # best effort: stats are advisory, the NVML reading is authoritative
        return None
