"""What this process can read about itself, cheaply: its RSS, the native heap in use, TF's
allocators, and the functions TensorFlow traced (never starting TensorFlow to ask)."""

from __future__ import annotations

import collections
import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

from supervisor.shared.probes import KERAS_STEPS, MAX_NAME, MAX_NAMES, RESTORED_FUNCTION

# Prefix of the eager context's name for each traced concrete function of a tf.function:
# "__inference_<python name>_<uid>" (TF 2.21; "__wrapped__<Op>..." are single eager ops).
TRACED_PREFIX = "__inference_"


# Traced restored functions whose saved function a SavedNames remembers, at most: past it,
# new traces are counted under the bare name (a worker that retraced 100k times would
# otherwise keep 100k names twice, and resolve each at ~0.1 ms).
MAX_RESOLVED = 10_000


def traced(functions: Any, resolve: Callable[[str], str | None] | None = None,
           ) -> tuple[tuple[str, int], ...]:
    """tf.function Python names by their traced concrete functions, most first. A loaded
    SavedModel's functions all trace as ``restored_function_body``: each trace is counted as
    ``restored_function_body:<saved name>`` after the saved function it calls, as
    ``resolve`` (a traced function's name -> the saved one's, or None) tells, else under the
    bare name. Each trace is resolved on its own: counting them all under the newest one's
    function named `warm`, traced once last, for 400 traces of `encode`."""
    counts: collections.Counter[str] = collections.Counter()
    for name in functions:
        if not name.startswith(TRACED_PREFIX):
            continue
        short = python_name(name)
        if short == RESTORED_FUNCTION and resolve is not None:
            saved = resolve(name)
            short = f"{RESTORED_FUNCTION}:{saved}" if saved else short
        counts[short] += 1
    return tuple((name[:MAX_NAME], n) for name, n in counts.most_common(MAX_NAMES))


class SavedNames:
    """``resolve`` for :func:`traced`, remembering each traced function's saved function:
    a traced function never changes what it calls, so each is asked of TensorFlow once
    (~0.1 ms), not at every reading; at most MAX_RESOLVED are remembered."""

    def __init__(self, ask: Callable[[str], str | None]) -> None:
        self.ask = ask
        self.known: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        if name in self.known:
            return self.known[name]
        if len(self.known) >= MAX_RESOLVED:
            return None
        saved = self.known[name] = self.ask(name)
        return saved


def saved_function(name: str) -> str | None:
    """The Python name of the function a traced ``restored_function_body`` calls: the saved
    concrete function (``__inference_f_281`` -> ``f``), from its FunctionDef's call op
    (~0.1 ms). None if TensorFlow is not running here or does not say."""
    ctx = _tf_context()
    if ctx is None:
        return None
    try:
        definition = ctx.get_function_def(name)
        for node in definition.node_def:
            called = node.attr["f"].func.name if "f" in node.attr else ""
            if called.startswith(TRACED_PREFIX):
                return python_name(called)
    except Exception:  # a TF that moved its internals: the bare name, never a dead worker
        return None
    return None


def python_name(function: str) -> str:
    """``__inference_step_123`` -> ``step``; a SavedModel's signature function is
    ``signature_wrapper___call__``, a Keras predict step ``one_step_on_data_distributed``."""
    name = function[len(TRACED_PREFIX):]
    stem, _, uid = name.rpartition("_")
    return stem if stem and uid.isdigit() else name


def keras_loop_traced() -> str | None:
    """The Keras predict/evaluate step traced in this process (Keras's own loop runs here:
    model.predict() per request), or None."""
    for name in tf_function_names() or ():
        if name.startswith(TRACED_PREFIX) and python_name(name).startswith(KERAS_STEPS):
            return python_name(name)
    return None


def tf_function_names() -> Any:
    """The names of the functions in TF's eager context (a set); None if TensorFlow is not
    running here."""
    ctx = _tf_context()
    if ctx is None:
        return None
    try:
        return ctx.list_function_names()
    except Exception:  # a TF that moved its internals: no graph count, never a dead worker
        return None


def _tf_context() -> Any:
    """TF's eager context if TensorFlow is imported and its context started, else None:
    asking a context that has not started would start it, after which a handler that
    configures TF itself could no longer set its threads or GPU memory."""
    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.eager import context

        ctx = context.context()
    except Exception:  # see tf_function_names
        return None
    return ctx if getattr(ctx, "_initialized", True) else None


class Statm:
    """This process's resident set from /proc/self/statm, kept open and read with pread
    (measured ~2 µs a read, against ~25 µs for psutil)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        try:
            self.fd: int | None = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # not Linux: no per-batch attribution
            self.fd = None

    def read(self) -> int | None:
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 256, 0).split(None, 2)[1]) * self.page
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def native_heap_reader() -> Callable[[], int | None]:
    """Bytes in use on glibc's heap (arenas + mmapped chunks), or a reader of None where
    the C library has no mallinfo2 (glibc < 2.33, musl): mallinfo's int fields wrap at
    2 GiB, which is worse than no reading."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return lambda: None
    mallinfo2.restype = _Mallinfo2
    mallinfo2.argtypes = []

    def read() -> int | None:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return read


class TfAllocator:
    """Bytes in use in TF's allocators, summed over the devices that report them (GPUs;
    TF 2.21 refuses for CPU). The devices are found once, at the first reading after TF
    started."""

    def __init__(self) -> None:
        self.devices: list[str] | None = None

    def read(self) -> int | None:
        tf = sys.modules.get("tensorflow")
        if tf is None or _tf_context() is None:  # not started: asking would start it
            return None
        try:
            if self.devices is None:
                self.devices = [d.name for d in tf.config.list_logical_devices()
                                if _reports(tf, d.name)]
            if not self.devices:
                return None
            return sum(int(tf.config.experimental.get_memory_info(d)["current"])
                       for d in self.devices)
        except Exception:  # advisory, like runtime.tf_memory_info
            return None


def _reports(tf: Any, device: str) -> bool:
    try:
        tf.config.experimental.get_memory_info(device)
    except Exception:  # ValueError: "memory statistics not tracked" (CPU)
        return False
    return True
