"""The seed's leak, on synthetic series shaped as measured (issue 46, item 3): a SavedModel's
function without input_signature, traced per token length, grows a worker inside its
warm-up. That growth is a finding (baseline at the pre-growth level, cause named), a recycle
names its cause from the evidence it has whenever it happens, `explain` does not contradict
itself, and the remedy names the user's function."""

from __future__ import annotations

import math

import structlog

from supervisor.cli.render import render_explain
from supervisor.config.keys import PolicyConfig
from supervisor.core.diagnosis import Cause, Diagnosis, diagnose
from supervisor.core.history import Sample
from supervisor.core.policy import Ruling, Verdict, WorkerFacts, evaluate
from supervisor.core.reasons import Reason
from supervisor.shared.probes import Probes, ShapeGrowth
from tests.test_core_cases import BASE, World
from tests.test_core_model import valid
from tests.test_explain import heartbeat
from worker.readings import SavedNames, traced

MB = 1024**2
LOADED = 560 * MB  # a worker's memory at ready
PER_GRAPH = int(1.8 * MB)  # measured: ~450 MiB for ~250 lengths on the bench's encoder
JOBS_PER_SECOND = 160
READY = 0.0
# What the worker reports for the seed: the lengths that grew it most (~2 MiB on first sight).
TOP_SHAPES = (ShapeGrowth("input_ids:int32[1,225]", 30, 2 * MB, 10 * MB),
              ShapeGrowth("input_ids:int32[1,219]", 33, 2 * MB, 8 * MB))
FACTS = WorkerFacts(started_at=-5.0, jobs=0, jitter=0.0, ready_at=READY)


def graphs_at(t: float, lengths: int = 400, pace: float = 8.0) -> int:
    """New lengths seen by t seconds, jobs of random lengths 1..400 (decaying, as coupons)."""
    return int(lengths * (1 - math.exp(-t / pace)))


def seed_series(seconds: int, native_per_second: int = 0) -> list[Sample]:
    """One sample a second from ready; each new length a graph of ``restored_function_body``
    calling the saved ``f``, and ~1.8 MiB with it; ``native_per_second``: growth the graphs
    do not explain, with the native heap's."""
    out = []
    for i in range(seconds + 1):
        graphs = graphs_at(i)
        probes = Probes(graphs=10 + graphs, traced=(("restored_function_body:f", graphs + 1),),
                        py_blocks=300_000, native_heap=400 * MB + native_per_second * i,
                        shapes=graphs + 1, jobs=JOBS_PER_SECOND * i, top_shapes=TOP_SHAPES)
        out.append(Sample(t=READY + i, jobs=JOBS_PER_SECOND * i,
                          memory=LOADED + graphs * PER_GRAPH + native_per_second * i,
                          probes=probes))
    return out


def judged(samples: list[Sample], policy: PolicyConfig) -> tuple[Verdict, Diagnosis | None]:
    facts = WorkerFacts(started_at=FACTS.started_at, jobs=samples[-1].jobs, jitter=0.0,
                        ready_at=READY)
    verdict = evaluate(samples, facts, policy, samples[-1].t)
    return verdict, diagnose(samples, facts, policy, verdict.assessment, verdict.reason,
                             samples[0].probes)


def test_growth_in_warm_up_that_tracing_explains_is_a_finding_not_the_baseline() -> None:
    """Default policy, 20 s after ready (its 30 s warm-up not passed): the baseline is the
    level before the growth, the cause is named, and the remedy points at `f` and at
    padding. On the branch point: no baseline until 30 s (then at ~1.2 GiB), no cause."""
    samples = seed_series(20)
    verdict, found = judged(samples, PolicyConfig())
    a = verdict.assessment
    assert a.warmup_explained and a.baseline == LOADED, a
    assert samples[-1].memory - LOADED > 600 * MB
    assert found is not None and found.cause is Cause.RETRACING, found
    summary, remedy = found.summary, found.remedy
    assert "`f`" in summary and "restored_function_body" in summary, summary
    assert "`f`" in remedy and "input_signature" in remedy and "None" in remedy, remedy
    assert "padding:" in remedy, remedy
    assert found.evidence["since_ready"]["graphs"] > 300, found.evidence


def test_a_recycle_in_warm_up_names_retracing_not_unknown() -> None:
    """max_memory crossed 12 s after ready, its warm-up not passed: the event's cause is the
    tracing the worker reported (the branch point said `unknown`)."""
    samples = seed_series(12)
    policy = PolicyConfig(max_memory=900 * MB)
    verdict, found = judged(samples, policy)
    assert verdict.reason is Reason.MAX_MEMORY and verdict.ruling is Ruling.RECYCLE
    assert found is not None and found.cause is Cause.RETRACING, found


def test_retracing_since_ready_is_not_put_down_to_the_native_heap() -> None:
    """After the lengths are all seen, a window that traced no new graph while memory still
    grew a little with the native heap: the growth since ready is the graphs' (the branch
    point named native heap retention and MALLOC_ARENA_MAX with 400 traced)."""
    samples = seed_series(150, native_per_second=MB // 4)
    policy = PolicyConfig(max_memory=LOADED + 700 * MB)
    verdict, found = judged(samples, policy)
    assert verdict.reason is Reason.MAX_MEMORY, verdict
    assert found is not None and found.cause is Cause.RETRACING, found
    assert "MALLOC_ARENA_MAX" not in found.remedy


def test_growth_in_warm_up_without_tracing_is_still_warm_up() -> None:
    """A healthy model's warm-up (new shapes, no new graphs: TF's per-shape allocations) is
    not judged, and its baseline is taken after warm-up as before."""
    samples = [Sample(t=READY + i, jobs=JOBS_PER_SECOND * i,
                      memory=LOADED + graphs_at(i) * PER_GRAPH // 4,
                      probes=Probes(graphs=12, py_blocks=300_000, shapes=graphs_at(i) + 1,
                                    jobs=JOBS_PER_SECOND * i)) for i in range(21)]
    verdict, found = judged(samples, PolicyConfig())
    a = verdict.assessment
    assert not a.warmup_explained and a.baseline is None and not a.warmed_up, a
    assert found is None


def test_a_few_graphs_traced_in_warm_up_are_warm_up() -> None:
    """A tf.function called with a few batch sizes traces a few graphs: under
    EXPLAINED_BYTES of growth, that is what warm-up is for."""
    samples = [Sample(t=READY + i, jobs=JOBS_PER_SECOND * i,
                      memory=LOADED + min(i, 8) * 2 * MB,
                      probes=Probes(graphs=12 + min(i, 8), jobs=JOBS_PER_SECOND * i))
               for i in range(21)]
    verdict, _ = judged(samples, PolicyConfig())
    assert not verdict.assessment.warmup_explained


def test_the_remedy_without_the_saved_name_still_points_at_the_loaded_function() -> None:
    """A worker that could not tell which saved function (bare restored_function_body)."""
    samples = [Sample(s.t, s.jobs, s.memory, probes=Probes(
        graphs=s.probes.graphs, traced=(("restored_function_body", 9),), shapes=400,
        jobs=s.jobs) if s.probes else None) for s in seed_series(20)]
    _, found = judged(samples, PolicyConfig())
    assert found is not None and "SavedModel function the handler calls" in found.remedy, \
        found
    assert "restored_function_body` " not in found.remedy


def test_traced_names_a_restored_function_after_the_saved_function_it_calls() -> None:
    names = {"__inference_f_281", "__inference_restored_function_body_364",
             "__inference_restored_function_body_1398", "__inference_restored_function_body_381",
             "__inference__traced_save_318", "__wrapped__NoOp_device_CPU"}
    asked: list[str] = []

    def resolve(name: str) -> str | None:
        asked.append(name)
        return "f"

    assert traced(names, resolve)[0] == ("restored_function_body:f", 3)
    assert sorted(asked) == sorted(n for n in names if "restored" in n)  # each on its own
    assert dict(traced(names, lambda name: None))["restored_function_body"] == 3
    assert dict(traced(names))["restored_function_body"] == 3


def _report(judged_fields: dict[str, object], warmed_up: bool = True) -> dict[str, object]:
    trends = {"window_jobs": 1200, "window_samples": 8, "probe_readings": 8,
              "memory_per_1k_jobs": 1.3 * 1024**3, "graphs_per_1k_jobs": 727.0}
    return {"model": "seed", "memory_metric": "rss", "workers": [{
        "id": "seed-1", "slot": 0, "state": "ready", "jobs": 4000, "memory": 1300 * MB,
        "baseline": None, "trends": trends, "warmed_up": warmed_up, "judged": judged_fields,
        "so_far": {"memory": 730 * MB, "jobs": 4000}, "growth_split": None,
        "probes": None, "diagnosis": None}]}


def test_explain_never_says_noise_above_a_large_growth() -> None:
    """Warmed up, the policy's window not yet full, the probes' shorter fit +1.3 GiB per 1k
    jobs: the branch point printed "not growing beyond noise" right above it."""
    text = render_explain(_report({"window": 0, "window_needed": 60}))
    assert "noise" not in text, text
    assert "not judged yet: the policy's trend window is not full (it needs 60 samples" \
        in text and "+730.0MiB over 4,000 jobs" in text, text
    judged_text = render_explain(_report({
        "window": 60, "window_needed": 60, "growth_per_1k_jobs": 2 * MB,
        "growth_per_hour": 10 * MB, "max_growth_per_1k_jobs": 100 * MB,
        "max_growth_per_hour": 1024**3}))
    assert "judged over 60 samples, its memory grows +2.0MiB per 1k jobs and +10.0MiB per " \
        "hour, under a quarter of its limits" in judged_text, judged_text


def test_the_finding_is_logged_once_per_worker() -> None:
    """Through the core: a worker whose warm-up growth is its tracing logs
    worker_growth_in_warmup once, with the cause and remedy, and is not recycled for it."""
    world = World(BASE.replace("warmup_jobs: 0, warmup_seconds: 0",
                               "warmup_jobs: 100, warmup_seconds: 30"))
    world.memory["a-1"] = LOADED
    world.ready("a-1")
    with structlog.testing.capture_logs() as logged:
        for i in range(1, 21):
            for _ in range(10):
                world.request(valid("a", 1))
                world.answer("a-1")
            graphs = graphs_at(i)
            heartbeat(world, "a-1", Probes(graphs=10 + graphs, shapes=graphs + 1,
                                           traced=(("restored_function_body:f", graphs),),
                                           jobs=10 * i))
            world.memory["a-1"] = LOADED + graphs * PER_GRAPH
            world.tick(1.0)
            world.poll()
    found = [e for e in logged if e["event"] == "worker_growth_in_warmup"]
    assert len(found) == 1 and found[0]["cause"] == "retracing", found
    assert found[0]["baseline"] <= LOADED + PER_GRAPH * graphs_at(1), found
    assert "`f`" in found[0]["remedy"]
    assert not [e for e in logged if e["event"] == "worker_recycling"]


def test_padding_is_advised_where_lengths_vary_and_batch_sizes_where_only_they_do() -> None:
    def remedy(signatures: tuple[str, ...]) -> str:
        samples = [Sample(s.t, s.jobs, s.memory, probes=Probes(
            graphs=s.probes.graphs, traced=(("step", 9),), shapes=400, jobs=s.jobs,
            top_shapes=tuple(ShapeGrowth(sig, 3, MB, 2 * MB) for sig in signatures))
            if s.probes else None) for s in seed_series(20)]
        _, found = judged(samples, PolicyConfig())
        assert found is not None and found.cause is Cause.RETRACING, found
        return found.remedy

    assert "padding:" in remedy(("input_ids:int32[1,225]", "input_ids:int32[1,219]"))
    batches = remedy(("x:float32[3,32]", "x:float32[5,32]"))
    assert "padding:" not in batches and "allowed_batch_sizes" in batches, batches


def test_graphs_within_the_models_configured_shapes_are_warm_up() -> None:
    """A tf.function without input_signature served at 8 batch sizes times 8 padding sizes
    (ModelConfig.input_shapes 64) traces up to 64 graphs after a one-shape warm-up, each
    with its per-shape memory: the same series is warm-up with that bound, retracing
    without one (WorkerFacts.shapes 0: MIN_NEW_GRAPHS alone)."""
    samples = [Sample(t=READY + i, jobs=JOBS_PER_SECOND * i,
                      memory=LOADED + min(3 * i, 60) * 4 * MB,
                      probes=Probes(graphs=10 + min(3 * i, 60), jobs=JOBS_PER_SECOND * i))
               for i in range(21)]
    policy = PolicyConfig()
    bounded = WorkerFacts(started_at=-5.0, jobs=samples[-1].jobs, jitter=0.0, ready_at=READY,
                          shapes=64)
    assert not evaluate(samples, bounded, policy, 20.0).assessment.warmup_explained
    unknown = WorkerFacts(started_at=-5.0, jobs=samples[-1].jobs, jitter=0.0, ready_at=READY)
    assert evaluate(samples, unknown, policy, 20.0).assessment.warmup_explained


def test_saved_names_asks_tensorflow_once_per_trace_and_remembers_a_bounded_number() -> None:
    """Each restored trace is resolved on its own (traced()), so the worker remembers what
    each calls: asked once per trace, not at every reading; past MAX_RESOLVED, not asked."""
    from worker import readings

    asked: list[str] = []

    def ask(name: str) -> str | None:
        asked.append(name)
        return "encode"

    names = SavedNames(ask)
    assert names("__inference_restored_function_body_1") == "encode"
    assert names("__inference_restored_function_body_1") == "encode"
    assert asked == ["__inference_restored_function_body_1"]
    names.known.update({f"x{i}": None for i in range(readings.MAX_RESOLVED)})
    assert names("__inference_restored_function_body_2") is None
    assert len(asked) == 1


def _run(samples: list[Sample], policy: PolicyConfig):
    """Poll by poll, carrying what the pool carries (baseline, streak, warmup_explained),
    until the first verdict that is not KEEP: (samples so far, facts, verdict, diagnosis)."""
    explained, baseline, streak = False, None, 0
    for k in range(2, len(samples) + 1):
        now = samples[:k]
        facts = WorkerFacts(started_at=-5.0, jobs=now[-1].jobs, jitter=0.0,
                            trend_streak=streak, ready_at=READY, baseline=baseline,
                            warmup_explained=explained)
        verdict = evaluate(now, facts, policy, now[-1].t)
        a = verdict.assessment
        explained, baseline, streak = a.warmup_explained, a.baseline, verdict.trend_streak
        if verdict.ruling is not Ruling.KEEP:
            return now, facts, verdict, diagnose(now, facts, policy, a, verdict.reason,
                                                 samples[0].probes)
    raise AssertionError("never recycled")


# --- A bounded set of shapes traced once each is warm-up ----------------------------------

def _bounded_shapes(seconds: int, sizes: tuple[int, ...] = (2, 4, 8, 16),
                    per_shape: int = 100 * MB) -> list[Sample]:
    """A tf.function served at allowed_batch_sizes [1, 2, 4, 8, 16] with the default
    warmup_batch_sizes [1]: each other batch size traces one graph on its first call after
    ready, and TF takes its per-shape memory then (docs/batching.md: "that encoder added
    430 MiB after a one-shape warm-up"). Then flat: a bounded set, exactly what the
    retracing remedy asks for ("pad inputs to fixed sizes ... so it traces once per size")."""
    out = []
    for i in range(seconds + 1):
        n = min(i, len(sizes))
        out.append(Sample(t=READY + i, jobs=JOBS_PER_SECOND * i, memory=LOADED + n * per_shape,
                          probes=Probes(graphs=10 + n, traced=(("serve", n + 1),), shapes=n + 1,
                                        jobs=JOBS_PER_SECOND * i, top_shapes=tuple(
                                            ShapeGrowth(f"x:float32[{b},512]", 5, per_shape,
                                                        per_shape) for b in sizes[:n][:3]))))
    return out


def test_a_bounded_set_of_batch_sizes_traced_once_each_is_warm_up_not_retracing() -> None:
    """Guards the explained warm-up's bound (policy.py MIN_NEW_GRAPHS, GRAPHS_PER_SHAPE):
    TF's per-shape memory taken after ready is warm-up, what warm-up exists for: no finding,
    the baseline taken after warm-up. Named `retracing`, the baseline was 400 MiB under what
    the model needs and the remedy asked for the allowed_batch_sizes it already had."""
    verdict, found = judged(_bounded_shapes(20), PolicyConfig())
    assert not verdict.assessment.warmup_explained, verdict.assessment
    assert found is None, found and (found.cause, found.summary, found.remedy)


# --- Growth that is not the tracing's is not named `retracing` ----------------------------

def _python_leak_with_a_few_graphs(seconds: int, every: int) -> list[Sample]:
    """A Python-object leak (5 MiB/s, py_blocks growing) in a model that traces 3 graphs of
    1 MiB in its first 3 s (3 batch sizes); the worker's readings arrive every ``every``
    seconds (heartbeat_interval, or a long batch between samples)."""
    out, latest = [], None
    for i in range(seconds + 1):
        n = min(i, 3)
        if i % every == 0:
            latest = Probes(graphs=10 + n, traced=(("serve", n + 1),),
                            py_blocks=300_000 + 3_000 * i, shapes=n + 1,
                            jobs=JOBS_PER_SECOND * i, census=(("dict", 10 * i),))
        out.append(Sample(t=READY + i, jobs=JOBS_PER_SECOND * i,
                          memory=LOADED + 5 * MB * i + n * MB, probes=latest))
    return out


def test_a_python_leak_with_sparse_readings_is_not_put_down_to_three_graphs() -> None:
    """Guards the explained warm-up against readings far apart (MIN_RISES, and the graphs'
    bound): with readings every 10 s the first interval holds both the 3 graphs and 50 MiB
    of the Python leak, which "half the growth came with graphs" once put down to the
    tracing (cause `retracing`, remedy input_signature). 3 MiB of 103 came with them."""
    assert not judged(_python_leak_with_a_few_graphs(20, every=1),
                      PolicyConfig())[0].assessment.warmup_explained
    verdict, found = judged(_python_leak_with_a_few_graphs(20, every=10), PolicyConfig())
    assert not verdict.assessment.warmup_explained, verdict.assessment
    assert found is None or found.cause is not Cause.RETRACING, found.summary


def _seed_then_slow_leak(seconds: int, start: int = 150) -> list[Sample]:
    """The seed's retracing (all 400 lengths traced in the first minute), then from
    ``start`` a steady leak of 1 MiB/s that no graph comes with (3.5 GiB per hour)."""
    out = []
    for i in range(seconds + 1):
        g, extra = graphs_at(i), max(0, i - start) * MB
        out.append(Sample(t=READY + i, jobs=JOBS_PER_SECOND * i,
                          memory=LOADED + g * PER_GRAPH + extra,
                          probes=Probes(graphs=10 + g,
                                        traced=(("restored_function_body:f", g + 1),),
                                        py_blocks=300_000, native_heap=400 * MB + extra,
                                        shapes=g + 1, jobs=JOBS_PER_SECOND * i,
                                        top_shapes=TOP_SHAPES)))
    return out


def test_a_trend_recycle_whose_window_traced_nothing_is_not_named_retracing() -> None:
    """Guards the scope of the since-ready retracing rule (diagnosis.py
    _since_ready_judged). Default policy: recycled for growth_per_hour at ~195 s, its
    trend window (the last 60 samples) traced no graph: the growth that recycled it is the
    native heap's. Weighed since ready, the tracing before the window outweighed it, and
    any leak smaller than the retracing's plateau (~700 MiB) was put down to graphs that
    stopped minutes before."""
    samples, _, verdict, found = _run(_seed_then_slow_leak(300), PolicyConfig())
    assert verdict.reason is Reason.GROWTH_PER_HOUR, verdict
    window = samples[-PolicyConfig().trend_window:]
    assert window[0].probes.graphs == window[-1].probes.graphs  # nothing traced in it
    assert found is not None and found.cause is not Cause.RETRACING, found.summary


# --- The remedy names the saved function that was retraced -------------------------------

def test_traced_does_not_name_all_restored_traces_after_the_newest_one() -> None:
    """Guards per-trace naming (worker/readings.py traced): a SavedModel with `encode`
    retraced per length (400 traces) and `warm` traced once, last (a periodic health check,
    a new batch size). Named after the newest trace's function, the evidence said
    `restored_function_body:warm x401` and the remedy "re-export `warm`"."""
    names = {f"__inference_restored_function_body_{100 + i}" for i in range(400)}
    names.add("__inference_restored_function_body_9000")  # warm, traced last
    calls = {f"__inference_restored_function_body_{100 + i}": "encode" for i in range(400)}
    calls["__inference_restored_function_body_9000"] = "warm"
    top = traced(names, calls.get)[0]
    assert top[0] == "restored_function_body:encode", top


# --- A worker's text reaches the operator's terminal printable ----------------------------

def test_a_worker_cannot_write_terminal_control_characters_into_explain() -> None:
    """Guards Probes' printable names (supervisor/shared/probes.py): a broken or hostile
    worker's traced name (any str up to 200 chars) reaches `explain`, `status` (NOTE), the
    logs and the remedy; an ESC sequence or a newline there would forge output."""
    name = "restored_function_body:f\x1b[2J\nseed-9 (slot 0, ready) no suspected cause"
    samples = [Sample(s.t, s.jobs, s.memory, probes=Probes(
        graphs=s.probes.graphs, traced=((name, 400),), shapes=400, jobs=s.jobs,
        top_shapes=TOP_SHAPES)) for s in _seed_then_slow_leak(20)]
    _, found = judged(samples, PolicyConfig())
    assert found is not None
    assert "\x1b" not in found.remedy and "\n" not in found.remedy, repr(found.remedy)
