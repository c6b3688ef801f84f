"""`explain` end to end against the socket-free core: a worker whose memory and probes grow,
its heartbeats, the controller's report, and the text the CLI prints. The live counterpart
(real workers, real leaks) is test_diagnosis_live.py."""

from __future__ import annotations

from typing import Any

from supervisor.cli.render import render_explain
from supervisor.config.keys import PolicyConfig
from supervisor.core.diagnosis import diagnose, trends
from supervisor.core.history import Sample
from supervisor.core.policy import WorkerFacts, evaluate
from supervisor.core.reasons import Reason
from supervisor.daemon.control import Controller, _judged
from supervisor.shared.probes import Probes, ShapeGrowth
from supervisor.shared.protocol import HEARTBEAT, Message, encode, signed
from tests.test_core_cases import World
from tests.test_core_model import secret, valid

CONFIG = """
supervisor:
  runtime_dir: /tmp/tfs-explain
models:
  a:
    handler: "mod:a"
    workers: 1
    batching: {max_batch_size: 1}
    policy: {warmup_jobs: 0, warmup_seconds: 0, trend_window: 20, trend_confirmations: 50,
             max_growth_per_1k_jobs: 1MiB}
"""
MB = 1024**2


def heartbeat(w: World, worker_id: str, probes: Probes) -> None:
    header = {"worker": worker_id, "probes": probes.to_wire()}
    w.core.worker_message(worker_id.encode(), encode(signed(
        Message(HEARTBEAT, b"", header), secret(worker_id))), w.now)
    w.run()


def explain(w: World, model: Any) -> dict[str, Any]:
    return Controller(w.core, lambda: {}, lambda: True, lambda: True).explain(model)


def grow(w: World, steps: int, pointers: bool = False) -> None:
    """Each step: 10 jobs, 3 MiB more memory (300 MiB per 1k jobs), a cache holding one more
    numpy array per job, and a heartbeat with the probes read after those jobs. With
    ``pointers``, the same memory is malloc'd by native code and the list that grows holds
    each pointer, an int (36 bytes a job as the census weighs it)."""
    held, per_item = ("list of int", 36) if pointers else ("dict of numpy.ndarray", 3 * MB // 10)
    for step in range(1, steps + 1):
        for _ in range(10):
            w.request(valid("a", 1))
            w.answer("a-1")
        w.memory["a-1"] += 3 * MB
        heartbeat(w, "a-1", Probes(
            graphs=12, traced=(("serve", 1),), py_blocks=300_000 + 70 * step,
            native_heap=500 * MB + 3 * MB * step, shapes=1,
            top_shapes=(ShapeGrowth("x:float32[1,2]", 10 * step, 4096, 3 * MB * step),),
            containers=((held, 10 * step),), census_jobs=10 * step,
            census_bytes=10 * step * per_item, cost_seconds=1e-5 * step, jobs=10 * step))
        w.tick(1.0)
        w.poll()


def test_explain_names_the_cause_with_its_evidence_and_prints_it() -> None:
    w = World(CONFIG)
    w.memory["a-1"] = 600 * MB
    w.ready("a-1")
    grow(w, 30)
    report = explain(w, "a")
    assert report["ok"], report
    [worker] = report["result"]["workers"]
    assert worker["diagnosis"]["cause"] == "python_objects", worker["diagnosis"]
    assert worker["trends"]["probe_readings"] >= 20
    assert worker["probe_cost_per_job"] > 0
    text = render_explain(report["result"])
    assert "suspected cause: python_objects" in text
    assert "containers growing (over 300 jobs): dict of numpy.ndarray +300 items" in text
    assert "lru_cache needs a maxsize" in text
    assert "input shapes that grew it most: x:float32[1,2]" in text
    # the bytes are the native heap's, and the census weighed the arrays that hold them
    assert worker["diagnosis"]["evidence"]["growth_split"] == worker["growth_split"]
    assert "of +300.0MiB rss growth per 1k jobs: Python objects ~300.0MiB, native heap 800B, " \
        "other 0B" in text, text


def test_explain_shows_a_native_leak_whose_pointers_python_keeps_as_native() -> None:
    """The list of pointers grows one item a job, but its bytes are nothing beside the
    native heap's: the split says so, and the cause is the native heap."""
    w = World(CONFIG)
    w.memory["a-1"] = 600 * MB
    w.ready("a-1")
    grow(w, 30, pointers=True)
    [worker] = explain(w, "a")["result"]["workers"]
    assert worker["diagnosis"]["cause"] == "native_heap", worker["diagnosis"]
    split = worker["growth_split"]
    assert split["python_objects"] == 36 * 1000 and split["other"] == 0, split
    assert split["native_heap"] == 300 * MB - 36 * 1000, split
    text = render_explain(explain(w, "a")["result"])
    assert "of +300.0MiB rss growth per 1k jobs: Python objects ~35.2KiB, native heap " \
        "300.0MiB, other 0B" in text, text
    assert "C extension" in text


def test_explain_refuses_what_is_not_a_model_name() -> None:
    w = World(CONFIG)
    for model in ("nosuch", None, ["a"], {"a": 1}, "x" * 10_000):
        report = explain(w, model)
        assert not report["ok"] and "no model named" in report["error"]
        assert len(report["error"]) < 200


def test_a_flat_worker_has_no_suspected_cause_in_explain() -> None:
    w = World(CONFIG)
    w.memory["a-1"] = 600 * MB
    w.ready("a-1")
    for step in range(1, 26):
        for _ in range(10):
            w.request(valid("a", 1))
            w.answer("a-1")
        heartbeat(w, "a-1", Probes(graphs=12, py_blocks=300_000, jobs=10 * step))
        w.tick(1.0)
        w.poll()
    report = explain(w, "a")["result"]
    assert report["workers"][0]["diagnosis"] is None
    assert report["workers"][0]["growth_split"] is None  # nothing grows: nothing to split
    assert "no suspected cause" in render_explain(report)
    assert "growth per 1k jobs:" not in render_explain(report)


def test_an_idle_worker_has_no_per_job_trend_in_explain() -> None:
    w = World(CONFIG)
    w.memory["a-1"] = 600 * MB
    w.ready("a-1")
    grow(w, 5)
    for _ in range(30):  # the load stops; heartbeats and polls go on
        heartbeat(w, "a-1", Probes(graphs=12, py_blocks=300_000, jobs=50))
        w.tick(1.0)
        w.poll()
    text = render_explain(explain(w, "a")["result"])
    assert "trends: no jobs over the last 20 samples" in text, text
    assert "per 1k jobs" not in text


# --- `explain` says what the judged figures say about the limits ----------------------------

def _linear(seconds: int, per_job: int, jobs_per_second: int = 160) -> list[Sample]:
    """One sample a second from ready, memory growing ``per_job`` bytes a job."""
    return [Sample(t=float(i), jobs=jobs_per_second * i,
                   memory=560 * MB + per_job * jobs_per_second * i) for i in range(seconds + 1)]


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
    """Guards render._against_limits: with both trend limits off (max_growth_per_1k_jobs
    and max_growth_per_hour null) a worker growing 1 GiB per 1k jobs is not suspect, and
    there is no limit to be "under a quarter of"."""
    policy = PolicyConfig(warmup_jobs=0, warmup_seconds=0, max_growth_per_1k_jobs=None,
                          max_growth_per_hour=None)
    samples = _linear(80, 1024**3 // 1000)
    text, _ = _explain_text(samples, policy, WorkerFacts(started_at=-5.0, jobs=samples[-1].jobs,
                                                           jitter=0.0, ready_at=0.0), 80.0)
    assert "under a quarter of its limits" not in text, text


def test_explain_does_not_say_under_a_quarter_when_a_non_memory_recycle_hides_the_growth() -> None:
    """Guards diagnosis.suspect: a worker growing 90 MiB per 1k jobs (90 % of
    max_growth_per_1k_jobs) whose verdict is max_age is still suspect for its growth; a
    non-memory recycle once hid it, and explain said "under a quarter of its limits"."""
    policy = PolicyConfig(warmup_jobs=0, warmup_seconds=0, max_age=60.0)
    samples = _linear(80, 90 * MB // 1000)
    text, verdict = _explain_text(samples, policy, WorkerFacts(
        started_at=-5.0, jobs=samples[-1].jobs, jitter=0.0, ready_at=0.0), 80.0)
    assert verdict.reason is Reason.MAX_AGE, verdict
    assert "under a quarter of its limits" not in text, text


def test_explain_does_not_say_in_warm_up_of_a_worker_past_its_warm_up() -> None:
    """Guards Trends.since_ready vs warming_up: past warm-up (warmed_up true) with fewer
    than 6 samples after it, the probes are fitted since ready, and the line says so
    without calling a warmed-up worker "in warm-up"."""
    samples = _linear(34, MB // 1000)  # warm-up 30 s: 4 samples after it
    policy = PolicyConfig()
    text, verdict = _explain_text(samples, policy, WorkerFacts(
        started_at=-5.0, jobs=samples[-1].jobs, jitter=0.0, ready_at=0.0), 34.0)
    assert verdict.assessment.warmed_up
    assert "in warm-up" not in text, text
