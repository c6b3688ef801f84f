"""Leak probes: what in this worker grows, measured cheaply enough to leave on.

What is measured
----------------
The serving loop owns one :class:`ProbeRecorder`. It wraps the model call to count each
batch's input signature (names, dtypes and full shapes, as the handler receives them) and to
read this process's RSS before and after the batch, crediting any growth to the signature
(every batch of a new signature, the others as the budget allows). Between batches (never
per job) it samples the rest at most once per heartbeat interval: functions in TensorFlow's
eager context (one more per trace), Python's allocated blocks, the native heap (glibc
mallinfo2) and TF's allocators. When Python's blocks or RSS have grown, at most once a
minute, it takes a census: live objects by type, and the containers that grew with what
they hold (found from the garbage collector's list and from the handler, which leads to the
ones it does not track), weighed in bytes from a sample of their items, so that the
supervisor can tell a list of pointers from a cache of arrays. Each sample ends in a new
immutable :class:`~supervisor.shared.probes.Probes` the heartbeat thread sends as it is.

Cost and pacing
---------------
Counting a batch's signature is the one fixed cost (~1 µs a batch; several µs in a TF
worker, where the Python that follows a model call runs with cold caches). Everything else
is paced by what it costs, so that each part takes at most ``BUDGET`` of the serving
thread's time whatever its size: the RSS reads around batches of known signatures, the
samples (a process that retraced 100k graphs takes ~20 ms to list them), the censuses; and
a census that takes longer than ``MAX_CENSUS_SECONDS`` is not taken again: it stalls serving.
The exception is a worker whose RSS grew ``GROWING_BYTES`` since its last sample: it is
sampled every interval (~3 ms of CPU in a TF worker, mostly mallinfo2 walking the arenas),
because a leak is diagnosed from readings and a fast one is recycled within seconds.
Measured: bench/results/probe_cost.md.

Readings and time
-----------------
Readings come from :class:`Sources` (this process by default, worker/readings.py; tests pass
fakes); the census is worker/census.py's. Time comes in as ``now``; the clocks of ``Sources``
only time the probes themselves, which is what paces them.
"""

from __future__ import annotations

import builtins
import dataclasses
import gc
import heapq
import math
import sys
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor.shared import logs
from supervisor.shared.probes import (
    MAX_NAME,
    MAX_NAMES,
    Probes,
    ShapeGrowth,
)
from worker.census import Census
from worker.readings import (
    SavedNames,
    Statm,
    TfAllocator,
    native_heap_reader,
    saved_function,
    tf_function_names,
    traced,
)
from worker.runners import Runner

# Input signatures kept with their batches and growth; more are counted, not kept.
MAX_SIGNATURES = 1024
# Bits of the bitmap that counts signatures beyond the table (128 KiB, allocated when the
# table fills): distinct ones are estimated by linear counting, exact to about 1 % up to
# ~100k and never unbounded.
OVERFLOW_BITS = 2**20
# Fraction of the serving thread's time each optional part of the probes may take: the
# samples between batches (one that took longer than BUDGET * heartbeat interval pushes the
# next one further out), the censuses, and the RSS reads around batches (measured: ~4 µs a
# batch, up to 20 µs in a TF worker on 2 busy cores, where the Python and syscalls that
# follow a model call run with cold caches; against ~1.3 ms for a batch of the demo MLP).
# A batch of a signature never seen is always measured, and every batch is counted.
BUDGET = 0.002
# RSS growth since the last sample from which the next one is due at the next interval,
# whatever it costs (a worker that grows this much between heartbeats is leaking); and
# since the last census, from which a census is due (worker/census.py).
GROWING_BYTES = 1024**2
# At least one batch in this many is measured, whatever its reads cost.
MAX_SKIP = 10_000
Key = tuple[tuple[str, Any, tuple[int, ...]], ...]  # (name, numpy dtype, shape) per input

log = logs.get(__name__)


@dataclass
class Sources:
    """Where readings come from. Each returns None where the process cannot tell."""

    rss: Callable[[], int | None]
    py_blocks: Callable[[], int | None]
    native_heap: Callable[[], int | None]
    functions: Callable[[], Any]  # a collection of names, or None: TensorFlow not running
    tf_allocator: Callable[[], int | None]
    objects: Callable[[], list[Any]]
    # A traced restored_function_body's name -> the saved function it calls (or None).
    saved_function: Callable[[str], str | None] = lambda name: None
    clock: Callable[[], float] = time.perf_counter  # for the probes' own cost only
    # For the samples' and censuses' cost: this thread's CPU time, not the wall clock, which
    # on a busy machine counts the time other processes ran and would push samples minutes
    # apart (0.5 µs a read, against 0.05 µs: the reads around batches use ``clock``).
    cpu_clock: Callable[[], float] = time.thread_time
    close: Callable[[], None] = lambda: None

    @classmethod
    def process(cls) -> Sources:
        statm = Statm()
        return cls(rss=statm.read, py_blocks=sys.getallocatedblocks,
                   native_heap=native_heap_reader(), functions=tf_function_names,
                   tf_allocator=TfAllocator().read, objects=gc.get_objects,
                   saved_function=SavedNames(saved_function), close=statm.close)


# --- the recorder ----------------------------------------------------------------------------

class ProbeRecorder:
    """Owned by the serving thread: only it calls :meth:`wrap`'s call and :meth:`between`.

    ``latest`` is replaced, never changed, so the heartbeat thread reads a whole snapshot
    with one attribute read (atomic under the GIL): no lock, and no wait on the serving
    thread.
    """

    def __init__(self, interval: float, now: float, sources: Sources | None = None) -> None:
        self.interval = interval
        self.sources = sources or Sources.process()
        self.shapes = ShapeTable()
        self.census = Census()
        self.roots: list[Any] = []  # the handler, whose containers a census follows
        self.cost = 0.0  # seconds, all probes
        self.batch_cost = 0.0  # of which around batches (the rest: samples and censuses)
        self.latest = Probes()
        self._next_sample = now
        # While memory grows, a sample is due every interval whatever it costs: a leak is
        # diagnosed from readings, and a fast one is recycled within seconds. Checked (one
        # RSS read) at most once per interval.
        self._next_check = now
        self._sampled_rss: int | None = None
        # RSS at the last census (before the first, at the first sample): what "growing"
        # means to a census. Measured from one sample to the next, a leak of 32 KiB a job
        # served under 32 jobs per interval (a busy machine's rate) never looked growing, got
        # no census, and its cache of arrays was named a native leak.
        self._census_rss: int | None = None
        # Batches of known signatures to let pass before the next one measured, and the
        # countdown as it was set (their difference: batches since the last measured one).
        self._countdown = self._scheduled = 0
        self._last_measured = self.sources.clock()
        self._unmeasured = 0  # batches counted but not timed, not yet in cost
        self._per_batch = 0.0  # seconds the counting takes a batch, from the timed ones
        self.between(now, 0)  # before the first job

    def wrap(self, runner: Runner) -> Runner:
        """The runner, its calls counted by signature and, as the budget allows, measured:
        RSS before and after, growth credited to the signature. A call that raises is
        counted too (a failing shape can leak).

        Every batch pays for its key and its count; only the RSS reads are optional, and
        they are what BUDGET bounds: after a measured batch, as many batches go unmeasured
        as keep the reads' share of the time under BUDGET. Batches not measured are not
        timed either (clock reads are most of the counting's cost): they are charged at
        what the counting took in those that were. The common case, a known signature, is
        written out here rather than through ShapeTable.record: it runs on every batch."""
        inner = runner.call
        self.roots = _roots(inner)
        # The census baseline is taken afresh, from the handler too (at the next sample):
        # what it reaches would otherwise all look new, grown since the baseline.
        self.census = Census()
        clock, rss, shapes = self.sources.clock, self.sources.rss, self.shapes
        entries = shapes.entries

        def call(inputs: dict[str, Any]) -> Mapping[str, Any]:
            due = self._countdown <= 0
            start = clock() if due else 0.0
            key = _key(inputs)
            entry = entries.get(key) if key is not None else None
            if entry is not None:
                entry.batches += 1
                measured = due
            elif key is not None:
                measured = shapes.is_new(key)  # a new signature: its first batch is where
                if not measured:               # it costs; beyond the table, counted only
                    shapes.record(key, None)
            else:
                measured = False
            self._countdown -= 1
            if not measured:
                self._unmeasured += 1
                return inner(inputs)
            counted = clock()
            begin, counting = (start, counted - start) if due else (counted, None)
            before = rss()
            running = clock()
            try:
                return inner(inputs)
            finally:
                resumed = clock()
                growth = _growth(before, rss())
                if entry is None:
                    if key is not None:  # always so when measured
                        shapes.record(key, growth)
                elif growth is not None:
                    entry.measured += 1
                    entry.measured_growth += growth
                self.account_measured(begin, (running - begin) + (clock() - resumed), counting,
                                      scheduled=entry is not None)

        return dataclasses.replace(runner, call=call)

    def account_measured(self, start: float, spent: float, counting: float | None,
                         scheduled: bool) -> None:
        """A measured batch began at ``start`` and its probes took ``spent`` seconds, of
        which ``counting`` (None if not timed) for its key and count. After one that was
        ``scheduled`` (a known signature's, when the countdown ran out; not a new one's),
        let as many batches pass unmeasured as keep the measured ones' share of the time
        within BUDGET."""
        self.cost += spent
        self.batch_cost += spent
        if counting is not None:
            self._per_batch = counting if not self._per_batch else \
                0.8 * self._per_batch + 0.2 * counting
        if not scheduled:
            return
        batches = max(1, self._scheduled - self._countdown)
        period = max(start - self._last_measured, 1e-9) / batches
        self._countdown = self._scheduled = min(MAX_SKIP, math.ceil(spent / (BUDGET * period)) - 1)
        self._last_measured = start

    def between(self, now: float, jobs: int | None = None) -> None:
        """Between batches (or while idle): sample what is due and publish a new snapshot."""
        if now < self._next_sample and not self._growing(now):
            return
        try:
            self._sample(now, jobs)
        except Exception as exc:  # advisory: a probe that breaks must not take the worker
            log.warning("probes_failed", error=f"{type(exc).__name__}: {exc}")
            self._next_sample = math.inf  # once: the same failure would repeat each second

    def _growing(self, now: float) -> bool:
        """Whether RSS grew by GROWING_BYTES since the last sample (asked once an interval)."""
        if now < self._next_check:
            return False
        self._next_check = now + self.interval
        rss, last = self.sources.rss(), self._sampled_rss
        return rss is not None and last is not None and rss - last >= GROWING_BYTES

    def _sample(self, now: float, jobs: int | None) -> None:
        clock, sources = self.sources.cpu_clock, self.sources
        start = clock()
        untimed, self._unmeasured = self._unmeasured * self._per_batch, 0
        self.cost += untimed
        self.batch_cost += untimed
        functions = sources.functions()
        blocks = sources.py_blocks()
        graphs = None if functions is None else len(functions)
        names = traced(functions, sources.saved_function) if functions else ()
        native, allocator = sources.native_heap(), sources.tf_allocator()
        shapes, top_shapes = self.shapes.distinct(), self.shapes.top(MAX_NAMES)
        sampled = clock() - start
        rss = sources.rss()
        if self._census_rss is None:
            self._census_rss = rss
        growing = rss is not None and self._census_rss is not None and \
            rss - self._census_rss >= GROWING_BYTES
        if self.census.due(now, blocks, BUDGET, growing, jobs):
            self.census.take(now, blocks, sources.objects, clock, jobs, self.roots)
            self._census_rss = rss
        self._next_sample = now + max(self.interval, sampled / BUDGET)
        self._next_check = now + self.interval
        self._sampled_rss = rss
        self.cost += clock() - start
        self.latest = Probes(graphs=graphs, traced=names, py_blocks=blocks, native_heap=native,
                             tf_allocator=allocator, shapes=shapes, top_shapes=top_shapes,
                             census=self.census.grown, containers=self.census.containers,
                             census_jobs=self.census.between_jobs,
                             census_bytes=self.census.grown_bytes, cost_seconds=self.cost,
                             jobs=jobs)

    def close(self) -> None:
        self.sources.close()


# --- input signatures --------------------------------------------------------------------------

def _roots(call: Any) -> list[Any]:
    """Where a census starts looking for what the handler keeps: the handler (a callable
    object, or a bound method's object, or a function with its globals and closure) and
    its module."""
    handler = getattr(call, "__self__", call)
    module = sys.modules.get(getattr(type(handler), "__module__", "") or "")
    if isinstance(handler, types.FunctionType):
        module = sys.modules.get(handler.__module__)
    return [r for r in (handler, module) if r is not None and r is not builtins]


def signature_key(inputs: Mapping[str, Any]) -> Key:
    """A hashable key of the batch's names, dtypes and shapes, by name (measured 0.35 µs
    for one input: no string is built, and one input needs no sort)."""
    if len(inputs) == 1:
        for name, array in inputs.items():
            return ((name, array.dtype, array.shape),)
    return tuple(sorted((name, array.dtype, array.shape) for name, array in inputs.items()))


def signature_text(key: Key) -> str:
    """``name:dtype[d0,d1]`` per input, by name, e.g. ``x:float32[8,16]``."""
    text = ",".join(f"{name}:{np.dtype(dtype).name}[{','.join(map(str, shape))}]"
                    for name, dtype, shape in key)
    return text[:MAX_NAME]


def _key(inputs: Mapping[str, Any]) -> Key | None:
    try:
        return signature_key(inputs)
    except Exception:  # not arrays: the handler was given something odd; never fail a job
        return None


def _growth(before: int | None, after: int | None) -> int | None:
    """RSS growth across a batch: falls are not credited; None if RSS cannot be read."""
    return None if before is None or after is None else max(0, after - before)


class _Entry:
    __slots__ = ("batches", "first_growth", "measured", "measured_growth", "signature")

    def __init__(self, signature: str, growth: int | None) -> None:
        self.signature, self.batches, self.first_growth = signature, 1, growth or 0
        self.measured = self.measured_growth = 0  # batches after the first that were measured

    @property
    def growth(self) -> int:
        """The first batch's growth, plus the later batches' growth, estimated from those
        measured (all of them while the budget allows)."""
        if not self.measured:
            return self.first_growth
        return self.first_growth + self.measured_growth * (self.batches - 1) // self.measured


class ShapeTable:
    """Distinct signatures served, and each one's batches and growth; bounded."""

    def __init__(self, capacity: int = MAX_SIGNATURES, overflow_bits: int = OVERFLOW_BITS) -> None:
        self.capacity, self.overflow_bits = capacity, overflow_bits
        self.entries: dict[Key, _Entry] = {}
        self._overflow: bytearray | None = None
        self._overflow_set = 0

    def is_new(self, key: Key) -> bool:
        """Whether a batch of this signature would be the first one kept."""
        return len(self.entries) < self.capacity and key not in self.entries

    def record(self, key: Key, growth: int | None) -> None:
        """One batch of this signature; ``growth``: its RSS growth, None if not measured."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.batches += 1
            if growth is not None:
                entry.measured += 1
                entry.measured_growth += growth
        elif len(self.entries) < self.capacity:
            self.entries[key] = _Entry(signature_text(key), growth)
        else:
            self._mark_overflow(key)

    def _mark_overflow(self, key: Key) -> None:
        if self._overflow is None:
            self._overflow = bytearray(self.overflow_bits // 8)
        bit = hash(key) % self.overflow_bits
        byte, mask = bit >> 3, 1 << (bit & 7)
        if not self._overflow[byte] & mask:
            self._overflow[byte] |= mask
            self._overflow_set += 1

    def distinct(self) -> int:
        """Signatures seen: those kept, plus a linear-counting estimate of the others."""
        bits, marked = self.overflow_bits, self._overflow_set
        if not marked:
            return len(self.entries)
        estimate = -bits * math.log(1 - min(marked, bits - 1) / bits)
        return len(self.entries) + max(marked, round(estimate))

    def top(self, count: int) -> tuple[ShapeGrowth, ...]:
        """The signatures that grew memory the most (then the most served)."""
        best = heapq.nlargest(count, self.entries.values(), key=lambda e: (e.growth, e.batches))
        return tuple(ShapeGrowth(e.signature, e.batches, e.first_growth, e.growth) for e in best)


