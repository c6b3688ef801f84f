"""Why a worker grows: the suspected cause of its memory trend, the evidence, the remedy.

Pure, like the policy: the worker's samples (memory and the probes its heartbeats carried,
supervisor/shared/probes.py) in, a :class:`Diagnosis` out. The probes' slopes per 1k jobs are fitted
over the same warmed-up window the trend is judged on, with the same robust estimator, and
the rules below name the first cause whose evidence is clear. A cause put down to bytes is
named only when the bytes it accounts for are a real share of the growth (growth_split:
Python objects, native heap, TF allocator, other). What each cause looks like and what
fixes it is documented in docs/policy.md ("Why is my worker growing?").

A diagnosis is made only for a worker that is suspect: recycled or about to be for memory,
or whose memory trend is confidently above a quarter of its growth limit. A worker that is
flat has no suspected cause.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from supervisor.config.keys import PolicyConfig
from supervisor.config.units import format_size as _size
from supervisor.core.history import Sample
from supervisor.core.policy import (
    MIN_TREND_SAMPLES,
    Assessment,
    TracedGrowth,
    WorkerFacts,
    fit,
    since_ready,
    theil_sen,
    traced_growth,
    warmed_up,
)
from supervisor.core.reasons import Reason
from supervisor.shared.probes import (
    BUFFER_TYPES,
    KERAS_PREDICT_REMEDY,
    KERAS_STEPS,
    RESTORED_FUNCTION,
    Probes,
)

# New traced graphs (or new input signatures) per 1k jobs from which the growth is put down
# to them: a model that traces once per shape it has not seen, over a bounded set of shapes,
# stops adding any after warm-up; one more per thousand jobs, steadily, does not stop.
NEW_PER_1K = 1.0
# ... and at least this many new ones inside the window (one late trace is not a pattern).
MIN_NEW = 3
# Live Python allocations added per 1k jobs, steadily, that make Python objects the suspect
# (a steady-state server adds none: each request's objects are freed with it).
PY_BLOCKS_PER_1K = 100.0
# The most a live Python allocation can stand for when blocks are weighed against memory:
# pymalloc serves objects up to 512 bytes; a native leak adds a few blocks per 1k jobs
# (measured: 185 per 1k for 62 MB per 1k), a hoard of small objects tens of thousands.
# pymalloc's arenas are mapped outside malloc, so the blocks can also stand for no more than
# the memory growth the native heap does not account for (see growth_split).
BLOCK_BYTES = 512
# A cause put down to bytes, Python objects, is named only when the bytes Python keeps
# (small objects, plus what the census weighed in the containers and buffers that grew)
# are at least this share of the memory growth: a native leak whose handler also keeps
# each pointer in a list grows a list by one int a job, ~36 bytes against kilobytes.
SHARE = 0.25
# ... and such objects, or the containers that keep objects (a cache, a list appended to),
# are taken to hold what grows when they grew by at least this many per job between the
# worker's last two censuses (one cached result per request is 1).
HOLD_PER_JOB = 0.5
# A byte probe (native heap in use, TF allocator, VRAM) explains the growth when its own
# slope is at least this fraction of the memory slope.
EXPLAINS = 0.5
# Distinct probe readings a probe's slope needs (fewer: not measured, never a wrong cause).
MIN_READINGS = 4
# ... for the counters of graphs and shapes, which only ever grow and have no noise: their
# rate between two readings is a rate (and MIN_NEW must still have been added). A worker
# whose jobs each take a second (an XLA compile per new shape) may be recycled after a few.
MIN_COUNTER_READINGS = 2
# Suspected before any recycle: a trend confidently above this fraction of its limit.
SUSPECT_FRACTION = 0.25


_VRAM = frozenset({Reason.MAX_VRAM, Reason.VRAM_GROWTH_PER_1K_JOBS})
# Recycles for the window's growth: the window is what was judged, and what grew in it is the
# cause (a leak that starts after a retracing plateau is that leak's, not the graphs').
_TREND = frozenset({Reason.GROWTH_PER_1K_JOBS, Reason.GROWTH_PER_HOUR})


class Cause(StrEnum):
    RETRACING = "retracing"
    NEW_INPUT_SHAPES = "new_input_shapes"
    PYTHON_OBJECTS = "python_objects"
    NATIVE_HEAP = "native_heap"
    CHILD_PROCESSES = "child_processes"
    TF_ALLOCATOR = "tf_allocator"
    VRAM_POOL = "vram_pool"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Trends:
    """Slopes per 1k jobs over the window (None: not measured by this worker), and what
    the counters added over it."""

    jobs: int = 0  # jobs the window spans
    samples: int = 0
    readings: int = 0  # distinct probe readings the probes' slopes are fitted on
    memory: float | None = None  # bytes
    children: float | None = None  # bytes: the child processes' part of ``memory``
    vram: float | None = None  # bytes
    graphs: float | None = None
    shapes: float | None = None
    py_blocks: float | None = None
    native_heap: float | None = None  # bytes
    tf_allocator: float | None = None  # bytes
    graphs_added: int | None = None
    shapes_added: int | None = None
    # Fitted on the samples since ready: too few after warm-up to fit a trend on, and what
    # the worker has is all there is to name a cause from (a recycle for max_memory in
    # warm-up) ...
    since_ready: bool = False
    # ... and the policy's warm-up has not passed at all (not the same: a worker a few polls
    # past its warm-up is fitted since ready too, and is not in warm-up).
    warming_up: bool = False

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"window_jobs": self.jobs, "window_samples": self.samples,
                               "probe_readings": self.readings}
        if self.since_ready:
            out["window_since_ready"] = True
        if self.warming_up:
            out["window_in_warmup"] = True
        for name in ("memory", "children", "vram", "graphs", "shapes", "py_blocks",
                     "native_heap", "tf_allocator"):
            value = getattr(self, name)
            if value is not None:
                out[f"{name}_per_1k_jobs"] = round(value, 1)
        for name in ("graphs_added", "shapes_added"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    summary: str  # one line, for the status NOTE and the event
    remedy: str
    evidence: dict[str, Any]

    def fields(self) -> dict[str, Any]:
        return {"cause": self.cause.value, "summary": self.summary, "remedy": self.remedy,
                "evidence": self.evidence}


@dataclass(frozen=True)
class Split:
    """What accounts for the memory growth, in bytes per 1k jobs over the window (None: not
    measured by this worker). An estimate: the probes are read apart from memory, and the
    Python part is bounded rather than counted."""

    memory: float  # the memory metric's growth
    # The worker's child processes (counted in its memory, outside its probes' view).
    child_processes: float | None
    # Live Python allocations (pymalloc: outside malloc) at BLOCK_BYTES each at most, and no
    # more than the growth the native heap leaves; plus the bytes the census weighed in the
    # containers and buffers that grew between its last two readings (on the native heap).
    python_objects: float | None
    native_heap: float | None  # malloc's bytes in use, less what Python keeps there
    # TF's allocators: on a GPU, device memory (not in the memory metric); on a CPU, within
    # the native heap. Shown, not added.
    tf_allocator: float | None
    other: float | None  # the rest: outside malloc's and pymalloc's view, or freed and kept

    def fields(self) -> dict[str, float]:
        out = {"memory": self.memory, "child_processes": self.child_processes,
               "python_objects": self.python_objects,
               "native_heap": self.native_heap, "tf_allocator": self.tf_allocator,
               "other": self.other}
        return {k: round(v) for k, v in out.items() if v is not None}

    @classmethod
    def from_fields(cls, raw: object) -> Split | None:
        """Back from :meth:`fields` (as `explain` reports it); None if it is not one."""
        if not isinstance(raw, dict):
            return None
        values = {k: v if isinstance(v, int | float) and not isinstance(v, bool) and
                  math.isfinite(v) else None for k, v in raw.items()}
        memory = values.get("memory")
        if memory is None:
            return None
        return cls(memory, values.get("child_processes"), values.get("python_objects"),
                   values.get("native_heap"), values.get("tf_allocator"), values.get("other"))

    def text(self, metric: str = "memory") -> str:
        """"of +250.0MiB memory growth per 1k jobs: Python objects ~36.0KiB, ..."."""
        parts = [f"{label} {'~' if name == 'python_objects' else ''}{_size(value)}"
                 for name, label in (("child_processes", "child processes"),
                                     ("python_objects", "Python objects"),
                                     ("native_heap", "native heap"), ("other", "other"))
                 if (value := getattr(self, name)) is not None]
        tf = "" if self.tf_allocator is None else \
            f" (TF allocator {_size(self.tf_allocator)}, not in the sum)"
        return (f"of +{_size(self.memory)} {metric} growth per 1k jobs: "
                + (", ".join(parts) or "no probe measured") + tf)


def growth_split(t: Trends, latest: Probes | None) -> Split | None:
    """Where the growth went (see Split); None unless memory grows. Values a worker cannot
    have sent sensibly (not finite, negative slopes of what only grows) count as 0 or
    unmeasured, never as an error."""
    total = _finite(t.memory)
    if total is None or total <= 0:
        return None
    kids = _finite(t.children)
    kids = None if kids is None else min(max(0.0, kids), total)
    memory = total - (kids or 0.0)  # the worker process's own, which its probes see
    native = _finite(t.native_heap)
    heap = None if native is None else max(0.0, native)
    blocks = _finite(t.py_blocks)
    small = None if blocks is None else max(0.0, blocks) * BLOCK_BYTES
    if small is not None and heap is not None:
        small = min(small, max(0.0, memory - heap))
    held = _census_per_1k(latest)
    if held is not None:
        held = min(held, heap if heap is not None else memory)
    python = None if small is None and held is None else (small or 0.0) + (held or 0.0)
    native_only = None if heap is None else heap - (held or 0.0)
    other = None if heap is None else max(0.0, memory - (small or 0.0) - heap)
    return Split(total, kids, python, native_only, _finite(t.tf_allocator), other)


def _census_per_1k(latest: Probes | None) -> float | None:
    """Bytes per 1k jobs the census weighed in what grew between its last two readings."""
    if latest is None or latest.census_bytes is None or not latest.census_jobs:
        return None
    return max(0, latest.census_bytes) / latest.census_jobs * 1000


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def trends(samples: Sequence[Sample], facts: WorkerFacts, policy: PolicyConfig) -> Trends:
    """The probes' slopes over the trend window (what `explain` shows for any worker); in
    warm-up, over the samples since ready (a cause is named from the evidence there is)."""
    after = warmed_up(samples, facts, policy)
    warming_up = not after
    fitted_since_ready = len(after[-policy.trend_window:]) < MIN_TREND_SAMPLES
    if fitted_since_ready:
        after = since_ready(samples, facts)
    window = after[-policy.trend_window:]
    if len(window) < MIN_TREND_SAMPLES:
        return Trends(samples=len(window), since_ready=fitted_since_ready,
                      warming_up=warming_up)
    jobs = np.array([s.jobs for s in window], dtype=float)
    # Readings from the whole warmed-up history, if they reach into the window: a worker
    # whose last reading predates the window says nothing about what grows now.
    probed = _readings(after)
    if probed and _jobs(probed[-1]) < jobs[0]:
        probed = []

    def slope(values: Sequence[float | int | None]) -> float | None:
        if len(values) < MIN_TREND_SAMPLES or any(v is None for v in values):
            return None
        found = fit(jobs, np.array(values, dtype=float))
        return None if found is None else found.value * 1000

    def probe(name: str, least: int = MIN_READINGS) -> float | None:
        """Theil-Sen over the readings: a fast leak recycled within seconds has only a few
        readings, not the memory window's samples."""
        values = [getattr(s.probes, name) for s in probed]
        if len(probed) < least or any(v is None for v in values):
            return None
        found = theil_sen(np.array([_jobs(s) for s in probed], dtype=float),
                          np.array(values, dtype=float))
        return None if found is None else found * 1000

    def added(name: str) -> int | None:
        values = [getattr(s.probes, name) for s in probed]
        if len(values) < 2 or values[0] is None or values[-1] is None:
            return None
        return int(values[-1] - values[0])

    return Trends(
        jobs=int(jobs[-1] - jobs[0]), samples=len(window), readings=len(probed),
        memory=slope([s.memory for s in window]), vram=slope([s.vram for s in window]),
        children=slope([s.children for s in window]),
        graphs=probe("graphs", MIN_COUNTER_READINGS), shapes=probe("shapes", MIN_COUNTER_READINGS),
        py_blocks=probe("py_blocks"),
        native_heap=probe("native_heap"), tf_allocator=probe("tf_allocator"),
        graphs_added=added("graphs"), shapes_added=added("shapes"),
        since_ready=fitted_since_ready, warming_up=warming_up)


def _readings(after: Sequence[Sample]) -> list[Sample]:
    """One sample per probe reading, over all the warmed-up history. Workers sample probes
    less often than memory is polled (paced by their cost), so the memory window may hold
    one reading many times over (each heartbeat repeats the latest): fitted as it is, a fast
    leak's probes look flat."""
    out: list[Sample] = []
    for sample in after:
        if sample.probes is not None and (not out or sample.probes != out[-1].probes):
            out.append(sample)
    return out


def _jobs(sample: Sample) -> int:
    """When a probe reading was taken, in jobs: as the worker said, else the sample's."""
    said = sample.probes.jobs if sample.probes is not None else None
    return said if said is not None and said <= sample.jobs else sample.jobs


def suspect(assessment: Assessment, reason: Reason | None, policy: PolicyConfig) -> bool:
    """Recycled (or about to be) for memory, growing confidently towards a limit, or grown
    in warm-up by tracing graphs (a finding, not a baseline: policy.py, Explained warm-up).
    A recycle for another reason (max_age, max_jobs) does not hide the growth: a worker
    growing at 90 % of its limit when its age ran out was said to be under a quarter."""
    if reason is not None and reason.memory:
        return True
    if assessment.warmup_explained:
        return True
    return trending(assessment, policy)


def trending(assessment: Assessment, policy: PolicyConfig) -> bool:
    """The memory trend is above SUSPECT_FRACTION of a growth limit that is set."""
    growth, limit = assessment.growth_per_1k_jobs, policy.max_growth_per_1k_jobs
    hourly, hourly_limit = assessment.growth_per_hour, policy.max_growth_per_hour
    return (growth is not None and limit is not None and growth > SUSPECT_FRACTION * limit) \
        or (hourly is not None and hourly_limit is not None and
            hourly > SUSPECT_FRACTION * hourly_limit)


def diagnose(samples: Sequence[Sample], facts: WorkerFacts, policy: PolicyConfig,
             assessment: Assessment, reason: Reason | None, life: Probes | None = None,
             ) -> Diagnosis | None:
    """The suspected cause of this worker's growth, or None if it is not suspect.
    ``life``: its probes when it became ready, so totals can be told over its whole life."""
    if not suspect(assessment, reason, policy):
        return None
    found = trends(samples, facts, policy)
    latest = next((s.probes for s in reversed(samples) if s.probes is not None), None)
    split = growth_split(found, latest)
    traced = traced_growth(samples, facts)
    cause = _cause(found, reason, latest, split,
                   traced if _since_ready_judged(found, reason, assessment, policy) else None)
    summary, remedy = _explain(cause, found, latest, life, split, traced)
    evidence = found.fields()
    if traced.graphs:
        evidence["since_ready"] = traced.fields()
    if split is not None:
        evidence["growth_split"] = split.fields()
    if latest is not None:
        cost = latest.cost_per_job()
        if cost is not None:
            evidence["probe_cost_per_job_us"] = round(cost * 1e6, 2)
        if latest.traced:
            evidence["traced"] = dict(latest.traced[:3])
        if latest.top_shapes:
            evidence["top_shapes"] = [s.to_wire() for s in latest.top_shapes[:3]]
        if latest.census:
            evidence["growing_types"] = dict(latest.census[:3])
        if latest.containers:
            evidence["growing_containers"] = dict(latest.containers[:3])
            evidence["census_jobs"] = latest.census_jobs
    return Diagnosis(cause, summary, remedy, evidence)


def _since_ready_judged(t: Trends, reason: Reason | None, assessment: Assessment,
                        policy: PolicyConfig) -> bool:
    """Whether what is judged is the growth since ready rather than the window's: the
    window is the samples since ready; or a level was crossed (max_memory, kill_memory,
    host pressure: what filled the memory is all that grew since ready); or, with no
    recycle, the worker is suspect for its warm-up finding alone. Not for a trend recycle,
    nor a trend above a quarter of its limit: the window's growth is judged, and a native
    leak that began after a retracing plateau was named retracing for graphs traced
    minutes before a window that traced none."""
    if t.since_ready:
        return True
    if reason is not None:
        return reason not in _TREND
    return not trending(assessment, policy)


def _cause(t: Trends, reason: Reason | None, latest: Probes | None = None,
           split: Split | None = None, traced: TracedGrowth | None = None) -> Cause:
    """The first rule whose evidence is clear, most specific first; a cause put down to
    bytes only when they explain a share of the growth. ``traced``: the growth since ready,
    given only where it is what is judged (_since_ready_judged): graphs traced since ready
    that came with most of it name retracing even when the window itself traced few (the
    shapes seen by then: a worker of the seed's encoder, recycled for max_memory with a
    window that added 2 graphs, was named native heap with 400 traced)."""
    if _steady(t.graphs, t.graphs_added):
        return Cause.RETRACING
    if _steady(t.shapes, t.shapes_added):
        return Cause.NEW_INPUT_SHAPES
    if reason in _VRAM:
        return Cause.VRAM_POOL
    if traced is not None and traced.explained:
        return Cause.RETRACING
    growth = t.memory if t.memory is not None and t.memory > 0 else None
    if growth is not None and t.children is not None and t.children >= EXPLAINS * growth:
        return Cause.CHILD_PROCESSES
    if _python_objects(t, growth, latest, split):
        return Cause.PYTHON_OBJECTS
    if growth is not None and t.tf_allocator is not None and t.tf_allocator >= EXPLAINS * growth:
        return Cause.TF_ALLOCATOR
    if growth is not None and t.native_heap is not None:
        return Cause.NATIVE_HEAP  # live native allocations, or the allocator keeping freed
    if t.vram is not None and t.vram > 0 and (growth is None or t.memory is None):
        return Cause.VRAM_POOL
    return Cause.UNKNOWN


def _python_objects(t: Trends, growth: float | None, latest: Probes | None,
                    split: Split | None) -> bool:
    """Live Python allocations grow steadily, and the bytes Python keeps (small objects, and
    what the census weighed in the containers and buffers that grew: see growth_split) are
    SHARE of the growth or more. A worker that does not weigh its census (census_jobs
    without census_bytes: a worker older than that field) is judged by counts alone."""
    if t.py_blocks is None or t.py_blocks < PY_BLOCKS_PER_1K:
        return False
    if growth is None or _keeps_graphs(latest):
        return True
    if latest is not None and latest.census_jobs and latest.census_bytes is None:
        return _held(latest) or t.py_blocks * BLOCK_BYTES >= SHARE * growth
    return split is not None and split.python_objects is not None and \
        split.python_objects >= SHARE * growth


def _keeps_graphs(latest: Probes | None) -> bool:
    """Keras's predict step is traced here, or graph objects (Operations, FuncGraphs) lead
    the census and grew by HOLD_PER_JOB per job or more between its last two readings:
    Python keeps what TensorFlow built per request, and the bytes are the native heap's,
    which no census can weigh. model.predict() per request looked like a native leak to the
    byte split alone.

    Leading is not enough: in a worker whose growth the census cannot count (a native leak
    keeping each pointer, an int, in a list: ints are not tracked by the garbage collector),
    the types that lead are a handful of objects alive at one census and not the other, the
    third by as few as 2. On busy cores fewer jobs pass between two censuses, a TensorFlow
    type among that handful was as likely as any, and it named the native leak Python
    objects. A worker that does not say how many jobs passed (older) is judged by the lead."""
    if latest is None:
        return False
    if any(name.startswith(KERAS_STEPS) for name, _ in latest.traced):
        return True
    jobs = latest.census_jobs
    need = HOLD_PER_JOB * jobs if jobs else 0.0
    return any(_graph_type(name) and n >= need for name, n in latest.census[:3])


def _held(latest: Probes | None) -> bool:
    """(Older workers.) Between the last two censuses, objects that hold buffers (numpy
    arrays, bytes, tensors), or a container, grew by HOLD_PER_JOB per job or more: what
    grows is kept by Python, even where the bytes are the native heap's."""
    jobs = latest.census_jobs if latest is not None else None
    if latest is None or not jobs:
        return False
    need = HOLD_PER_JOB * jobs
    return any(name in BUFFER_TYPES and n >= need for name, n in latest.census) or \
        any(n >= need for _, n in latest.containers)


def _steady(per_1k: float | None, added: int | None) -> bool:
    return per_1k is not None and per_1k >= NEW_PER_1K and added is not None \
        and added >= MIN_NEW


def _explain(cause: Cause, t: Trends, latest: Probes | None,
             life: Probes | None, split: Split | None = None,
             traced: TracedGrowth | None = None) -> tuple[str, str]:
    """(summary, remedy) in plain words, with the names and figures that decided it."""
    if cause is Cause.RETRACING:
        return _retracing_text(t, latest, life, traced)
    if cause is Cause.NEW_INPUT_SHAPES:
        total = _since(latest, life, "shapes")
        shape = f" (e.g. {latest.top_shapes[0].signature})" if latest and latest.top_shapes \
            else ""
        return (f"new input shapes: {total} distinct input shapes since this worker became "
                f"ready{shape}, {(t.shapes or 0) / 1000:.2g} new per job; TensorFlow keeps "
                "per-shape state for each",
                "pad inputs to a few fixed sizes: batching.allowed_batch_sizes for the batch "
                "dimension, fixed buckets for sequence lengths, so the set of shapes is small "
                "and is covered by warm-up")
    if cause is Cause.PYTHON_OBJECTS:
        return _python_objects_text(t, latest)
    if cause is Cause.TF_ALLOCATOR:
        return (f"TensorFlow allocator: its bytes in use grow {_size(t.tf_allocator)} per 1k "
                "jobs",
                "tensors are kept alive between requests (variables or tf.Tensors stored by "
                "the handler, growing tf.Variable state); check what the handler keeps")
    if cause is Cause.VRAM_POOL:
        return (f"GPU memory pool: VRAM grows {_size(t.vram)} per 1k jobs",
                "TensorFlow's GPU allocator never returns memory to the driver: cap it with "
                "tf.gpu_memory_limit, keep memory growth on (tf.gpu_memory_growth), pad "
                "inputs to fixed sizes, and bound it with policy.max_vram")
    if cause is Cause.CHILD_PROCESSES:
        return (f"child processes: the worker's child processes grow {_size(t.children)} "
                f"per 1k jobs of {_size(t.memory)} memory growth",
                "the handler starts processes that are never ended, or that grow: end each "
                "one with its job (or keep a bounded pool), and bound what a long-lived "
                "helper keeps; `ps --ppid` on the worker's pid lists them")
    if cause is Cause.NATIVE_HEAP:
        heap = split.native_heap if split is not None and split.native_heap is not None \
            else t.native_heap or 0.0
        memory = t.memory or 0.0
        if heap >= EXPLAINS * memory:
            return (f"native heap: live native allocations grow {_size(heap)} per 1k jobs "
                    f"of {_size(memory)} memory growth",
                    "a C extension or ctypes code allocates per request and never frees "
                    "(or TensorFlow kernels cache per request): look at native libraries the "
                    "handler calls; recycling bounds it meanwhile")
        return (f"native heap retention: memory grows {_size(memory)} per 1k jobs while live "
                f"native allocations grow only {_size(heap)}: freed memory is not returned "
                "to the system",
                "glibc keeps freed memory in per-thread arenas: set MALLOC_ARENA_MAX=2 (or "
                "use jemalloc/tcmalloc via LD_PRELOAD) in the model's env")
    return ("unknown: the probes do not explain the growth",
            "run `tfsupervisor explain` for the probes' trends; max_memory bounds the "
            "growth meanwhile")


def _retracing_text(t: Trends, latest: Probes | None, life: Probes | None,
                    traced: TracedGrowth | None) -> tuple[str, str]:
    """Named after the user's function: a SavedModel's tf.function is traced under TF's
    name for every loaded one, ``restored_function_body``; the worker says which saved
    function its newest trace calls (worker/readings.py), and that is the one to fix.
    Padding is advised where the input shapes vary (the seed's token ids of any length)."""
    traced_name = latest.traced[0][0] if latest and latest.traced else None
    total = _since(latest, life, "graphs")
    # Graphs per job since ready where the since-ready growth is known, else the window's
    # rate, said as such (the window's slope was printed as "per job" beside the total:
    # 0.17 for 399 graphs over 7,008 jobs).
    if traced is not None and traced.jobs > 0 and traced.graphs > 0:
        rate = f", {traced.graphs / traced.jobs:.2g} per job over {traced.jobs:,} jobs"
    elif t.graphs:
        rate = f", {t.graphs / 1000:.2g} per job over the last {t.jobs:,} jobs"
    else:
        rate = ""
    grew = f" with +{_size(traced.with_graphs)} of memory" \
        if traced is not None and traced.explained else ""
    pad = ("; or pad the varying dimension to a few sizes (the model's `padding:` setting, "
           "docs/batching.md), so it traces once per size") if _lengths_vary(latest) else \
        ("; or pad inputs to fixed sizes (batching.allowed_batch_sizes) so it traces once "
         "per size")
    if traced_name is not None and traced_name.startswith(RESTORED_FUNCTION):
        user = traced_name[len(RESTORED_FUNCTION) + 1:]
        name = f"`{user}`" if user else "the SavedModel function the handler calls"
        shown = f"{name} (a SavedModel's function, traced by TensorFlow as " \
            f"{RESTORED_FUNCTION})"
        return (f"retracing: {shown} traced {total} new graphs since this worker became "
                f"ready{grew}{rate}: it was saved without an "
                "input_signature, so each new input shape traces a new graph, kept for "
                "the life of the process",
                f"re-export {name} with an input_signature (tf.TensorSpec with None for each "
                "dimension that varies, e.g. [None, None] for token ids), or save it as a "
                "signature (signatures={'serving_default': ...}) and call that" + pad)
    name = f"`{traced_name}`" if traced_name else "a tf.function"
    return (f"retracing: {name} traced {total} new graphs since this worker became "
            f"ready{grew}{rate}",
            f"give {name} an input_signature (with None for the dimensions that vary), "
            "pass tensors rather than Python numbers as its arguments" + pad)


def _lengths_vary(latest: Probes | None) -> bool:
    """The input shapes that grew the worker most differ beyond the batch axis (token ids of
    several lengths): the `padding:` setting applies. Differing batch sizes alone are
    batching.allowed_batch_sizes's."""
    beyond_batch = set()
    for shape in latest.top_shapes if latest is not None else ():
        dims = _dims(shape.signature)
        if dims is not None:
            beyond_batch.add(tuple(d[1:] for d in dims))
    return len(beyond_batch) > 1


def _dims(signature: str) -> tuple[tuple[str, ...], ...] | None:
    """``a:int32[1,225],b:int32[1,225]`` -> (("1", "225"), ("1", "225")); None if odd."""
    out = []
    for part in signature.split("],"):
        _, bracket, dims = part.partition("[")
        if not bracket:
            return None
        out.append(tuple(dims.rstrip("]").split(",")))
    return tuple(out)


def _python_objects_text(t: Trends, latest: Probes | None) -> tuple[str, str]:
    """What grows (the containers that grew, else the types), and the fix."""
    if latest and latest.containers:
        name, grew = latest.containers[0]
        what = f"{name} (+{grew:,} items over {latest.census_jobs or '?'} jobs)"
    elif latest and latest.census:
        what = ", ".join(name for name, _ in latest.census[:3])
    else:
        what = "unknown types (no census yet)"
    remedy = ("find what keeps a reference per request (a cache without a bound, a list "
              "appended to, results kept for logging) and bound or drop it; a "
              "functools.lru_cache needs a maxsize")
    if latest and any(name.startswith(KERAS_STEPS) for name, _ in latest.traced):
        remedy = ("Keras model.predict() runs per request (its step function is traced "
                  f"here) and leaves objects behind: {KERAS_PREDICT_REMEDY}; otherwise "
                  + remedy)
    elif latest and any(_graph_type(name) for name, _ in latest.census[:3]):
        remedy = ("TensorFlow objects accumulate per request: something builds graphs, ops "
                  "or functions per call (a tf.function or Keras layer created per request, "
                  "model.predict() per request): build them once; otherwise " + remedy)
    return (f"Python objects: {t.py_blocks:,.0f} more live Python allocations per 1k jobs; "
            f"growing: {what}", remedy)


def _graph_type(name: str) -> bool:
    """A TensorFlow or Keras type that graph building leaves (an Operation, a FuncGraph), not
    a tensor kept with its value (EagerTensor: a buffer, see BUFFER_TYPES)."""
    return name.startswith(("tensorflow.", "keras.")) and name not in BUFFER_TYPES


def _since(latest: Probes | None, life: Probes | None, name: str) -> str:
    now = getattr(latest, name) if latest is not None else None
    then = getattr(life, name) if life is not None else None
    if now is None:
        return "?"
    return f"{now - then:,}" if then is not None else f"{now:,} (in all)"
