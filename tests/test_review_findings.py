"""Review of the seedleak change (e59bdc0..HEAD): cases where the explained-warm-up rule, the
retracing cause and the new `explain` text misfire. Each test states what was expected; each
fails on the branch as reviewed (they are findings, not fixes). Pure: no TensorFlow."""

from __future__ import annotations

from typing import Any

from supervisor.cli.render import render_explain
from supervisor.config.keys import PolicyConfig
from supervisor.core.diagnosis import Cause, diagnose, trends
from supervisor.core.history import Sample
from supervisor.core.policy import Ruling, WorkerFacts, evaluate
from supervisor.core.reasons import Reason
from supervisor.daemon.control import _judged
from supervisor.shared.probes import Probes, ShapeGrowth
from tests.test_warmup_findings import (
    JOBS_PER_SECOND,
    LOADED,
    MB,
    PER_GRAPH,
    READY,
    TOP_SHAPES,
    graphs_at,
    judged,
)
from worker.readings import traced


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


# --- 1. A healthy model with a bounded set of shapes is named `retracing` -------------------

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
    """Expected: warm-up (TF's per-shape memory, what warm-up exists for), no finding, the
    baseline taken after warm-up. Got: warmup_explained, baseline at ready (400 MiB under
    what the model needs), cause `retracing`, and a remedy telling the operator to pad to
    allowed_batch_sizes, which is what the model already does."""
    verdict, found = judged(_bounded_shapes(20), PolicyConfig())
    assert not verdict.assessment.warmup_explained, verdict.assessment
    assert found is None, found and (found.cause, found.summary, found.remedy)


# --- 2. Growth that is not the tracing's, named `retracing` ---------------------------------

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
    """With readings every second the rule holds (not explained); every 10 s, the first
    interval holds both the 3 graphs and 50 MiB of the Python leak, so "half the growth came
    with graphs" and the leak is declared the tracing's: warm-up ended, cause `retracing`,
    remedy input_signature. Expected: not explained (3 MiB of 103 came with the graphs)."""
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
                          probes=Probes(graphs=10 + g, traced=(("restored_function_body:f", g + 1),),
                                        py_blocks=300_000, native_heap=400 * MB + extra,
                                        shapes=g + 1, jobs=JOBS_PER_SECOND * i,
                                        top_shapes=TOP_SHAPES)))
    return out


def test_a_trend_recycle_whose_window_traced_nothing_is_not_named_retracing() -> None:
    """Default policy. The worker is recycled for growth_per_hour at ~195 s; its trend
    window (the last 60 samples) traced no graph at all: the growth that recycled it is the
    native heap's. Expected: a cause other than retracing (native_heap here). Got:
    `retracing` with the input_signature remedy, because the tracing before the window
    (since_ready) still outweighs the new growth: any leak smaller than the retracing's
    plateau (~700 MiB here) is put down to graphs that stopped minutes ago."""
    samples, facts, verdict, found = _run(_seed_then_slow_leak(300), PolicyConfig())
    assert verdict.reason is Reason.GROWTH_PER_HOUR, verdict
    window = samples[-PolicyConfig().trend_window:]
    assert window[0].probes.graphs == window[-1].probes.graphs  # nothing traced in it
    assert found is not None and found.cause is not Cause.RETRACING, found.summary


# --- 3. The remedy names the wrong saved function ------------------------------------------

def test_traced_does_not_name_all_restored_traces_after_the_newest_one() -> None:
    """A SavedModel with two functions: `encode` retraced per length (400 traces), and
    `warm` traced once, last (e.g. by a periodic health check, or a new batch size). The
    worker names every restored_function_body trace after the newest one's saved function,
    so the evidence says `restored_function_body:warm x401` and the remedy says "re-export
    `warm`". Expected: `encode` named (or the two counted apart)."""
    names = {f"__inference_restored_function_body_{100 + i}" for i in range(400)}
    names.add("__inference_restored_function_body_9000")  # warm, traced last
    calls = {f"__inference_restored_function_body_{100 + i}": "encode" for i in range(400)}
    calls["__inference_restored_function_body_9000"] = "warm"
    top = traced(names, calls.get)[0]
    assert top[0] == "restored_function_body:encode", top


# --- 4. `explain` contradicts itself ------------------------------------------------------

def _linear(seconds: int, per_job: int) -> list[Sample]:
    return [Sample(t=float(i), jobs=JOBS_PER_SECOND * i, memory=LOADED + per_job * JOBS_PER_SECOND * i)
            for i in range(seconds + 1)]


def _explain_text(samples: list[Sample], policy: PolicyConfig, facts: WorkerFacts,
                  now: float) -> tuple[str, Any]:
    verdict = evaluate(samples, facts, policy, now)
    a = verdict.assessment
    found = diagnose(samples, facts, policy, a, verdict.reason)
    report = {"model": "m", "memory_metric": "rss", "workers": [{
        "id": "m-1", "slot": 0, "state": "ready", "jobs": samples[-1].jobs, "memory": a.memory,
        "baseline": a.baseline, "trends": trends(samples, facts, policy).fields(),
        "warmed_up": a.warmed_up, "so_far": None, "judged": _judged(a, policy),
        "growth_split": None, "probes": None, "diagnosis": found and found.fields()}]}
    return render_explain(report), verdict


def test_explain_does_not_say_under_a_quarter_of_limits_that_are_off() -> None:
    """Trend limits off (max_growth_per_1k_jobs and max_growth_per_hour null): a worker
    growing 1 GiB per 1k jobs is not suspect (nothing to compare with), and explain says
    "its memory grows +1.0GiB per 1k jobs ..., under a quarter of its limits" with no
    limit to be under."""
    policy = PolicyConfig(warmup_jobs=0, warmup_seconds=0, max_growth_per_1k_jobs=None,
                          max_growth_per_hour=None)
    samples = _linear(80, 1024**3 // 1000)
    text, _ = _explain_text(samples, policy, WorkerFacts(started_at=-5.0, jobs=samples[-1].jobs,
                                                           jitter=0.0, ready_at=0.0), 80.0)
    assert "under a quarter of its limits" not in text, text


def test_explain_does_not_say_under_a_quarter_when_a_non_memory_recycle_hides_the_growth() -> None:
    """A worker growing 90 MiB per 1k jobs (90 % of max_growth_per_1k_jobs) whose verdict
    is max_age: suspect() returns reason.memory (False) before looking at its growth, so it
    has no diagnosis and explain prints "grows +90.0MiB per 1k jobs ..., under a quarter of
    its limits (max_growth_per_1k_jobs 100.0MiB, ...)"."""
    policy = PolicyConfig(warmup_jobs=0, warmup_seconds=0, max_age=60.0)
    samples = _linear(80, 90 * MB // 1000)
    text, verdict = _explain_text(samples, policy, WorkerFacts(
        started_at=-5.0, jobs=samples[-1].jobs, jitter=0.0, ready_at=0.0), 80.0)
    assert verdict.reason is Reason.MAX_AGE, verdict
    assert "under a quarter of its limits" not in text, text


def test_explain_does_not_say_in_warm_up_of_a_worker_past_its_warm_up() -> None:
    """Past warm-up (warmed_up true) with fewer than 6 samples after it: the probes are
    fitted since ready and explain labels the line "since ready, in warm-up" under a
    worker whose status says warmed up."""
    samples = _linear(34, MB // 1000)  # warm-up 30 s: 4 samples after it
    policy = PolicyConfig()
    text, verdict = _explain_text(samples, policy, WorkerFacts(
        started_at=-5.0, jobs=samples[-1].jobs, jitter=0.0, ready_at=0.0), 34.0)
    assert verdict.assessment.warmed_up
    assert "in warm-up" not in text, text


# --- 5. Untrusted worker text reaches the operator's terminal raw --------------------------

def test_a_worker_cannot_write_terminal_control_characters_into_explain() -> None:
    """A broken or hostile worker's traced name (any str up to 200 chars) is printed as is
    by `explain` and `status` (NOTE), and now also inside the remedy: an ESC sequence or a
    newline forges output. Pre-existing for `traced most:`, extended by this change."""
    name = "restored_function_body:f\x1b[2J\nseed-9 (slot 0, ready) no suspected cause"
    samples = [Sample(s.t, s.jobs, s.memory, probes=Probes(
        graphs=s.probes.graphs, traced=((name, 400),), shapes=400, jobs=s.jobs,
        top_shapes=TOP_SHAPES)) for s in _seed_then_slow_leak(20)]
    _, found = judged(samples, PolicyConfig())
    assert found is not None
    assert "\x1b" not in found.remedy and "\n" not in found.remedy, repr(found.remedy)
