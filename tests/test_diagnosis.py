"""The diagnosis rules on synthetic probe series: each cause named from its evidence, a flat
worker never suspected, and nothing a worker reports can make the diagnosis fail."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from supervisor.config.keys import PolicyConfig
from supervisor.core.diagnosis import (
    Cause,
    Split,
    Trends,
    _cause,
    diagnose,
    growth_split,
    trends,
)
from supervisor.core.history import Sample
from supervisor.core.policy import WorkerFacts, evaluate
from supervisor.core.reasons import Reason
from supervisor.shared.probes import Probes, ShapeGrowth

MB = 1024**2
JOBS = 100  # per sample
POLICY = PolicyConfig(warmup_jobs=0, warmup_seconds=0.0, trend_window=60, trend_confirmations=1,
                      max_growth_per_1k_jobs=10 * MB, max_growth_per_hour=None)
BASE = Probes(graphs=40, traced=(("serving_default", 1),), py_blocks=300_000,
              native_heap=500 * MB, tf_allocator=None, shapes=3)

Grow = Callable[[int], Probes]


def series(memory_per_sample: float, probes: Grow | None, n: int = 80,
           vram_per_sample: float | None = None) -> list[Sample]:
    return [Sample(t=float(i), jobs=i * JOBS, memory=int(800 * MB + memory_per_sample * i),
                   vram=None if vram_per_sample is None else int(vram_per_sample * i),
                   probes=probes(i) if probes else None)
            for i in range(n)]


def judge(samples: list[Sample], policy: PolicyConfig = POLICY,
          reason: Reason | None = None) -> tuple[Cause | None, str, str]:
    facts = WorkerFacts(started_at=0.0, jobs=samples[-1].jobs, jitter=0.0)
    verdict = evaluate(samples, facts, policy, samples[-1].t)
    found = diagnose(samples, facts, policy, verdict.assessment, reason or verdict.reason,
                     samples[0].probes)
    return (found.cause, found.summary, found.remedy) if found else (None, "", "")


def grows(**per_sample: float) -> Grow:
    def probes(i: int) -> Probes:
        changes = {k: int(getattr(BASE, k) + v * i) for k, v in per_sample.items()
                   if k not in ("traced",)}
        # Each reading says the jobs it was taken at, as a worker's do (and so two readings
        # of the same values are still two readings).
        return dataclasses.replace(BASE, jobs=i * JOBS, **changes)
    return probes


def test_a_flat_worker_has_no_suspected_cause() -> None:
    assert judge(series(0, grows()))[0] is None
    # ... even when its probes move: memory is what makes a worker suspect
    assert judge(series(0, grows(graphs=10, py_blocks=5000)))[0] is None


def test_retracing_names_the_function_and_the_rate() -> None:
    def probes(i: int) -> Probes:
        return dataclasses.replace(BASE, graphs=40 + 100 * i,
                                   traced=(("step", 1 + 100 * i), ("serving_default", 1)))
    cause, summary, remedy = judge(series(2 * MB, probes))
    assert cause is Cause.RETRACING
    assert "`step`" in summary and "7,900 new graphs" in summary and "1 per job" in summary
    assert "input_signature" in remedy


def test_new_input_shapes_without_new_graphs() -> None:
    def probes(i: int) -> Probes:
        return dataclasses.replace(BASE, shapes=3 + 20 * i, top_shapes=(
            ShapeGrowth("input_ids:int32[1,387]", 1, 3 * MB, 3 * MB),))
    cause, summary, remedy = judge(series(2 * MB, probes))
    assert cause is Cause.NEW_INPUT_SHAPES
    assert "input_ids:int32[1,387]" in summary and "pad" in remedy


def test_python_objects_name_the_growing_types() -> None:
    def probes(i: int) -> Probes:
        return dataclasses.replace(BASE, py_blocks=300_000 + 2000 * i,
                                   census=(("dict", 1500), ("list", 400)))
    cause, summary, _ = judge(series(2 * MB, probes))
    assert cause is Cause.PYTHON_OBJECTS and "dict, list" in summary


def test_native_heap_live_allocations_and_retention_are_told_apart() -> None:
    cause, summary, remedy = judge(series(2 * MB, grows(native_heap=2 * MB)))
    assert cause is Cause.NATIVE_HEAP and "live native allocations" in summary
    assert "C extension" in remedy
    cause, summary, remedy = judge(series(2 * MB, grows()))
    assert cause is Cause.NATIVE_HEAP and "retention" in summary
    assert "MALLOC_ARENA_MAX" in remedy


def test_tf_allocator_growth() -> None:
    def probes(i: int) -> Probes:
        return dataclasses.replace(BASE, tf_allocator=10 * MB + 2 * MB * i,
                                   native_heap=500 * MB + 2 * MB * i)
    assert judge(series(2 * MB, probes))[0] is Cause.TF_ALLOCATOR


def test_a_vram_recycle_is_put_down_to_the_gpu_pool() -> None:
    policy = dataclasses.replace(POLICY, max_vram_growth_per_1k_jobs=1 * MB)
    cause, _, remedy = judge(series(0, grows(), vram_per_sample=1 * MB), policy)
    assert cause is Cause.VRAM_POOL and "gpu_memory_limit" in remedy


def test_without_probes_a_growing_worker_is_unknown() -> None:
    cause, _, remedy = judge(series(2 * MB, None))
    assert cause is Cause.UNKNOWN and "explain" in remedy


def test_a_few_late_traces_are_not_retracing() -> None:
    def probes(i: int) -> Probes:
        return dataclasses.replace(BASE, graphs=40 + (2 if i > 70 else 0))
    assert judge(series(2 * MB, probes))[0] is not Cause.RETRACING


def test_a_memory_limit_recycle_is_diagnosed_even_before_a_trend() -> None:
    samples = series(2 * MB, grows(graphs=100))[:4]  # too few for a trend
    cause, _, _ = judge(samples, reason=Reason.MAX_MEMORY)
    assert cause is Cause.UNKNOWN  # suspect, but the probes have no window yet


def test_trends_are_reported_per_1k_jobs() -> None:
    found = trends(series(1 * MB, grows(graphs=10, py_blocks=50)),
                   WorkerFacts(0.0, 8000, 0.0), POLICY)
    fields = found.fields()
    assert round(fields["memory_per_1k_jobs"]) == 10 * MB
    assert fields["graphs_per_1k_jobs"] == 100.0 and fields["py_blocks_per_1k_jobs"] == 500.0
    assert fields["graphs_added"] == 790  # over all warmed-up readings, not the window


_counter = st.one_of(st.none(), st.integers(0, 2**53))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.tuples(_counter, _counter, _counter, _counter, _counter),
                       min_size=0, max_size=90),
       memory=st.floats(-5 * MB, 50 * MB), reason=st.sampled_from([None, *Reason]),
       census=st.tuples(_counter, _counter, st.lists(st.tuples(st.text(max_size=20),
                                                               st.integers(0, 2**53)),
                                                     max_size=3)))
def test_any_probe_series_gives_a_diagnosis_or_none_and_never_fails(
        values: list[tuple[int | None, ...]], memory: float, reason: Reason | None,
        census: tuple[int | None, int | None, list[tuple[str, int]]]) -> None:
    weighed, jobs, containers = census
    samples = [Sample(t=float(i), jobs=i * JOBS, memory=max(0, int(800 * MB + memory * i)),
                      probes=Probes(graphs=g, py_blocks=p, native_heap=n, tf_allocator=a,
                                    shapes=s, census_bytes=weighed, census_jobs=jobs,
                                    containers=tuple(containers)))
               for i, (g, p, n, a, s) in enumerate(values)]
    if not samples:
        samples = [Sample(0.0, 0, 800 * MB)]
    cause, summary, remedy = judge(samples, reason=reason)
    assert cause is None or (cause in Cause and summary and remedy)


# The slopes per 1k jobs measured on real workers (bench/results/leak_probes.md), per sample
# of JOBS jobs: each reproduction must keep its name.
MEASURED = {  # case: (memory, graphs, py_blocks, native_heap, shapes, census, cause)
    "retrace_shapes": (98.3 * MB, 421.9, 204_095, 83.6 * MB, 422.3, (), Cause.RETRACING),
    "retrace_scalar": (272.1 * MB, 998.2, 573_296, 232.6 * MB, 0, (), Cause.RETRACING),
    "python_hoard": (1.18 * MB, 0, 26_020, 0.01 * MB, 0, (("list", 60949),),
                     Cause.PYTHON_OBJECTS),
    "native_leak": (62.5 * MB, 0, 185, 62.1 * MB, 0, (), Cause.NATIVE_HEAP),
    "keras_predict": (11.1 * MB, 0, 15_197, 3.2 * MB, 0,
                      (("list", 6150), ("tensorflow.python.framework.ops.Operation", 1572)),
                      Cause.PYTHON_OBJECTS),
    "batch_sizes": (6.0 * MB, 0, 461, 0.16 * MB, 12.5, (), Cause.NEW_INPUT_SHAPES),
}


def test_the_measured_reproductions_keep_their_names() -> None:
    policy = dataclasses.replace(POLICY, max_growth_per_1k_jobs=1 * MB)
    k = JOBS / 1000
    for case, (memory, graphs, blocks, heap, shapes, census, cause) in MEASURED.items():

        def probes(i: int, g: float = graphs, b: float = blocks, h: float = heap,
                   s: float = shapes, c: tuple[tuple[str, int], ...] = census,
                   name: str = case) -> Probes:
            traced = (("one_step_on_data_distributed", 1),) if name == "keras_predict" \
                else BASE.traced  # as measured: Keras's predict step is traced once
            return dataclasses.replace(BASE, graphs=int(40 + g * k * i),
                                       py_blocks=int(300_000 + b * k * i),
                                       native_heap=int(500 * MB + h * k * i),
                                       shapes=int(3 + s * k * i), census=c, traced=traced)
        found, _, remedy = judge(series(memory * k, probes), policy)
        assert found is cause, case
        if case == "keras_predict":
            assert "model(x, training=False)" in remedy


def test_probes_read_less_often_than_memory_still_show_their_trend() -> None:
    """A worker paces its probe readings by their cost: one reading may stand in many
    samples of the window. Fitted as they are, a fast retracing leak would look flat."""
    readings = [dataclasses.replace(BASE, graphs=40 + 500 * r, native_heap=500 * MB)
                for r in range(20)]
    samples = [dataclasses.replace(s, probes=readings[i // 5]) for i, s in
               enumerate(series(2 * MB, None, n=100))]
    assert judge(samples)[0] is Cause.RETRACING
    stale = [dataclasses.replace(s, probes=BASE) for s in series(2 * MB, None)]
    assert judge(stale)[0] is Cause.UNKNOWN  # one reading: no trend, and no wrong cause


def test_readings_older_than_the_window_give_no_cause_rather_than_a_wrong_one() -> None:
    """Readings paced by their cost may all predate a fast leak's window: what they show
    (flat) is not what grows now."""
    early = [dataclasses.replace(BASE, jobs=j) for j in (100, 200, 300, 400, 500)]
    samples = [dataclasses.replace(s, probes=early[min(i, 4)])
               for i, s in enumerate(series(2 * MB, None))]
    assert judge(samples)[0] is Cause.UNKNOWN
    assert Probes.from_wire({"jobs": float("nan")}) == Probes()
    assert Probes.from_wire({"jobs": 2**80}) == Probes()


def test_buffers_kept_by_python_are_python_objects_not_native_heap() -> None:
    """Held-out reproductions: numpy arrays in an unbounded lru_cache, tf.Tensors appended to
    a list. Their bytes are the native heap's, so the heap explains the growth; but the
    census saw a container grow by about one item per job (numpy arrays are not tracked by
    the garbage collector; the dict that keeps them is), or the tensors themselves."""
    per_sample = dict(memory=3 * MB, py_blocks=700, native_heap=3 * MB)
    measured = [  # (census, containers): as the held-out workers showed them
        ((("dict", 1528), ("inspect.Signature", 384)), (("dict of numpy.ndarray", 640),)),
        ((("tensorflow.python.framework.ops.EagerTensor", 800),), ()),
    ]
    # What the census weighed them at (a 30 KiB buffer each, ~3 MB per 100 jobs), or
    # nothing: a worker older than census_bytes, judged by the counts as before.
    for census, containers in measured:
        for weighed in (640 * 30 * 1024 if containers else 800 * 30 * 1024, None):
            def probes(i: int, c: Any = census, h: Any = containers,
                       b: int | None = weighed) -> Probes:
                grown = grows(**{k: v for k, v in per_sample.items() if k != "memory"})(i)
                return dataclasses.replace(grown, census=c, containers=h, census_jobs=650,
                                           census_bytes=b)
            cause, summary, remedy = judge(series(per_sample["memory"], probes))
            assert cause is Cause.PYTHON_OBJECTS, (census, containers, weighed)
            assert "lru_cache needs a maxsize" in remedy
    cause, summary, _ = judge(series(3 * MB, lambda i: dataclasses.replace(
        grows(py_blocks=700, native_heap=3 * MB)(i), containers=(("dict of numpy.ndarray", 640),),
        census_jobs=650)))
    assert "dict of numpy.ndarray (+640 items over 650 jobs)" in summary
    # a native leak: no container grows with the jobs (a few items is warm-up, not a hoard)
    cause, _, remedy = judge(series(3 * MB, lambda i: dataclasses.replace(
        grows(py_blocks=150, native_heap=3 * MB)(i), containers=(("dict of str", 40),),
        census_jobs=650)))
    assert cause is Cause.NATIVE_HEAP and "C extension" in remedy


def test_tensorflow_objects_without_keras_predict_get_the_build_once_remedy() -> None:
    census = (("tensorflow.python.framework.ops.Operation", 30_000), ("dict", 9000))
    _, _, remedy = judge(series(2 * MB, lambda i: dataclasses.replace(
        grows(py_blocks=20_000)(i), census=census)))
    assert "build them once" in remedy and "predict() runs per request" not in remedy


def test_tensors_kept_in_a_list_are_not_blamed_on_graph_building() -> None:
    census = (("tensorflow.python.framework.ops.EagerTensor", 114), ("dict", 20))
    _, summary, remedy = judge(series(3 * MB, lambda i: dataclasses.replace(
        grows(py_blocks=700, native_heap=3 * MB)(i), census=census,
        containers=(("list of tensorflow.python.framework.ops.EagerTensor", 113),),
        census_jobs=113)))
    assert "list of tensorflow.python.framework.ops.EagerTensor (+113 items" in summary
    assert "build them once" not in remedy and "a list appended to" in remedy


def test_a_native_leak_that_keeps_one_int_per_job_is_native_heap_not_python_objects() -> None:
    """A ctypes malloc per job whose handler keeps each pointer, an int, in a list
    (bench/leak_handlers.py:native_leak with keep_pointers; bench/leak_scenarios.py
    "pointers"). The census sees the list grow by one item a job, but it weighs ~36 bytes a
    job (the int and its slot) against the kilobytes the native heap grows by: Python
    explains nothing worth naming, the native heap all of it. So even for a leak of 1 KiB a
    job, which the blocks alone (512 bytes each at most) could have been taken to cover."""
    policy = dataclasses.replace(POLICY, max_growth_per_1k_jobs=2 * MB)
    for per_job in (256 * 1024, 1024):
        def probes(i: int, n: int = per_job, weighed: int | None = 650 * 36) -> Probes:
            return dataclasses.replace(
                grows(py_blocks=150, native_heap=n * JOBS)(i),
                census=(("int", 650),), containers=(("list of int", 650),), census_jobs=650,
                census_bytes=weighed)
        samples = series(per_job * JOBS, probes)
        cause, summary, remedy = judge(samples, policy)
        assert cause is Cause.NATIVE_HEAP, (per_job, summary)
        assert "live native allocations" in summary and "C extension" in remedy
        facts = WorkerFacts(started_at=0.0, jobs=samples[-1].jobs, jitter=0.0)
        found = diagnose(samples, facts, policy, evaluate(samples, facts, policy, 79.0).assessment,
                         Reason.GROWTH_PER_1K_JOBS)
        assert found is not None
        split = found.evidence["growth_split"]
        assert split["memory"] == 1000 * per_job and split["python_objects"] == 36_000
        assert split["native_heap"] == 1000 * per_job - 36_000 and split["other"] == 0
        # a worker older than census_bytes is judged by counts, as before
        legacy = series(per_job * JOBS, lambda i: probes(i, weighed=None))
        assert judge(legacy, policy)[0] is Cause.PYTHON_OBJECTS


def test_the_split_adds_up_and_bounds_what_python_can_stand_for() -> None:
    """Per 1k jobs: memory = Python objects + native heap + other; small Python objects are
    pymalloc's, outside malloc, so they stand for no more than what the heap leaves."""
    t = Trends(jobs=1000, memory=10 * MB, py_blocks=20_000, native_heap=4 * MB,
               tf_allocator=1 * MB)
    held = Probes(census_bytes=2 * MB, census_jobs=1000)
    split = growth_split(t, held)
    assert split is not None
    assert split.python_objects == 20_000 * 512 * 0 + 6 * MB + 2 * MB  # bound: 10 - 4 MB
    assert split.native_heap == 2 * MB and split.other == 0 and split.tf_allocator == 1 * MB
    assert split.text("rss") == ("of +10.0MiB rss growth per 1k jobs: Python objects ~8.0MiB, "
                                 "native heap 2.0MiB, other 0B (TF allocator 1.0MiB, not in "
                                 "the sum)")
    few = growth_split(dataclasses.replace(t, py_blocks=1000), None)
    assert few is not None and few.python_objects == 1000 * 512
    assert few.other == 10 * MB - 4 * MB - 1000 * 512
    assert growth_split(dataclasses.replace(t, memory=0.0), held) is None
    assert Split.from_fields(split.fields()) == split


def test_values_no_sane_worker_sends_never_break_the_split_or_the_cause() -> None:
    """NaN and infinities (only a caller outside from_wire could pass them), negative and huge
    values, a census weighed over no jobs, or probes missing altogether."""
    nan, inf = float("nan"), float("inf")
    for memory in (nan, inf, -inf, -1.0, 1e300, 10 * MB):
        for other in (nan, inf, -inf, -5.0 * MB, 1e300, None, 0.0):
            t = Trends(jobs=1000, memory=memory, py_blocks=other, native_heap=other,
                       tf_allocator=other)
            for latest in (None, Probes(), Probes(census_bytes=2**53, census_jobs=1),
                           Probes(census_bytes=5, census_jobs=0),
                           Probes(census_bytes=-7, census_jobs=3)):
                split = growth_split(t, latest)
                if split is not None:
                    assert all(math.isfinite(v) for v in split.fields().values()), split
                    assert split.text()
                assert _cause(t, None, latest, split) in Cause
    for raw in (None, [], {}, {"memory": "x"}, {"memory": nan}, {"memory": True},
                {"memory": 1, "other": [1]}):
        assert Split.from_fields(raw) is None or \
            Split.from_fields(raw) == Split(1, None, None, None, None, None)


def test_keras_predict_per_job_is_python_objects_even_when_the_bytes_are_native() -> None:
    """What model.predict() per request leaves is Python objects (Keras's step, ops) that
    hold native memory no census can weigh: the native heap may grow by more than the RSS.
    The byte split alone named it native_heap (seen live, under load); the graphs Python
    keeps say who holds the bytes."""
    policy = dataclasses.replace(POLICY, max_growth_per_1k_jobs=2 * MB)

    def probes(i: int) -> Probes:
        return dataclasses.replace(
            grows(py_blocks=16_000, native_heap=2_800_000)(i),
            traced=(("one_step_on_data_distributed", 1),), census_bytes=0)

    cause, summary, remedy = judge(series(2_200_000, probes), policy)
    assert cause is Cause.PYTHON_OBJECTS, summary
    assert "model.predict()" in remedy


def test_child_processes_that_grow_are_named_not_blamed_on_the_heap() -> None:
    """A handler that starts a process every few jobs and never ends it: the memory (its
    tree) grows, the worker's own probes see none of it. It used to be put down to glibc
    keeping freed memory (MALLOC_ARENA_MAX), the wrong fix."""
    policy = dataclasses.replace(POLICY, max_growth_per_1k_jobs=2 * MB)
    per_sample = 3 * MB

    def leaky(i: int, n: int = 80, children: bool = True) -> list[Sample]:
        return [dataclasses.replace(s, children=int(per_sample * k) if children else None)
                for k, s in enumerate(series(per_sample, grows(native_heap=1000), n))]

    samples = leaky(0)
    cause, summary, remedy = judge(samples, policy)
    assert cause is Cause.CHILD_PROCESSES, summary
    assert "child processes grow" in summary and "end each one" in remedy
    facts = WorkerFacts(started_at=0.0, jobs=samples[-1].jobs, jitter=0.0)
    found = diagnose(samples, facts, policy, evaluate(samples, facts, policy, 79.0).assessment,
                     Reason.GROWTH_PER_1K_JOBS)
    assert found is not None and found.evidence["growth_split"]["child_processes"] == \
        found.evidence["growth_split"]["memory"]
    assert found.evidence["growth_split"]["other"] == 0  # the worker itself does not grow
    assert Split.from_fields(found.evidence["growth_split"]) is not None
    # the same growth in the worker process itself is still the heap's
    cause, summary, _ = judge(leaky(0, children=False), policy)
    assert cause is Cause.NATIVE_HEAP, summary


def test_a_few_graph_objects_leading_the_census_do_not_blame_python() -> None:
    """A native leak that keeps each pointer (an int, which the census cannot count) in a
    list: the types that lead its census are a few objects alive at one census and not the
    other. A TensorFlow type among them, +3 over 150 jobs, is no Python hoard (a busy CI
    run named `pointers` python_objects so); graph objects growing with the jobs are."""
    def pointers(census: tuple[tuple[str, int], ...]) -> Grow:
        return lambda i: dataclasses.replace(
            grows(py_blocks=3800 * JOBS / 1000, native_heap=250 * MB * JOBS / 1000)(i),
            census=census, containers=(("list of int", 150),), census_jobs=150,
            census_bytes=150 * 36)

    few = (("builtin_function_or_method", 44), ("weakref.ReferenceType", 42),
           ("tensorflow.python.framework.tensor_shape.TensorShape", 3))
    cause, _, _ = judge(series(250 * MB * JOBS / 1000, pointers(few)))
    assert cause is Cause.NATIVE_HEAP
    many = (("tensorflow.python.framework.ops.Operation", 600), *few[:2])
    cause, _, _ = judge(series(250 * MB * JOBS / 1000, pointers(many)))
    assert cause is Cause.PYTHON_OBJECTS
