"""The worker's census of live Python objects: counted by type when Python's heap grew, and
the containers that grew with what they hold, weighed in bytes, so that the supervisor can
tell a list of pointers from a cache of arrays (worker/probes.py decides when)."""

from __future__ import annotations

import collections
import functools
import gc
import heapq
import itertools
import math
import operator
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from supervisor.shared.probes import BUFFER_TYPES, MAX_NAME, MAX_NAMES

# A census runs when Python's allocated blocks grew by this many since the last one (~0.5 to
# 10 MB of small objects), or when RSS grew by GROWING_BYTES since the last one, whatever the
# blocks did (worker/probes.py); at most once per CENSUS_INTERVAL seconds. The first one, the
# baseline, too: a worker that grows neither way is never censused. One exception: the first
# census compared with the baseline, in a worker whose RSS grows, comes as soon as
# GROWING_CENSUS_INTERVAL and GROWING_BUDGET allow: a fast leak is recycled within seconds,
# and a census is what tells a buffer kept by Python (a numpy array in a cache) from a native
# leak. So a leaking worker pays for one early census (~100 ms in a TF worker), a steady one
# for at most one census a minute while its RSS creeps (none once it is flat).
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

    def due(self, now: float, blocks: int | None, budget: float, growing: bool = False,
            jobs: int | None = None) -> bool:
        """Whether a census is due; ``budget``: the share of the serving thread's time a census
        may take (the recorder's BUDGET), which spaces them by what the last one took;
        ``jobs``: answered so far, if known."""
        if self.stopped or blocks is None:
            return False
        if self.counts is None:
            # The baseline the next census is compared with, once there is something to
            # look for: a worker that never grows never pays for a census. Not before the
            # first job: a model's first call builds what it builds once (a tf.function's
            # trace: ~1,600 functions, decorators, stack frames), which a baseline taken
            # before it counts as grown at the next census. On busy cores fewer jobs passed
            # by then, and a native leak's census was led by TensorFlow's decorators.
            if self.start_blocks is None:
                self.start_blocks = blocks
            return jobs != 0 and (growing or blocks - self.start_blocks >= CENSUS_BLOCKS)
        early = growing and not self.compared
        spacing = max(GROWING_CENSUS_INTERVAL, self.took / GROWING_BUDGET) if early \
            else max(CENSUS_INTERVAL, self.took / budget)
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


