"""Leak probes: the worker's recorder (worker/probes.py) on fake readings with time passed
in, the wire form (supervisor/shared/probes.py) against hostile input, and real workers'
heartbeats carrying them."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.shared.probes import MAX_COUNT, MAX_NAME, MAX_NAMES, Probes, ShapeGrowth
from worker import census, readings
from worker.census import (
    CENSUS_BLOCKS,
    CENSUS_INTERVAL,
    GROWING_CENSUS_INTERVAL,
    MAX_CENSUS_SECONDS,
    MIN_CONTAINER,
    count_types,
)
from worker.probes import (
    BUDGET,
    GROWING_BYTES,
    ProbeRecorder,
    ShapeTable,
    Sources,
    signature_key,
    signature_text,
)
from worker.readings import python_name, traced
from worker.runners import Runner

# --- fakes ---------------------------------------------------------------------------------------


@dataclass
class Fake:
    """Readings a test sets; the clock moves only when a test (or a fake call) moves it."""

    rss: int = 100_000_000
    blocks: int = 1_000_000
    functions: set[str] | None = None
    objects: list[Any] = field(default_factory=list)
    clock: float = 0.0
    sample_cost: float = 0.0  # clock seconds each functions() reading takes
    census_cost: float = 0.0  # clock seconds each objects() reading takes
    readings: dict[str, int] = field(default_factory=dict)

    def _count(self, name: str) -> None:
        self.readings[name] = self.readings.get(name, 0) + 1

    def sources(self) -> Sources:
        def functions() -> set[str] | None:
            self._count("functions")
            self.clock += self.sample_cost
            return self.functions

        def objects() -> list[Any]:
            self._count("objects")
            self.clock += self.census_cost
            return self.objects

        def rss() -> int:
            self._count("rss")
            return self.rss

        return Sources(rss=rss, py_blocks=lambda: self.blocks, native_heap=lambda: 5_000_000,
                       functions=functions, tf_allocator=lambda: None, objects=objects,
                       clock=lambda: self.clock, cpu_clock=lambda: self.clock)


@pytest.fixture
def fake() -> Fake:
    return Fake()


def model(fake: Fake, grows: dict[int, int] | None = None, took: float = 0.001) -> Runner:
    """A runner whose call takes ``took`` clock seconds and grows RSS by ``grows[rows]``."""
    def call(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = next(iter(inputs.values())).shape[0]
        fake.rss += (grows or {}).get(rows, 0)
        fake.clock += took
        return {"y": np.zeros((rows, 1), np.float32)}

    return Runner(call, None, None)


def x(rows: int, width: int = 16, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    return {"x": np.zeros((rows, width), dtype)}


# --- signatures ----------------------------------------------------------------------------------

def test_a_signature_is_names_dtypes_and_full_shapes_by_name() -> None:
    assert signature_text(signature_key(x(8))) == "x:float32[8,16]"
    inputs = {"mask": np.ones((2, 7), np.int32), "ids": np.ones((2, 7), np.int64),
              "text": np.array([b"a", b"b"], dtype=object), "scalar": np.float64(1.0)}
    key = signature_key(inputs)
    assert signature_text(key) == \
        "ids:int64[2,7],mask:int32[2,7],scalar:float64[],text:object[2]"
    assert signature_key(dict(reversed(list(inputs.items())))) == key  # order does not count
    assert signature_key(x(8)) != signature_key(x(9)) != signature_key(x(9, dtype=np.float16))
    many = {f"input_{i:03d}": np.zeros((1, 1000), np.float32) for i in range(40)}
    assert len(signature_text(signature_key(many))) == MAX_NAME


def test_the_table_keeps_at_most_its_capacity_and_counts_the_rest() -> None:
    table = ShapeTable(capacity=4, overflow_bits=2**16)
    for rows in range(1, 2001):
        table.record(signature_key(x(rows)), 0)
    for rows in range(1, 2001):  # seen before: not new again, kept or not
        table.record(signature_key(x(rows)), 0)
    assert len(table.entries) == 4
    assert table._overflow is not None and len(table._overflow) == 2**16 // 8
    assert 1900 <= table.distinct() <= 2100  # linear counting: exact within a few %
    assert [s.batches for s in table.top(MAX_NAMES)] == [2, 2, 2, 2]
    assert not table.is_new(signature_key(x(3000)))  # full: nothing is new any more


def test_batches_beyond_the_table_are_counted_but_not_measured(fake: Fake) -> None:
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    recorder.shapes = ShapeTable(capacity=2, overflow_bits=2**12)
    runner = recorder.wrap(model(fake, grows=dict.fromkeys(range(1, 11), 4096)))
    sampled = fake.readings["rss"]  # the samples' own reads (growth since the last one)
    for rows in range(1, 11):
        runner(x(rows))
    assert fake.readings["rss"] - sampled == 4  # before and after the two it keeps
    assert recorder.shapes.distinct() == 10
    assert [s.first_growth for s in recorder.shapes.top(MAX_NAMES)] == [4096, 4096]


def test_distinct_signatures_are_exact_within_capacity() -> None:
    table = ShapeTable()
    for rows in [1, 2, 3, 1, 2, 3, 4] * 10:
        table.record(signature_key(x(rows)), 0)
    assert table.distinct() == 4 and table._overflow is None


# --- attribution ---------------------------------------------------------------------------------

def test_growth_is_credited_to_the_signature_of_the_batch_that_grew(fake: Fake) -> None:
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    runner = recorder.wrap(model(fake, grows={3: 4096, 5: 1 << 20}))
    for rows in [1, 3, 1, 3, 5, 1]:
        runner(x(rows))
    fake.rss -= 10 << 20  # memory given back is never credited as negative growth
    runner(x(1))
    recorder.between(1.0)
    shapes = {s.signature: s for s in recorder.latest.top_shapes}
    assert recorder.latest.shapes == 3
    assert shapes["x:float32[5,16]"] == ShapeGrowth("x:float32[5,16]", 1, 1 << 20, 1 << 20)
    assert shapes["x:float32[3,16]"] == ShapeGrowth("x:float32[3,16]", 2, 4096, 8192)
    assert shapes["x:float32[1,16]"] == ShapeGrowth("x:float32[1,16]", 4, 0, 0)
    assert recorder.latest.top_shapes[0].signature == "x:float32[5,16]"


def test_a_batch_that_raises_is_still_counted(fake: Fake) -> None:
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())

    def fails(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fake.rss += 8192
        raise ValueError("bad shape")

    runner = recorder.wrap(Runner(fails, None, None))
    with pytest.raises(ValueError):
        runner(x(2))
    assert recorder.shapes.top(1) == (ShapeGrowth("x:float32[2,16]", 1, 8192, 8192),)


def test_inputs_that_are_not_arrays_fail_no_job(fake: Fake) -> None:
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    runner = recorder.wrap(Runner(lambda inputs: {"y": np.ones(1)}, None, None))
    assert runner({"x": "not an array"})["y"].shape == (1,)  # type: ignore[dict-item]
    assert recorder.shapes.distinct() == 0


def test_rss_reads_stay_within_budget_but_a_new_signature_is_always_measured(
        fake: Fake) -> None:
    # Each batch takes 1 ms and each RSS read costs 10 µs: measuring every batch would cost
    # 2 %, so only about one in seven is measured; the growth of the others is estimated.
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    read = fake.sources().rss

    def dear_rss() -> int:
        fake.clock += 10e-6
        return read()

    recorder.sources.rss = dear_rss
    runner = recorder.wrap(model(fake, grows={1: 1000}, took=0.001))
    for _ in range(3000):
        runner(x(1))
    entry = recorder.shapes.top(1)[0]
    measured = recorder.shapes.entries[signature_key(x(1))].measured
    assert entry.batches == 3000 and entry.first_growth == 1000
    allowed = 3000 * 0.001 * BUDGET / 20e-6  # the budget's share of 3 s, in reads of 20 µs
    assert 0.8 * allowed < measured < 1.2 * allowed, (measured, allowed)
    assert entry.growth == 3000 * 1000  # every batch grew alike: the estimate is exact
    assert recorder.cost <= BUDGET * fake.clock * 1.2
    reads = fake.readings["rss"]
    recorder._countdown = 10**6  # no known signature is due, for as long as this test runs
    for rows in range(2, 12):  # new signatures
        runner(x(rows))
    assert all(s.first_growth == 0 and s.batches == 1 for s in recorder.shapes.top(11)[1:])
    assert fake.readings["rss"] - reads == 20  # before and after each one
    runner(x(1))
    assert fake.readings["rss"] - reads == 20  # a known one waits for the budget


# --- sampling and census, with time passed in ----------------------------------------------------

def test_samples_are_taken_at_most_once_per_interval_and_between_batches(fake: Fake) -> None:
    fake.functions = {"__inference_step_1"}
    recorder = ProbeRecorder(1.0, 100.0, fake.sources())
    assert fake.readings["functions"] == 1 and recorder.latest.graphs == 1
    first = recorder.latest
    runner = recorder.wrap(model(fake))
    fake.functions = {"__inference_step_1", "__inference_step_2"}
    for _ in range(50):
        runner(x(1))  # batches never sample
    recorder.between(100.5)
    assert fake.readings["functions"] == 1 and recorder.latest is first
    recorder.between(101.0)
    assert fake.readings["functions"] == 2 and recorder.latest.graphs == 2
    assert recorder.latest.traced == (("step", 2),)
    assert first.graphs == 1  # a published snapshot never changes


def test_a_dear_sample_pushes_the_next_one_out(fake: Fake) -> None:
    fake.functions = {f"__inference_f_{i}" for i in range(100_000)}
    fake.sample_cost = 0.02  # 20 ms to list them
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    spacing = 0.02 / BUDGET
    recorder.between(spacing - 0.1)
    assert fake.readings["functions"] == 1
    recorder.between(spacing)
    assert fake.readings["functions"] == 2


def test_census_waits_for_growth_and_a_minute_and_reports_what_grew(fake: Fake) -> None:
    class Leaked:
        pass

    fake.objects = [{} for _ in range(10)] + [[] for _ in range(5)]
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    recorder.between(600.0)
    assert "objects" not in fake.readings  # nothing grew: no census at all, not even one
    fake.blocks += CENSUS_BLOCKS
    recorder.between(601.0)
    assert fake.readings["objects"] == 1  # the baseline, once Python's heap grew
    fake.objects += [Leaked() for _ in range(300)] + [{} for _ in range(100)]
    fake.blocks += CENSUS_BLOCKS
    recorder.between(601.0 + CENSUS_INTERVAL / 2)
    assert fake.readings["objects"] == 1  # too soon
    fake.blocks -= 1
    recorder.between(602.0 + CENSUS_INTERVAL)
    assert fake.readings["objects"] == 1  # too little
    fake.blocks += 1
    recorder.between(603.0 + CENSUS_INTERVAL)
    assert fake.readings["objects"] == 2
    name = f"{__name__}.test_census_waits_for_growth_and_a_minute_and_reports_what_grew." \
           "<locals>.Leaked"
    assert recorder.latest.census == ((name, 300), ("dict", 100))
    fake.blocks += 10 * CENSUS_BLOCKS
    recorder.between(603.0 + CENSUS_INTERVAL + 30)
    assert fake.readings["objects"] == 2  # a minute since the last one
    recorder.between(604.0 + 2 * CENSUS_INTERVAL)
    assert fake.readings["objects"] == 3
    assert recorder.latest.census == ()  # nothing grew since


def test_a_growing_worker_gets_a_census_that_sees_the_container_keeping_arrays(
        fake: Fake) -> None:
    """numpy arrays are not tracked by the garbage collector, so no count by type sees an
    unbounded cache of them; the dict that keeps them is. A worker whose RSS grows gets its
    first compared census early, however few Python blocks it adds; later ones come at
    most once per CENSUS_INTERVAL, growing or not."""
    cache: dict[int, np.ndarray] = {}
    fake.objects = [cache, [], {"a": 1}]
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())

    def serve(until: int, now: float) -> None:
        for i in range(len(cache), until):
            cache[i] = np.zeros(4)
        fake.rss += 20 * GROWING_BYTES
        fake.blocks += 10  # far under CENSUS_BLOCKS
        recorder.between(now, until)

    serve(10, 1.0)
    assert fake.readings["objects"] == 1  # the baseline, as soon as RSS grew
    serve(300, 1.0 + GROWING_CENSUS_INTERVAL / 2)
    assert fake.readings["objects"] == 1  # not yet
    serve(650, 1.0 + GROWING_CENSUS_INTERVAL)
    assert fake.readings["objects"] == 2
    assert recorder.latest.containers == (("dict of numpy.ndarray", 640),)
    assert recorder.latest.census_jobs == 640
    serve(900, 1.0 + 2 * GROWING_CENSUS_INTERVAL)  # still growing: the early one was the one
    assert fake.readings["objects"] == 2
    serve(2000, 1.0 + GROWING_CENSUS_INTERVAL + CENSUS_INTERVAL)
    assert fake.readings["objects"] == 3
    assert recorder.latest.containers == (("dict of numpy.ndarray", 1350),)


def test_growth_under_a_megabyte_a_sample_still_brings_the_early_census(fake: Fake) -> None:
    """Growing is judged since the last census, not since the last sample: a cache of
    32 KiB arrays served at 8 jobs a sample (a busy machine's rate) grows 256 KiB between
    samples, and measured that way never looked growing, got no census, and was named a
    native leak."""
    cache: dict[int, np.ndarray] = {}
    fake.objects = [cache]
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    now = 0.0
    while fake.readings.get("objects", 0) < 2 and now < 200:
        for _ in range(8):
            cache[len(cache)] = np.zeros(4096)
            fake.rss += 32 * 1024
        now += 1.0
        recorder.between(now, len(cache))
    # the baseline at 1 MiB grown, the compared one at the next MiB: 4 samples each
    assert fake.readings["objects"] == 2 and now == 8.0 >= 4.0 + GROWING_CENSUS_INTERVAL
    assert recorder.latest.containers == (("dict of numpy.ndarray", 32),)
    assert recorder.latest.census_bytes is not None and \
        recorder.latest.census_bytes >= 32 * 32 * 1024
    assert recorder.latest.census_jobs == 32


def test_the_census_baseline_waits_for_the_first_job(fake: Fake) -> None:
    """A model's first call builds what it builds once (a trace): a baseline before it
    would count all that as grown at the next census, and a native leak served slowly
    enough looked like Python keeping graph objects."""
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    recorder.between(1.0, 0)
    fake.rss += 200 * GROWING_BYTES  # the model loaded
    fake.blocks += 2 * CENSUS_BLOCKS
    recorder.between(2.0, 0)
    assert "objects" not in fake.readings
    recorder.between(3.0, 1)
    assert fake.readings["objects"] == 1


def _census_twice(fake: Fake, between: Any) -> Probes:
    """A growing worker's baseline census, ``between()`` (what it keeps), and the census
    compared with it."""
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    fake.rss += 20 * GROWING_BYTES
    recorder.between(1.0, 10)
    assert recorder.latest.census_bytes is None  # a baseline weighs nothing
    between()
    fake.rss += 20 * GROWING_BYTES
    recorder.between(1.0 + GROWING_CENSUS_INTERVAL, 660)
    assert fake.readings["objects"] == 2
    return recorder.latest


def test_a_census_weighs_what_the_growing_containers_hold(fake: Fake) -> None:
    """A dict of 32 KiB arrays holds ~32 KiB a job; a list of pointers (ints), ~36 bytes:
    counted in items, the two look alike."""
    cache: dict[bytes, np.ndarray] = {}
    pointers: list[int] = []
    fake.objects = [cache, pointers]

    def serve() -> None:
        for i in range(650):
            cache[i.to_bytes(8, "big")] = np.full(4096, float(i))
            pointers.append(2**40 + i * 4096)
    latest = _census_twice(fake, serve)
    assert dict(latest.containers) == {"dict of numpy.ndarray": 650 - MIN_CONTAINER + 1,
                                       "list of int": 650 - MIN_CONTAINER + 1}
    per_item = (latest.census_bytes or 0) / (650 - MIN_CONTAINER + 1)  # a pair of items
    assert 32 * 1024 + 36 < per_item < 33 * 1024, per_item  # an array and its key, an int

    # the list of pointers alone
    ints = list(pointers)
    pointers.clear()
    alone = _census_twice(Fake(objects=[pointers]), lambda: pointers.extend(ints))
    assert alone.census_bytes in range(643 * 28, 643 * 50)


def test_a_census_weighs_objects_that_hold_buffers_and_grew_in_number(fake: Fake) -> None:
    """Objects holding buffers that the census counts by type (EagerTensors appended to a
    list too large to follow, here numpy arrays in the collector's list): how many more,
    times their mean size."""
    fake.objects = [np.zeros(1024) for _ in range(10)]
    latest = _census_twice(fake, lambda: fake.objects.extend(np.zeros(1024) for _ in range(500)))
    assert ("numpy.ndarray", 500) in latest.census
    assert 500 * 8192 <= (latest.census_bytes or 0) < 500 * 8400


class EagerTensor:
    """Named as TensorFlow's is: its buffer is TF's, not in its getsizeof."""

    class _Shape:
        def num_elements(self) -> int:
            return 1000

    class _Dtype:
        size = 4

    shape, dtype = _Shape(), _Dtype()


EagerTensor.__module__ = "tensorflow.python.framework.ops"


def test_own_bytes_counts_buffers_that_getsizeof_does_not() -> None:
    array = np.zeros(1000)
    assert census.own_bytes(array) >= 8000 and census.own_bytes(array[::2]) >= 4000  # a view too
    assert census.own_bytes(memoryview(bytes(5000))) >= 5000
    assert census.own_bytes(EagerTensor()) >= 4000
    floats = [float(i) for i in range(100)]
    assert census.item_bytes(floats) >= sys.getsizeof(floats) + 100 * 24
    row = {"values": floats}
    assert census.item_bytes(row) == sys.getsizeof(row) + sys.getsizeof(floats)  # one level deep


def test_a_container_unknown_at_the_last_census_grew_from_under_the_smallest_kept(
        fake: Fake) -> None:
    cache: dict[int, np.ndarray] = {}
    fake.objects = [cache]
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    fake.rss += 20 * GROWING_BYTES
    recorder.between(1.0, 2)  # the baseline: the cache is empty, under MIN_CONTAINER
    for i in range(650):
        cache[i] = np.zeros(4)
    fake.rss += 20 * GROWING_BYTES
    recorder.between(1.0 + GROWING_CENSUS_INTERVAL, 652)
    assert recorder.latest.containers == (("dict of numpy.ndarray", 650 - MIN_CONTAINER + 1),)


class CachingHandler:
    """Keeps a dict of bytes by bytes: CPython does not track such a dict, so
    gc.get_objects() never lists it; a census finds it from the handler."""

    def __init__(self) -> None:
        self.cache: dict[bytes, bytes] = {}

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.cache[len(self.cache).to_bytes(4, "big")] = bytes(64)
        return {"y": np.zeros((1, 1), np.float32)}


def test_a_cache_the_garbage_collector_does_not_track_is_found_from_the_handler(
        fake: Fake) -> None:
    import gc

    handler = CachingHandler()
    fake.objects = [{"unrelated": [1, 2, 3]}]  # what gc.get_objects() lists: not the cache
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    runner = recorder.wrap(Runner(handler, None, None))
    for _ in range(10):
        runner(x(1))
    fake.rss += 20 * GROWING_BYTES
    recorder.between(1.0, 10)  # the census baseline, from the handler too
    for _ in range(500):
        runner(x(1))
    assert not gc.is_tracked(handler.cache)
    fake.rss += 20 * GROWING_BYTES
    recorder.between(1.0 + GROWING_CENSUS_INTERVAL, 510)
    assert fake.readings["objects"] == 2
    assert recorder.latest.containers == (("dict of bytes", 500),)


def test_a_census_that_stalls_serving_is_the_last(fake: Fake) -> None:
    fake.census_cost = MAX_CENSUS_SECONDS * 2
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    fake.blocks += CENSUS_BLOCKS
    recorder.between(1.0)
    assert recorder.census.stopped
    fake.blocks += 100 * CENSUS_BLOCKS
    for hour in range(1, 5):
        recorder.between(hour * 3600.0)
    assert fake.readings["objects"] == 1


def test_a_probe_that_breaks_stops_sampling_and_fails_nothing(fake: Fake) -> None:
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    before = recorder.latest

    def broken() -> int:
        raise RuntimeError("no mallinfo today")

    recorder.sources.native_heap = broken
    recorder.between(1.0)  # does not raise
    assert recorder.latest is before
    recorder.sources.native_heap = lambda: 1
    recorder.between(3600.0)
    assert recorder.latest is before and fake.readings["functions"] == 2  # no more samples
    assert recorder.wrap(model(fake))(x(1))["y"].shape == (1, 1)  # batches still served


def test_census_counts_a_stride_of_many_objects_and_keeps_few_types(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(census, "CENSUS_SAMPLE", 1000)
    monkeypatch.setattr(census, "MAX_TYPES", 3)
    objects: list[Any] = [{} for _ in range(6000)] + [[] for _ in range(3000)] + \
        [set() for _ in range(1000)] + [frozenset({i}) for i in range(10)]
    counts, buffers = count_types(objects)
    assert buffers == {}  # none of them holds a buffer
    assert list(counts) == ["dict", "list", "set"]
    assert counts["dict"] == pytest.approx(6000, rel=0.05)
    assert counts["list"] == pytest.approx(3000, rel=0.05)


# --- traced functions ----------------------------------------------------------------------------

def test_traced_names_are_python_names_counted() -> None:
    names = {"__inference_step_15", "__inference_step_23", "__inference_step_31",
             "__inference___call___255", "__inference_signature_wrapper___call___290",
             "__inference_one_step_on_data_distributed_1256", "__inference_odd",
             "__wrapped__AssignVariableOp_device_/job:localhost/replica:0/task:0/device:CPU:0"}
    counts = dict(traced(names))
    assert counts == {"step": 3, "__call__": 1, "signature_wrapper___call__": 1,
                      "one_step_on_data_distributed": 1, "odd": 1}
    assert python_name("__inference_f_1_2") == "f_1"
    many = {f"__inference_f{i % 20}_{i}" for i in range(1000)}
    assert len(traced(many)) == MAX_NAMES


def test_without_tensorflow_graphs_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert readings.tf_function_names() is None
    assert readings.TfAllocator().read() is None


# --- the wire, against hostile input -------------------------------------------------------------

def test_a_real_snapshot_round_trips(fake: Fake) -> None:
    fake.functions = {"__inference_step_1"}
    recorder = ProbeRecorder(1.0, 0.0, fake.sources())
    runner = recorder.wrap(model(fake, grows={2: 4096}))
    for rows in (1, 2, 2):
        runner(x(rows))
    recorder.between(5.0)
    wire = recorder.latest.to_wire()
    assert Probes.from_wire(wire) == recorder.latest
    import msgpack

    assert Probes.from_wire(msgpack.unpackb(msgpack.packb(wire))) == recorder.latest


HOSTILE: list[Any] = [
    None, 0, -1, True, 1.5, math.nan, math.inf, "probes", b"bytes", [], [1, 2], {},
    {"graphs": math.nan, "py_blocks": math.inf, "native_heap": -math.inf, "shapes": True,
     "tf_allocator": "12", "cost_seconds": math.nan},
    {"graphs": 10**400, "py_blocks": -(10**400), "native_heap": MAX_COUNT + 1,
     "cost_seconds": 10**400},
    {"graphs": -5, "shapes": 2.5, "cost_seconds": -1, "census": [["dict", -(10**30)]]},
    {"census_bytes": math.nan, "census_jobs": 0}, {"census_bytes": -1, "census_jobs": -3},
    {"census_bytes": 2**80, "census_jobs": "650"}, {"census_bytes": 1.5e9, "census_jobs": True},
    {"traced": "step", "top_shapes": "x", "census": {"dict": 1}},
    {"traced": [["step"], ["step", 1, 2], [1, 2], ["step", "3"], ["step", True],
                ["step", 3.0], ("ok", 1), ["s" * 10**5, 2]]},
    {"top_shapes": [["x", 1, 2], ["x", 1, 2, "3"], [1, 2, 3, 4], ["x", -1, 0, 0],
                    ["x" * 10**5, 1, 2, 3], {"x": 1}, None]},
    {"traced": [["f", 1]] * 10**6, "top_shapes": [["x", 1, 2, 3]] * 10**6,
     "census": list(range(10**6))},
    {"graphs": [[[[[[]]]]]], "traced": [[[["deep"]]]], "census": [[["a", 1]]],
     "top_shapes": [[[["x", 1, 2, 3]]]], "extra": {"nested": {"junk": [1, {2: 3}]}}},
]


@pytest.mark.parametrize("raw", HOSTILE, ids=range(len(HOSTILE)))
def test_from_wire_never_raises_and_bounds_everything(raw: Any) -> None:
    probes = Probes.from_wire(raw)
    if not isinstance(raw, dict):
        assert probes is None
        return
    assert probes is not None
    _bounded(probes)


def _bounded(probes: Probes) -> None:
    for name in ("graphs", "py_blocks", "native_heap", "tf_allocator", "shapes", "jobs",
                 "census_jobs", "census_bytes"):
        value = getattr(probes, name)
        assert value is None or (type(value) is int and 0 <= value <= MAX_COUNT), (name, value)
    for names in (probes.traced, probes.census, probes.containers):
        assert len(names) <= MAX_NAMES
        assert all(type(n) is str and len(n) <= MAX_NAME and type(c) is int
                   and abs(c) <= MAX_COUNT for n, c in names)
    assert all(c >= 0 for _, c in (*probes.traced, *probes.containers))
    assert len(probes.top_shapes) <= MAX_NAMES
    for shape in probes.top_shapes:
        assert len(shape.signature) <= MAX_NAME
        assert all(type(v) is int and 0 <= v <= MAX_COUNT
                   for v in (shape.batches, shape.first_growth, shape.growth))
    assert type(probes.cost_seconds) is float and math.isfinite(probes.cost_seconds)
    assert probes.cost_seconds >= 0


def test_from_wire_keeps_what_is_sound_beside_what_is_not() -> None:
    probes = Probes.from_wire({"graphs": 12, "py_blocks": "many", "traced": [
        ["step", 3], ["bad", -1], ["also", "bad"]], "top_shapes": [
        ["x:float32[8,16]", 2, 10, 20], ["broken"]], "census": [["dict", -4]],
        "cost_seconds": 0.25})
    assert probes == Probes(graphs=12, traced=(("step", 3),), top_shapes=(
        ShapeGrowth("x:float32[8,16]", 2, 10, 20),), census=(("dict", -4),),
        cost_seconds=0.25)


wire_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=12) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=12) | st.integers(), inner, max_size=6),
    max_leaves=40)
fields = st.sampled_from(["graphs", "traced", "py_blocks", "native_heap", "tf_allocator",
                          "shapes", "top_shapes", "census", "containers", "census_jobs",
                          "census_bytes",
                          "cost_seconds", "jobs", "other"])


@settings(max_examples=300)
@given(st.dictionaries(fields, wire_values, max_size=10) | wire_values)
def test_from_wire_on_anything(raw: Any) -> None:
    probes = Probes.from_wire(raw)
    if probes is not None:
        _bounded(probes)


@given(wire_values)
def test_shape_growth_from_wire_on_anything(raw: Any) -> None:
    shape = ShapeGrowth.from_wire(raw)
    assert shape is None or len(shape.signature) <= MAX_NAME


# --- real workers --------------------------------------------------------------------------------

@pytest.fixture
def workers() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for worker in started:
        worker.close()


def test_a_handler_worker_reports_probes_without_graphs(workers: list[Any]) -> None:
    from bench.leak_probes import DirectWorker

    worker = DirectWorker({"handler": "worker.handlers:echo"}, heartbeat=0.1)
    workers.append(worker)
    for rows in (1, 2, 2, 3):
        worker.infer(x(rows, 4))
    beat = worker.wait_beat(lambda b: b.probes is not None and b.probes.shapes == 3)
    assert beat.probes is not None
    assert beat.probes.graphs is None and beat.probes.traced == ()  # TF never imported
    assert beat.probes.py_blocks and beat.probes.native_heap
    assert {s.signature: s.batches for s in beat.probes.top_shapes} == {
        "x:float32[1,4]": 1, "x:float32[2,4]": 2, "x:float32[3,4]": 1}


def test_probes_off_sends_none(workers: list[Any]) -> None:
    from bench.leak_probes import DirectWorker

    worker = DirectWorker({"handler": "worker.handlers:echo", "probes": False}, heartbeat=0.1)
    workers.append(worker)
    worker.infer(x(1, 4))
    beat = worker.wait_beat(lambda b: b.jobs == 1)
    assert beat.probes is None and all(b.probes is None for b in worker.beats)


@pytest.mark.tf
def test_a_retracing_tf_worker_shows_its_graphs_rising(workers: list[Any]) -> None:
    pytest.importorskip("tensorflow")
    from bench.leak_probes import DirectWorker

    worker = DirectWorker({"handler": "worker.tf_handlers:retracing", "options": {"width": 8},
                           "tf": {"intra_op_threads": 1, "inter_op_threads": 1}},
                          heartbeat=0.1)
    workers.append(worker)
    start = worker.wait_beat(lambda b: b.probes is not None and b.probes.graphs is not None)
    assert start.probes is not None and start.probes.graphs is not None
    for _ in range(30):
        worker.infer(x(2, 8))
    # Each call passes a new Python int: a new trace, a new function in the eager context.
    end = worker.wait_beat(lambda b: b.probes is not None and (b.probes.graphs or 0) >=
                           (start.probes.graphs or 0) + 30)
    assert end.probes is not None
    assert end.probes.traced[0][0] == "forward" and end.probes.traced[0][1] >= 31
    assert end.probes.shapes == 1  # same shapes all along: it is not the input


def test_names_from_the_wire_are_made_printable() -> None:
    """A worker's names reach `status`, `explain`, remedies and logs: control characters in
    them (ESC sequences, newlines) arrive escaped, and stay within MAX_NAME."""
    from supervisor.shared.probes import MAX_NAME as LONGEST

    raw = {"traced": [["f\x1b[2J\nforged", 3]], "census": [["t\r", 1]],
           "containers": [["c\x00" * 300, 2]],
           "top_shapes": [["x:int32[1,\x1b]", 1, 2, 3]]}
    probes = Probes.from_wire(raw)
    assert probes is not None
    assert probes.traced == (("f\\x1b[2J\\nforged", 3),)
    assert probes.census == (("t\\r", 1),)
    assert len(probes.containers[0][0]) <= LONGEST and probes.containers[0][0].isprintable()
    assert probes.top_shapes[0].signature == "x:int32[1,\\x1b]"
