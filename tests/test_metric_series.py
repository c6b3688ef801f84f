"""Metric series that do not churn: workers labelled by a stable slot and their role in it,
exits counted by cause, held-back recycles, and an exposition that stays bounded across
recycles and lint-clean. Against the socket-free core (no processes); the live counterpart
is test_operations.py::test_external_kill_and_recycles_show_in_metrics_and_status."""

from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
from hypothesis import given
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli.render import render_status
from supervisor.config.loading import parse_config
from supervisor.core.pool import State
from supervisor.core.reasons import ExitCause, Reason, exit_cause
from supervisor.daemon.control import Controller
from supervisor.daemon.metrics import LATENCY_BUCKETS, Metrics, slot_rows
from supervisor.shared.exitcodes import WorkerExit
from tests.test_core_cases import World
from tests.test_core_model import valid

CONFIG = """
supervisor:
  runtime_dir: /tmp/tfs-series
models:
  a:
    handler: "mod:a"
    workers: WORKERS
    policy: {warmup_jobs: 0, warmup_seconds: 0, max_memory: 1000, kill_memory: 2000}
  EXTRA
"""
MODEL_B = """b:
    handler: "mod:b"
    workers: 1"""
PATH = Path("/tmp/tfs-series/config.yaml")


def text(workers: int = 3, extra: str = "") -> str:
    return CONFIG.replace("WORKERS", str(workers)).replace("EXTRA", extra)


def world(workers: int = 3, extra: str = "") -> World:
    w = World(text(workers, extra))
    ready_all(w)
    return w


def ready_all(w: World) -> None:
    for worker in list(w.core.pool.workers.values()):
        if worker.state is State.STARTING:
            w.ready(worker.id)


def reap(w: World) -> None:
    """Workers told to stop exit cleanly; killed ones die of the SIGKILL."""
    w.tick()  # drains that finished become stops
    for worker_id in w.stopped:
        w.exit(worker_id, 0)
    for worker_id, _ in w.killed:
        w.exit(worker_id, -signal.SIGKILL)
    w.stopped.clear()
    w.killed.clear()
    w.tick()


def places(w: World, model: str = "a") -> dict[str, tuple[int, str]]:
    return {x.id: (x.slot, str(x.role)) for x in w.core.pool.of_model(model)}


def status(w: World) -> dict[str, Any]:
    return Controller(w.core, lambda: {}, lambda: True, lambda: True).status(w.now)


def scrape(metrics: Metrics, w: World) -> str:
    metrics.publish(w.core.pool, w.core.router)
    return generate_latest(metrics.registry).decode()


def series(exposition: str) -> list[tuple[str, Any]]:
    """(sample name, sorted labels) of every per-worker sample (those labelled by slot)."""
    return [(s.name, tuple(sorted(s.labels.items())))
            for f in text_string_to_metric_families(exposition) for s in f.samples
            if "slot" in s.labels]


def promlint(exposition: str) -> list[str]:
    """What `promtool check metrics` (promlint) would say, in Python so that no test needs
    promtool installed: help text, counters named _total and only they, base units, no
    abbreviations, snake_case, no reserved suffixes or labels, no duplicate series."""
    problems = []
    units = {"minutes", "hours", "days", "weeks", "bits", "milliseconds", "microseconds",
             "nanoseconds", "kilobytes", "megabytes", "gigabytes", "kibibytes", "mebibytes"}
    abbreviations = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h",
                     "d"}
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", exposition, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M))
    for name, kind in types.items():
        tokens = name.split("_")
        if not helps.get(name):
            problems.append(f"{name}: no help text")
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            problems.append(f"{name}: not snake_case")
        if (kind == "counter") != name.endswith("_total"):
            problems.append(f"{name}: a {kind} {'without' if kind == 'counter' else 'with'} "
                            "_total")
        if units & set(tokens) or abbreviations & set(tokens):
            problems.append(f"{name}: a non-base or abbreviated unit")
        if kind not in ("histogram", "summary") and name.endswith(("_bucket", "_count",
                                                                   "_sum")):
            problems.append(f"{name}: a reserved suffix")
        if any(t in ("counter", "gauge", "histogram", "summary") for t in tokens):
            problems.append(f"{name}: the type in the name")
    seen = set()
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                problems.append(f"{sample.name}{sample.labels}: duplicated")
            seen.add(key)
            for label in sample.labels:
                if not re.fullmatch(r"[a-z_][a-z0-9_]*", label) or label.startswith("__"):
                    problems.append(f"{sample.name}: label {label!r}")
                if label in ("le", "quantile") and family.type not in ("histogram", "summary"):
                    problems.append(f"{sample.name}: reserved label {label!r}")
    if shutil.which("promtool"):  # the real one too, where it is installed
        out = subprocess.run(["promtool", "check", "metrics"], input=exposition, text=True,
                             capture_output=True, timeout=30)
        problems += [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    return problems


# --- slots -----------------------------------------------------------------------------


def test_new_workers_take_the_lowest_slots_and_a_replacement_its_predecessors() -> None:
    w = world()
    assert places(w) == {"a-1": (0, "current"), "a-2": (1, "current"), "a-3": (2, "current")}
    w.core.recycle("a", "a-2")
    w.poll()  # the recycle starts: a-2 serves on (surge) while a-4 warms up in its slot
    w.tick()
    assert places(w)["a-2"] == (1, "outgoing") and places(w)["a-4"] == (1, "current")
    w.ready("a-4")
    reap(w)
    assert places(w) == {"a-1": (0, "current"), "a-3": (2, "current"), "a-4": (1, "current")}
    w.exit("a-1", 1)  # a crash: the replacement takes the slot that is free
    w.tick()
    assert places(w)["a-5"] == (0, "current")


def test_scale_down_keeps_the_survivors_below_the_new_count() -> None:
    w = world(workers=3)
    w.core.reload(parse_config(text(workers=1), PATH), w.now)
    w.tick()
    # The oldest go (a-1 in slot 0, a-2 in slot 1); a-3 stays and moves down to slot 0.
    assert places(w)["a-3"] == (0, "current")
    assert {places(w)[x] for x in ("a-1", "a-2")} == {(0, "outgoing"), (1, "outgoing")}
    reap(w)
    assert places(w) == {"a-3": (0, "current")}
    assert [(r.slot, r.role) for r in slot_rows(w.core.pool)] == [(0, "current")]


def test_scale_down_with_a_gap_moves_the_survivor_into_it() -> None:
    w = world(workers=3)
    w.core.pool.models["a"].backoff_until = w.now + 60  # slot 0 stays empty a while
    w.core.pool.models["a"].failures = 1
    w.exit("a-1", int(WorkerExit.LOAD_ERROR))
    w.core.reload(parse_config(text(workers=2), PATH), w.now)
    w.tick()  # a-2 (slot 1) and a-3 (slot 2) are within the new count: a-3 moves to 0
    assert places(w) == {"a-2": (1, "current"), "a-3": (0, "current")}


def test_a_removed_models_series_go_with_it() -> None:
    w = world(workers=1, extra=MODEL_B)
    metrics = Metrics()
    assert any('model="b"' in line for line in scrape(metrics, w).splitlines())
    w.core.reload(parse_config(text(workers=1), PATH), w.now)
    w.tick()
    assert places(w, "b") == {"b-1": (0, "outgoing")}
    reap(w)
    assert "b" not in w.core.pool.models
    assert 'model="b"' not in scrape(metrics, w)


def test_two_outgoing_workers_of_one_slot_make_one_series() -> None:
    w = world(workers=1)
    w.request(valid("a", 1))  # a job keeps a-1 draining after its replacement is ready
    w.core.recycle("a", None)
    w.poll()
    w.tick()
    w.ready("a-2")  # a-1 drains, holding its job
    assert w.state("a-1") is State.DRAINING
    w.memory["a-2"] = 2500  # a-2 crosses kill_memory before a-1 is gone: killed
    w.poll()
    w.tick()
    assert places(w) == {"a-1": (0, "outgoing"), "a-2": (0, "outgoing"),
                         "a-3": (0, "current")}
    rows = {(r.slot, r.role): r for r in slot_rows(w.core.pool)}
    assert sorted(rows) == [(0, "current"), (0, "outgoing")]
    assert rows[0, "outgoing"].memory == 100 + 2500  # both hold memory: added up
    assert not promlint(scrape(Metrics(), w))


# --- exits -----------------------------------------------------------------------------


def test_exit_causes_come_from_the_reason_and_the_exit_status() -> None:
    kill = -signal.SIGKILL
    cases = [
        # reason, kill reason, told, ready, code -> cause
        (None, None, False, True, kill, ExitCause.KILLED_EXTERNALLY),
        (Reason.MAX_JOBS, None, True, True, kill, ExitCause.KILLED_EXTERNALLY),  # OOM on its way
        (None, None, False, True, 1, ExitCause.CRASHED),
        (None, None, False, True, 0, ExitCause.CRASHED),  # nobody asked it to go
        (None, None, False, True, int(WorkerExit.RECYCLE), ExitCause.RECYCLED),
        (None, None, False, False, int(WorkerExit.LOAD_ERROR), ExitCause.BOOT_FAILED),
        (Reason.START_TIMEOUT, Reason.START_TIMEOUT, True, False, kill, ExitCause.BOOT_FAILED),
        (Reason.MAX_JOBS, None, True, True, 0, ExitCause.RECYCLED),
        (Reason.MAX_JOBS, None, False, True, 1, ExitCause.CRASHED),  # died serving on
        (Reason.MAX_JOBS, Reason.STOP_TIMEOUT, True, True, kill, ExitCause.RECYCLED),
        (Reason.MAX_JOBS, Reason.HUNG, True, True, kill, ExitCause.HUNG),
        (Reason.MAX_MEMORY, Reason.KILL_MEMORY, True, True, kill, ExitCause.KILLED_OVER_LIMIT),
        (Reason.MAX_MEMORY, Reason.MAX_MEMORY, True, False, kill, ExitCause.KILLED_OVER_LIMIT),
        # The container's pressure: drained and stopped, or killed before the kernel would.
        (Reason.CONTAINER_PRESSURE, None, True, True, 0, ExitCause.RECYCLED),
        (Reason.CONTAINER_PRESSURE, Reason.CONTAINER_PRESSURE, True, True, kill,
         ExitCause.KILLED_OVER_LIMIT),
        (Reason.JOB_TIMEOUT, Reason.JOB_TIMEOUT, True, True, kill, ExitCause.JOB_TIMEOUT),
        (Reason.PROTOCOL_ERROR, Reason.PROTOCOL_ERROR, True, True, kill,
         ExitCause.PROTOCOL_ERROR),
        (Reason.SCALE_DOWN, None, True, True, 0, ExitCause.STOPPED),
        (Reason.REMOVED, None, True, True, 0, ExitCause.STOPPED),
        (Reason.SHUTDOWN, Reason.SHUTDOWN, True, True, kill, ExitCause.STOPPED),
    ]
    for reason, killed_for, told, ready, code, cause in cases:
        assert exit_cause(reason, killed_for, told, ready, code) is cause, \
            (reason, killed_for, told, ready, code)
    assert {c for c in ExitCause if c.expected} == {ExitCause.RECYCLED, ExitCause.STOPPED}


def test_an_outside_sigkill_is_counted_and_shown() -> None:
    w = world(workers=1)
    pid = w.core.pool.workers["a-1"].pid
    w.now += 7
    w.exit("a-1", -signal.SIGKILL)
    w.tick()
    model = status(w)["models"]["a"]
    assert model["exits"] == {"killed_externally": 1}
    assert model["last_unexpected_exit"] == {
        "cause": "killed_externally", "worker": "a-1", "pid": pid, "slot": 0,
        "exit": "signal SIGKILL", "seconds_ago": 0.0}
    assert "LAST UNEXPECTED EXIT: killed_externally (a-1 slot 0, signal SIGKILL" in \
        render_status(status(w))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(scrape(Metrics(), w)) for s in f.samples}
    assert samples["tfsupervisor_worker_exits_total",
                   (("cause", "killed_externally"), ("model", "a"))] == 1
    assert samples["tfsupervisor_worker_exits_total", (("cause", "crashed"), ("model", "a"))] == 0


def test_hung_and_boot_failed_workers_are_told_apart() -> None:
    w = world(workers=1)
    w.tick(w.core.config.supervisor.heartbeat_timeout + 1)  # a-1 says nothing: hung
    assert w.killed == [("a-1", Reason.HUNG)]
    reap(w)
    w.exit("a-2", int(WorkerExit.LOAD_ERROR))  # its replacement cannot load
    assert status(w)["models"]["a"]["exits"] == {"hung": 1, "boot_failed": 1}
    assert status(w)["models"]["a"]["last_unexpected_exit"]["cause"] == "boot_failed"


# --- held back and over a limit --------------------------------------------------------


def test_recycles_held_back_by_max_concurrent_recycles_are_shown() -> None:
    w = world(workers=3)
    w.core.recycle("a", None)
    w.poll()  # one at a time (max_concurrent_recycles 1): two wait
    report = status(w)
    model = report["models"]["a"]
    assert model["recycles_held_back"] == 2
    held = [x for x in model["workers"] if x["recycle_held_back"]]
    assert [x["recycle_held_back"] for x in held] == [
        {"reason": "manual", "why": "max_concurrent_recycles"}] * 2
    table = render_status(report)
    assert "recycle (manual) held back: max_concurrent_recycles already under way" in table
    assert "2 recycle(s) HELD BACK" in table
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(scrape(Metrics(), w)) for s in f.samples}
    assert samples["tfsupervisor_recycles_held_back", (("model", "a"),)] == 2


def test_a_worker_whose_replacement_cannot_start_is_held_back_by_backoff() -> None:
    w = world(workers=1)
    w.core.recycle("a", None)
    w.poll()
    w.tick()
    w.exit("a-2", int(WorkerExit.LOAD_ERROR))
    [worker] = status(w)["models"]["a"]["workers"]
    assert worker["id"] == "a-1" and worker["state"] == "ready"
    assert worker["recycle_held_back"] == {"reason": "manual", "why": "backoff"}
    assert "fails to start, retried with back-off" in render_status(status(w))


def test_a_worker_over_max_memory_says_so_while_it_serves_on_and_drains() -> None:
    w = world(workers=1)
    w.request(valid("a", 1))  # held by a-1: it drains instead of stopping at once
    w.now += 1
    w.memory["a-1"] = 1500
    w.poll()
    # The model's last ready worker serves on over max_memory (a soft limit) until its
    # replacement is ready, and says so ...
    [worker] = [x for x in status(w)["models"]["a"]["workers"] if x["id"] == "a-1"]
    assert worker["state"] == "ready" and worker["over_limits"] == ["max_memory"]
    assert worker["recycle_reason"] == "max_memory"
    w.tick()
    w.ready("a-2")
    w.poll()  # ... then drains, and still says so
    report = status(w)
    [worker] = [x for x in report["models"]["a"]["workers"] if x["id"] == "a-1"]
    assert worker["state"] == "draining" and worker["over_limits"] == ["max_memory"]
    table = render_status(report)
    assert "OVER max_memory (1.5KiB >= 1000B)" in table
    assert "1 worker(s) OVER A LIMIT" in table


# --- baseline ----------------------------------------------------------------------------


def test_the_baseline_is_the_first_sample_after_warm_up_and_stays() -> None:
    w = World(text(workers=1).replace("warmup_jobs: 0, warmup_seconds: 0",
                                      "warmup_jobs: 0, warmup_seconds: 5"))
    w.memory["a-1"] = 300
    w.ready("a-1")
    assert status(w)["models"]["a"]["workers"][0]["baseline"] is None  # not warmed up yet
    w.now += 6
    w.memory["a-1"] = 400
    w.poll()
    for step in range(150):  # more samples than the history keeps
        w.now += 1
        w.memory["a-1"] = 400 + step
        w.poll()
    assert len(w.core.pool.workers["a-1"].history) < 150
    assert status(w)["models"]["a"]["workers"][0]["baseline"] == 400
    [row] = slot_rows(w.core.pool)
    assert row.baseline == 400


# --- the exposition ----------------------------------------------------------------------


def test_series_stay_bounded_across_many_recycles_and_lint_clean() -> None:
    w = world(workers=2)
    metrics = Metrics()
    seen: set[tuple[str, Any]] = set()
    per_round = []
    for _ in range(8):
        w.core.recycle("a", None)
        for _ in range(2):  # one at a time: surge, ready, drain, stop, exit
            w.poll()
            w.tick()
            text_now = scrape(metrics, w)
            assert not promlint(text_now), promlint(text_now)
            seen |= set(series(text_now))
            ready_all(w)
            seen |= set(series(scrape(metrics, w)))
            reap(w)
        per_round.append(len(seen))
    assert w.core.pool.models["a"].recycles["manual"] == 16
    # Two slots, two roles: whatever the number of recycles, no more label sets than that.
    labels = {dict(labels)["slot"] + "/" + dict(labels)["role"] for _, labels in seen}
    assert labels <= {"0/current", "0/outgoing", "1/current", "1/outgoing"}
    assert per_round[-1] == per_round[1], per_round  # nothing new after the first rounds
    assert not any(re.search(r'"a-\d+"', line) for line in scrape(metrics, w).splitlines())


def test_always_zero_series_are_gone_and_limits_build_and_reloads_are_there() -> None:
    w = world(workers=1)
    metrics = Metrics()
    metrics.reloaded(True)
    metrics.reloaded(False)
    exposition = scrape(metrics, w)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(exposition) for s in f.samples}
    states = {dict(k[1])["state"]: v for k in samples if k[0] == "tfsupervisor_workers"
              for v in [samples[k]]}
    assert states == {"ready": 1}  # no zeros for starting, draining, stopping, gone
    assert samples["tfsupervisor_policy_limit_bytes",
                   (("limit", "max_memory"), ("model", "a"))] == 1000
    assert samples["tfsupervisor_policy_limit_bytes",
                   (("limit", "kill_memory"), ("model", "a"))] == 2000
    assert not any(k[0] == "tfsupervisor_policy_limit_bytes" and ("limit", "max_vram") in k[1]
                   for k in samples)  # not set: not there
    assert samples["tfsupervisor_config_reloads_total", (("outcome", "applied"),)] == 1
    assert samples["tfsupervisor_config_reloads_total", (("outcome", "rejected"),)] == 1
    assert samples["tfsupervisor_config_last_reload_success_timestamp_seconds", ()] > 1e9
    [build] = [k for k in samples if k[0] == "tfsupervisor_build_info"]
    assert {"version", "python"} == {k for k, _ in build[1]}
    assert samples["tfsupervisor_workers_configured", (("model", "a"),)] == 1
    causes = {dict(k[1])["cause"] for k in samples if k[0] == "tfsupervisor_worker_exits_total"}
    assert causes == {c.value for c in ExitCause} - {"job_timeout"}  # no job_timeout set
    assert not promlint(exposition), promlint(exposition)



@given(st.lists(st.tuples(st.sampled_from(["a", "b"]),
                          st.floats(0, 100, allow_nan=False) | st.sampled_from(LATENCY_BUCKETS)),
                max_size=60))
def test_job_histograms_expose_what_prometheus_client_would(
        observations: list[tuple[str, float]]) -> None:
    """The per-job histograms and counter are counted in plain Python for speed; what they
    expose must be what prometheus_client's own Histogram and Counter expose for the same
    observations (a value on a bound in that bound's bucket, cumulative buckets, sums).
    Only the ``_created`` series are not kept: they held each series' start time."""
    ours = Metrics()
    registry = CollectorRegistry()
    latency = Histogram("tfsupervisor_job_latency_seconds", "x", ["model"],
                        buckets=LATENCY_BUCKETS, registry=registry)
    jobs = Counter("tfsupervisor_jobs", "x", ["model", "outcome"], registry=registry)
    for model, value in observations:
        ours.job(model, "ok", value)
        latency.labels(model).observe(value)
        jobs.labels(model, "ok").inc()

    def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text.decode()) for s in f.samples
                if s.name.startswith(("tfsupervisor_job_latency", "tfsupervisor_jobs_total"))
                and not s.name.endswith("_created")}

    theirs, mine = samples(generate_latest(registry)), samples(generate_latest(ours.registry))
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert math.isclose(mine[key], value, rel_tol=1e-9, abs_tol=1e-9), key
