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
Readings come from :class:`Sources` (this process by default; tests pass fakes). Time comes
in as ``now``; the clocks of ``Sources`` only time the probes themselves, which is what
paces them.
"""

from __future__ import annotations

import builtins
import collections
import ctypes
import dataclasses
import functools
import gc
import heapq
import itertools
import math
import operator
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor.shared import logs
from supervisor.shared.probes import (
    BUFFER_TYPES,
    KERAS_STEPS,
    MAX_NAME,
    MAX_NAMES,
    Probes,
    ShapeGrowth,
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
# whatever it costs (a worker that grows this much between heartbeats is leaking).
GROWING_BYTES = 1024**2
# At least one batch in this many is measured, whatever its reads cost.
MAX_SKIP = 10_000
# A census runs when Python's allocated blocks grew by this many since the last one (~0.5 to
# 10 MB of small objects), or when RSS grows (see GROWING_BYTES) whatever the blocks did;
# at most once per CENSUS_INTERVAL seconds. The first one, the baseline, too: a worker that
# grows neither way is never censused. One exception: the first census compared with
# the baseline, in a worker whose RSS grows, comes as soon as GROWING_CENSUS_INTERVAL and
# GROWING_BUDGET allow: a fast leak is recycled within seconds, and a census is what tells
# a buffer kept by Python (a numpy array in a cache) from a native leak. So a leaking
# worker pays for one early census (~100 ms in a TF worker), a steady one never.
CENSUS_BLOCKS = 20_000
CENSUS_INTERVAL = 60.0
GROWING_CENSUS_INTERVAL = 2.0
GROWING_BUDGET = 0.05
# Containers (dict, list, set, deque) a census remembers by id and length, the largest if
# there are more: the next census reports those that grew, and what they hold. numpy
# arrays and bytes are not tracked by the garbage collector, so no count by type sees them;
# the cache or list that keeps them is.
MAX_CONTAINERS = 16_384  # a TF worker has ~10k of MIN_CONTAINER items or more
MIN_CONTAINER = 8  # items; smaller ones are not ranked (most of a TF worker's ~60k)
# Following the handler to the containers it keeps (see reachable_containers).
REACH_DEPTH = 4
REACH_LIMIT = 20_000
REACH_FANOUT = 1000
CONTAINER_TYPES = frozenset({dict, list, set, collections.deque, collections.OrderedDict,
                             collections.defaultdict})
# Objects counted per census; past this the census counts an even stride of them and
# scales up (a leak of millions of objects still shows which types they are).
CENSUS_SAMPLE = 200_000
# A census that took longer than this is the last one: it stops the serving thread (measured:
# ~110 ms, types and containers, for the 324k objects of a TF 2.21 worker, 2 cores).
MAX_CENSUS_SECONDS = 0.5
# Type names kept from one census to compare with the next (the most numerous ones).
MAX_TYPES = 4096
# What a census weighs, to say how many bytes what grew holds: of each growing container,
# its newest SIZE_SAMPLE items, and of each of those that is a container, SIZE_INNER of what
# it holds (one level deep: a row dict's values, a list's floats); of each type that holds a
# buffer (BUFFER_TYPES) and grew, SIZE_SAMPLE live objects.
SIZE_SAMPLE = 16
SIZE_INNER = 32
# Prefix of the eager context's name for each traced concrete function of a tf.function:
# "__inference_<python name>_<uid>" (TF 2.21; "__wrapped__<Op>..." are single eager ops).
TRACED_PREFIX = "__inference_"

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
                   tf_allocator=TfAllocator().read, objects=gc.get_objects, close=statm.close)


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
        names = traced(functions) if functions else ()
        native, allocator = sources.native_heap(), sources.tf_allocator()
        shapes, top_shapes = self.shapes.distinct(), self.shapes.top(MAX_NAMES)
        sampled = clock() - start
        rss = sources.rss()
        growing = rss is not None and self._sampled_rss is not None and \
            rss - self._sampled_rss >= GROWING_BYTES
        if self.census.due(now, blocks, growing):
            self.census.take(now, blocks, sources.objects, clock, jobs, self.roots)
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


# --- traced functions ----------------------------------------------------------------------------

def traced(functions: Any) -> tuple[tuple[str, int], ...]:
    """tf.function Python names by their traced concrete functions, most first."""
    counts = collections.Counter(python_name(name) for name in functions
                                 if name.startswith(TRACED_PREFIX))
    return tuple((name[:MAX_NAME], n) for name, n in counts.most_common(MAX_NAMES))


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


# --- census ------------------------------------------------------------------------------------

@dataclass
class Census:
    """Live objects counted by type when Python's heap grew; what grew since the last one."""

    counts: dict[str, int] | None = None  # by type name, at the last census
    blocks: int = 0  # py_blocks at the last census
    jobs: int | None = None  # jobs answered at the last census
    sizes: dict[int, int] | None = None  # the largest containers' lengths, by id
    taken_at: float = -math.inf
    stopped: bool = False  # the last census took longer than MAX_CENSUS_SECONDS
    grown: tuple[tuple[str, int], ...] = ()  # the types that grew most, by count
    containers: tuple[tuple[str, int], ...] = ()  # the containers that grew most, by length
    between_jobs: int | None = None  # jobs between the last two censuses
    grown_bytes: int | None = None  # what grew between them holds, estimated (census_bytes)
    compared: bool = False  # a census has been compared with an earlier one
    start_blocks: int | None = None  # py_blocks when first asked, before any census
    took: float = 0.0  # seconds the last census took

    def due(self, now: float, blocks: int | None, growing: bool = False) -> bool:
        if self.stopped or blocks is None:
            return False
        if self.counts is None:
            # The baseline the next census is compared with, once there is something to
            # look for: a worker that never grows never pays for a census.
            if self.start_blocks is None:
                self.start_blocks = blocks
            return growing or blocks - self.start_blocks >= CENSUS_BLOCKS
        early = growing and not self.compared
        spacing = max(GROWING_CENSUS_INTERVAL, self.took / GROWING_BUDGET) if early \
            else max(CENSUS_INTERVAL, self.took / BUDGET)
        return now >= self.taken_at + spacing and \
            (growing or blocks - self.blocks >= CENSUS_BLOCKS)

    def take(self, now: float, blocks: int | None, objects: Callable[[], list[Any]],
             clock: Callable[[], float], jobs: int | None = None,
             roots: Sequence[Any] = ()) -> None:
        start = clock()
        live = objects()
        counts, buffers = count_types(live)
        sizes, holding, held = largest_containers(live, self.sizes or {}, roots,
                                                  weigh=self.counts is not None)
        if self.counts is not None:
            deltas = ((name, n - self.counts.get(name, 0)) for name, n in counts.items())
            self.grown = _largest((name, d) for name, d in deltas if d > 0)
            self.containers = holding
            self.between_jobs = None if jobs is None or self.jobs is None else jobs - self.jobs
            self.compared = True
            # A list of tensors and the tensors themselves are the same bytes: the larger.
            self.grown_bytes = max(held, buffer_bytes(live, self.grown, buffers))
        del live
        self.took = clock() - start
        self.counts, self.blocks, self.sizes, self.jobs = counts, blocks or 0, sizes, jobs
        self.taken_at = now
        self.stopped = self.took > MAX_CENSUS_SECONDS


def count_types(objects: list[Any]) -> tuple[dict[str, int], dict[str, type]]:
    """Live objects by type name (the MAX_TYPES most numerous); a stride of at most
    CENSUS_SAMPLE of them when there are more, scaled back up. And the types among them
    that hold buffers (BUFFER_TYPES), by name."""
    stride = max(1, -(-len(objects) // CENSUS_SAMPLE))
    sample = objects[::stride] if stride > 1 else objects
    by_type = collections.Counter(map(type, sample))  # counted in C: names only per type
    del sample, objects  # the census must not keep every object alive
    named: collections.Counter[str] = collections.Counter()
    buffers: dict[str, type] = {}
    for kind, n in by_type.items():
        name = type_name(kind)
        named[name] += n * stride
        if name in BUFFER_TYPES:
            buffers[name] = kind
    return dict(named.most_common(MAX_TYPES)), buffers


def buffer_bytes(objects: list[Any], grown: Iterable[tuple[str, int]],
                 buffers: Mapping[str, type]) -> int:
    """Bytes the objects holding buffers that grew in number hold (EagerTensors kept by a
    list): how many more there are times the mean size of SIZE_SAMPLE of them."""
    total = 0
    for name, more in grown:
        kind = buffers.get(name)
        if kind is None or more <= 0:
            continue
        # found in C, stopping at SIZE_SAMPLE
        sample = list(itertools.islice(itertools.compress(
            objects, map(functools.partial(operator.is_, kind), map(type, objects))),
            SIZE_SAMPLE))
        if sample:
            total += more * sum(map(own_bytes, sample)) // len(sample)
    return total


def largest_containers(objects: list[Any], before: dict[int, int], roots: Sequence[Any] = (),
                       weigh: bool = True,
                       ) -> tuple[dict[int, int], tuple[tuple[str, int], ...], int]:
    """The MAX_CONTAINERS largest containers' lengths by id, and those of them that grew
    since ``before`` (the last census's), described by what they hold: "dict of
    numpy.ndarray", with the growth; and, with ``weigh``, the bytes they grew by (see
    grown_bytes; not for a baseline, which is compared with nothing). A
    container not kept last time grew from just under MIN_CONTAINER (or, if the table was
    full, from the smallest length kept): a lower bound. ``roots``: where to look for
    containers the garbage collector does not list."""
    # Iterated in C where it can be (compress, map, zip): a TF worker holds ~60k
    # containers among ~320k objects (~10k of MIN_CONTAINER items or more), and a Python
    # loop over them costs a census 40 ms or more.
    found = list(itertools.compress(objects, map(CONTAINER_TYPES.__contains__,
                                                 map(type, objects))))
    found = list(itertools.compress(found, map(MIN_CONTAINER.__le__, map(len, found))))
    if roots:
        found += [c for c in reachable_containers(roots, set(map(id, found)))
                  if len(c) >= MIN_CONTAINER]
    if len(found) > MAX_CONTAINERS:
        found = heapq.nlargest(MAX_CONTAINERS, found, key=len)
    lengths, ids = list(map(len, found)), list(map(id, found))
    # Not kept last time: below MIN_CONTAINER items then, unless the table was full.
    floor = min(before.values()) if len(before) >= MAX_CONTAINERS else MIN_CONTAINER - 1
    known = before.get
    deltas = [n - known(ident, floor) for n, ident in zip(lengths, ids, strict=True)]
    grew = [(d, found[i]) for d, i in heapq.nlargest(MAX_NAMES, zip(deltas, itertools.count()))
            if d > 0]
    sizes = dict(zip(ids, lengths, strict=True))
    del found, deltas
    holding = tuple((f"{type_name(type(o))} of {held_type(o)}"[:MAX_NAME], d) for d, o in grew)
    held = sum(grown_bytes(o, d) for d, o in grew) if weigh else 0
    del grew
    return sizes, holding, held


def grown_bytes(container: Any, more: int) -> int:
    """The bytes a container that grew by ``more`` items holds in them: its own storage per
    item, plus the mean size of its newest SIZE_SAMPLE items (a dict's keys and values), each
    weighed one level deep (see item_bytes). An estimate: an object held twice is counted
    twice, and nothing deeper than one level is."""
    n = len(container)
    if not n or more <= 0:
        return 0
    if isinstance(container, dict):
        newest = list(itertools.islice(reversed(container.items()), SIZE_SAMPLE))
        items = sum(own_bytes(k) + item_bytes(v) for k, v in newest)
    else:
        ordered = reversed(container) if isinstance(container, list | collections.deque) \
            else container
        newest = list(itertools.islice(ordered, SIZE_SAMPLE))
        items = sum(map(item_bytes, newest))
    per_item = sys.getsizeof(container) / n + (items / len(newest) if newest else 0)
    return int(more * per_item)


def item_bytes(value: Any) -> int:
    """An item's own size, plus, for a container, that of what it holds (SIZE_INNER of its
    items, scaled to its length): a logged request's dict with its values, a list of floats."""
    size = own_bytes(value)
    kind = type(value)
    if kind in CONTAINER_TYPES or kind is tuple:
        n = len(value)
        values = value.values() if isinstance(value, dict) else value
        inner = list(itertools.islice(values, SIZE_INNER))
        if inner:
            size += sum(map(own_bytes, inner)) * n // len(inner)
    return size


def own_bytes(value: Any) -> int:
    """``sys.getsizeof``, plus the buffer of a numpy array or memoryview that does not own
    it (an array's getsizeof counts the data it owns) or of an EagerTensor (its data is TF's);
    asked of known types only: an arbitrary attribute read could run a handler's code."""
    size = sys.getsizeof(value, 64)
    kind = type(value)
    if kind is np.ndarray:
        return max(size, int(value.nbytes))
    if kind is memoryview:
        return size + int(value.nbytes)
    if type_name(kind) == "tensorflow.python.framework.ops.EagerTensor":
        try:
            return size + int(value.shape.num_elements() or 0) * int(value.dtype.size)
        except Exception:  # a TF whose tensors say it otherwise: their own size only
            return size
    return size


def reachable_containers(roots: Sequence[Any], known: set[int]) -> list[Any]:
    """Containers the garbage collector does not list, found from the handler: CPython
    untracks a dict whose keys and values are all atomic or untracked (a cache of numpy
    arrays by bytes), so gc.get_objects() never yields it. Followed from the handler (its
    attributes, a function's globals and closure) for REACH_DEPTH steps and REACH_LIMIT
    objects at most, not into modules other than the handler's, nor into containers larger
    than REACH_FANOUT (their length is what counts)."""
    out: list[Any] = []
    seen: set[int] = set()
    frontier = list(roots)
    for _ in range(REACH_DEPTH):
        step: list[Any] = []
        for obj in frontier:
            if id(obj) in seen or len(seen) >= REACH_LIMIT:
                continue
            seen.add(id(obj))
            kind = type(obj)
            if kind in CONTAINER_TYPES:
                if id(obj) not in known:
                    out.append(obj)
                if len(obj) > REACH_FANOUT:
                    continue
            elif kind is types.ModuleType and not any(obj is r for r in roots):
                continue
            step.extend(gc.get_referents(obj))
        frontier = step
    return out


def held_type(container: Any) -> str:
    """The most common type among a container's values (a dict's values, not its keys),
    from at most 64 of them."""
    values = container.values() if isinstance(container, dict) else container
    kinds = collections.Counter(type_name(type(v)) for v in itertools.islice(values, 64))
    return kinds.most_common(1)[0][0] if kinds else "nothing"


def _largest(items: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return tuple(heapq.nlargest(MAX_NAMES, ((name[:MAX_NAME], n) for name, n in items),
                                key=lambda item: item[1]))


def type_name(kind: type) -> str:
    module = getattr(kind, "__module__", None)
    name = str(getattr(kind, "__qualname__", None) or getattr(kind, "__name__", "?"))
    return name if module in (None, "builtins") else f"{module}.{name}"


# --- process readings -------------------------------------------------------------------------

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
