"""Each leak cause reproduced in a real worker, recycled, and named right; a healthy model
named nothing. The reproductions: bench/leak_scenarios.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.leak_scenarios import (
    Case,
    config,
    host_cases,
    run,
    save_sequence_model,
    tensorflow_cases,
)
from tests.conftest import short_tmpdir

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow", reason="workers need the tensorflow extra")


@pytest.fixture(scope="module")
def sequence_model() -> Iterator[Path]:
    yield save_sequence_model(short_tmpdir() / "xla_sm")


def named_right(cases: list[Case], found: dict[str, dict[str, Any]]) -> None:
    leaking = [c for c in cases if c.cause is not None]
    named = {c.name: found[c.name].get("cause") for c in leaking}
    report = {c.name: (found[c.name].get("summary"), found[c.name].get("evidence"))
              for c in leaking}
    assert named == {c.name: c.cause for c in leaking}, json.dumps(report, indent=1)
    for case in leaking:
        event = found[case.name]
        assert event["reason"] == "growth_per_1k_jobs", event
        assert event["remedy"] and event["evidence"]["memory_per_1k_jobs"] > 0, event
        assert event["evidence"]["probe_cost_per_job_us"] > 0, event


# Alone: under CI's three parallel test workers Keras predict() ran ~5 jobs a second, and a
# window of 63-75 jobs saw its objects come and go with the collector (named native heap
# retention twice in four clean-clone runs); it passes with the cores to itself.
@pytest.mark.alone
@pytest.mark.timeout(600)
def test_tensorflow_causes_named(supervisor_factory: Any, sequence_model: Path) -> None:
    cases = tensorflow_cases(sequence_model)
    sup = supervisor_factory(config(cases))
    found, _, failures = run(sup, cases)
    assert failures == []
    named_right(cases, found)
    assert "model.predict()" in found["keras"]["remedy"]
    # ... and the worker said so at load, before any job (its own event, passed through)
    warned = [json.loads(line) for line in sup.log().splitlines()
              if '"keras_predict_per_request"' in line]
    assert warned and {w["model"] for w in warned} == {"keras"}, warned
    assert "training=False" in warned[0]["remedy"]
    assert found["scalar"]["evidence"]["traced"]["forward"] > 3, found["scalar"]
    assert found["lengths"]["evidence"]["graphs_added"] == 0, found["lengths"]


@pytest.mark.timeout(600)
def test_python_and_native_causes_named_and_healthy_left_alone(
        supervisor_factory: Any, models_dir: Path) -> None:
    cases = host_cases(models_dir / "demo_sm")
    found, status, failures = run(supervisor_factory(config(cases)), cases)
    assert failures == []
    named_right(cases, found)
    assert "model.predict()" not in found["hoard"]["remedy"]
    assert "C extension" in found["native"]["remedy"]
    assert "numpy.ndarray" in found["cache"]["summary"], found["cache"]
    # the bytes each source explains: the list of pointers grows one int a job, the dict of
    # arrays one 32 KiB array a job; the native heap holds both, Python keeps only the arrays
    split = {name: found[name]["evidence"]["growth_split"] for name in ("pointers", "cache")}
    pointers, cache = split["pointers"], split["cache"]
    assert pointers["python_objects"] < 0.05 * pointers["memory"], split
    assert pointers["native_heap"] > 0.5 * pointers["memory"], split
    assert cache["python_objects"] > 0.5 * cache["memory"], split
    assert "list of int" in json.dumps(found["pointers"]["evidence"]["growing_containers"])
    assert "healthy" not in found
    healthy = status["models"]["healthy"]
    assert healthy["recycles"] == {}, healthy
    assert [w["suspected_cause"] for w in healthy["workers"]] == [None], healthy
