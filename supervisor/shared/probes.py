"""What a worker says about itself beyond its memory: the probes a diagnosis is made of.

One definition for both sides: the worker builds a :class:`Probes` (worker/probes.py) and
sends ``to_wire()`` in its heartbeats; the supervisor reads it back with ``from_wire``, which
never raises and bounds everything (a broken or hostile worker may send anything: a list
where a number belongs, NaN, a million names, an ESC sequence in a name: names are made
printable whichever way a Probes is built). Counters are cumulative over the worker's
life; the supervisor fits their slopes per 1k jobs over the trend window (supervisor/
core/diagnosis.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Names (tf.function names, shape signatures, Python types) reported per list, at most.
MAX_NAMES = 8
# Longest name kept, in characters (a shape signature of a many-input model is long).
MAX_NAME = 200
# Counters above this are not counters (2^53: exact in a float, as JSON readers need).
MAX_COUNT = 2**53
# Seconds above this are not a worker's probe cost (30 000 years).
MAX_SECONDS = 1e12
# Names of the step functions Keras traces for model.predict()/evaluate(): Keras 3
# ("one_step_on_data_distributed"), tf.keras 2 ("predict_function"). Traced in a worker,
# they mean Keras's own predict loop runs there, per request.
KERAS_STEPS = ("one_step_on_data", "multi_step_on_data", "predict_function", "test_function")
# Python types whose objects hold native buffers (their bytes are the native heap's, kept by
# Python): a census weighs them by those bytes, and a growing count of them is Python keeping
# what the native heap grows by.
BUFFER_TYPES = ("numpy.ndarray", "bytes", "bytearray", "memoryview",
                "tensorflow.python.framework.ops.EagerTensor")
# TensorFlow's name for the tf.function of a loaded SavedModel, whatever it was called when
# saved: a worker counts each trace as "restored_function_body:<the saved function's name>"
# when it can tell which one that trace calls (worker/readings.py), else bare.
RESTORED_FUNCTION = "restored_function_body"
KERAS_PREDICT_REMEDY = ("call the model as model(x, training=False) inside one tf.function "
                        "with an input_signature instead")


@dataclass(frozen=True)
class ShapeGrowth:
    """Memory growth attributed to one input signature (names, dtypes and shapes of a batch
    as the handler received it)."""

    signature: str  # e.g. "input_ids:int32[8,387]"
    batches: int  # batches of this signature served
    first_growth: int  # bytes RSS grew across the batch where it was first seen
    growth: int  # bytes RSS grew across all its batches (growth only; falls are not credited)

    def __post_init__(self) -> None:
        if not self.signature.isprintable():
            object.__setattr__(self, "signature", printable(self.signature)[:MAX_NAME])

    def to_wire(self) -> list[Any]:
        return [self.signature, self.batches, self.first_growth, self.growth]

    @classmethod
    def from_wire(cls, raw: object) -> ShapeGrowth | None:
        if not isinstance(raw, list | tuple) or len(raw) != 4:
            return None
        signature, batches, first, growth = raw
        numbers = [_count(v) for v in (batches, first, growth)]
        if not isinstance(signature, str) or any(n is None for n in numbers):
            return None
        b, f, g = (int(n or 0) for n in numbers)
        return cls(signature[:MAX_NAME], b, f, g)


@dataclass(frozen=True)
class Probes:
    """One worker's probes at one moment (all cumulative since the worker started)."""

    # Functions in TensorFlow's eager context: one more per trace (None: TF not loaded).
    graphs: int | None = None
    # tf.function names by traces so far, most traced first (retracing shows here).
    traced: tuple[tuple[str, int], ...] = ()
    # Python: sys.getallocatedblocks(), live interpreter allocations.
    py_blocks: int | None = None
    # glibc mallinfo2: bytes in use on the native heap (arenas + mmapped chunks).
    native_heap: int | None = None
    # TensorFlow allocators' bytes in use, summed over devices that report them.
    tf_allocator: int | None = None
    # Distinct input signatures served, and the ones that grew memory the most.
    shapes: int | None = None
    top_shapes: tuple[ShapeGrowth, ...] = ()
    # Python types whose live count grew most between the last two censuses (count delta).
    census: tuple[tuple[str, int], ...] = ()
    # Containers that grew most between them, by what they hold ("dict of numpy.ndarray"),
    # with their growth in items; and the jobs answered between the two censuses.
    containers: tuple[tuple[str, int], ...] = ()
    census_jobs: int | None = None
    # Bytes those containers (their items, one level deep, buffers included) and the
    # growing objects that hold buffers gained between the two censuses: an estimate from
    # a sample of their items (None: not said, a worker older than this field).
    census_bytes: int | None = None
    # Seconds this worker has spent on probes (sampling and per-batch accounting).
    cost_seconds: float = 0.0
    # Jobs the worker had answered when these were read: readings are paced by their cost,
    # so they may be older than the heartbeat that carries them (None: not said).
    jobs: int | None = None

    def __post_init__(self) -> None:
        """Names are the worker's text, shown by `status`, `explain`, the remedy and the
        logs: a Probes never holds one that could forge output there (an ESC sequence, a
        newline), however it was made (from_wire, or a test's or tool's own)."""
        for field in ("traced", "census", "containers"):
            pairs = getattr(self, field)
            if not all(name.isprintable() for name, _ in pairs):
                object.__setattr__(self, field, tuple((printable(name)[:MAX_NAME], n)
                                                     for name, n in pairs))

    def cost_per_job(self) -> float | None:
        """Seconds the probes took per job answered, as of this reading."""
        return self.cost_seconds / self.jobs if self.jobs else None

    def to_wire(self) -> dict[str, Any]:
        return {"graphs": self.graphs, "traced": [list(t) for t in self.traced],
                "py_blocks": self.py_blocks, "native_heap": self.native_heap,
                "tf_allocator": self.tf_allocator, "shapes": self.shapes,
                "top_shapes": [s.to_wire() for s in self.top_shapes],
                "census": [list(c) for c in self.census],
                "containers": [list(c) for c in self.containers],
                "census_jobs": self.census_jobs, "census_bytes": self.census_bytes,
                "cost_seconds": round(self.cost_seconds, 6), "jobs": self.jobs}

    @classmethod
    def from_wire(cls, raw: object) -> Probes | None:
        """The probes in a heartbeat header, or None if there are none usable. Fields that
        do not make sense are dropped one by one, never the worker."""
        if not isinstance(raw, dict):
            return None
        shapes = raw.get("top_shapes")
        return cls(
            graphs=_count(raw.get("graphs")),
            traced=_named_counts(raw.get("traced")),
            py_blocks=_count(raw.get("py_blocks")),
            native_heap=_count(raw.get("native_heap")),
            tf_allocator=_count(raw.get("tf_allocator")),
            shapes=_count(raw.get("shapes")),
            top_shapes=tuple(s for s in (ShapeGrowth.from_wire(r) for r in
                                         (shapes if isinstance(shapes, list) else [])[:MAX_NAMES])
                             if s is not None),
            census=_named_counts(raw.get("census"), signed=True),
            containers=_named_counts(raw.get("containers")),
            census_jobs=_count(raw.get("census_jobs")),
            census_bytes=_count(raw.get("census_bytes")),
            cost_seconds=_seconds(raw.get("cost_seconds")), jobs=_count(raw.get("jobs")))


def printable(text: str) -> str:
    """``text`` with each character that is not printable (control characters, ESC, line
    breaks, separators) written as its escape (``\\x1b``, ``\\n``): a worker's names are
    printed to an operator's terminal and logs as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _count(value: object, signed: bool = False) -> int | None:
    """A non-negative integer counter (or any integer with ``signed``) within MAX_COUNT."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if abs(value) > MAX_COUNT or (value < 0 and not signed):
        return None
    return value


def _seconds(value: object) -> float:
    """A number of seconds >= 0, else 0.0 (an int too large for a float is compared as an
    int first: float() of it would raise)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if isinstance(value, int):
        return float(value) if 0 <= value < MAX_SECONDS else 0.0
    return value if math.isfinite(value) and 0 <= value < MAX_SECONDS else 0.0


def _named_counts(raw: object, signed: bool = False) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw[:MAX_NAMES]:
        if isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str):
            count = _count(item[1], signed)
            if count is not None:
                out.append((item[0][:MAX_NAME], count))
    return tuple(out)
