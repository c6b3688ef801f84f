"""`tfsupervisor tune` against a running daemon: what the `tune` control command records
(TF-free), and the whole loop on a real TensorFlow worker: traffic, tune, write, reload,
then the tuned policy leaves the healthy worker alone and recycles it once it leaks, before
it reaches the tuned max_memory.

Time is scaled down (0.2 s polls, a 20-sample trend window); the rules are the ones users get.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from supervisor.cli.commands import main
from supervisor.client import Client, JobError
from supervisor.client.client import control
from supervisor.config.loading import load_config
from supervisor.core.tuning import Options, parse_history, tune_model
from supervisor.shared.protocol import INTERNAL_HOP
from tests.conftest import Supervisor


def saved(sup: Supervisor, tmp_path: Path, *extra: str) -> dict[str, Any]:
    path = tmp_path / "history.json"
    assert main(["tune", "-c", str(sup.config_path), "--save", str(path), *extra]) == 0
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_the_daemon_records_lengths_batch_sizes_and_gone_workers(
        supervisor_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sup = supervisor_factory({"models": {"m": {
        "handler": "worker.handlers:echo", "workers": 1,
        "options": {"inputs": {"ids": {"dtype": "int32", "shape": [None, None]}}}}}})
    rng = np.random.default_rng(1)
    lengths = [int(n) for n in rng.integers(1, 300, 120)]
    with Client(sup.endpoint, timeout=30) as client:
        for n in lengths:
            client.infer("m", {"ids": np.zeros((1 + n % 3, n), dtype=np.int32)})
    sup.admin("recycle", model="m")
    sup.wait_for(lambda s: [w["id"] for w in s["models"]["m"]["workers"]] == ["m-2"]
                 and s["models"]["m"]["workers"][0]["state"] == "ready", 60,
                 "m-1 replaced by m-2")
    sup.wait_for(lambda s: s["models"]["m"]["workers"][0]["memory"] is not None, 30,
                 "m-2 sampled")
    data = saved(sup, tmp_path, "m")
    assert data["format"] == "tfsupervisor-history/1"
    traffic = data["models"]["m"]["traffic"]
    assert traffic["jobs"] == len(lengths)
    histogram = traffic["lengths"]["ids:1"]
    assert histogram["jobs"] == len(lengths)
    assert sum(n for _, _, n in histogram["buckets"]) == len(lengths)
    assert min(b[0] for b in histogram["buckets"]) == min(lengths)
    assert max(b[1] for b in histogram["buckets"]) == max(lengths)
    batches = sup.status()["models"]["m"]["batches"]["sent"]
    assert sum(n for _, n in traffic["batch_rows"]) == batches
    workers = {w["id"]: w for w in data["models"]["m"]["workers"]}
    assert set(workers) == {"m-1", "m-2"}
    assert workers["m-1"]["reason"] == "manual" and workers["m-1"]["ended_at"] is not None
    assert workers["m-1"]["jobs"] == len(lengths) and workers["m-1"]["life"]
    assert workers["m-2"]["ended_at"] is None
    out = capsys.readouterr().out
    assert "not enough data" in out  # a few seconds of traffic: it says so, no guess
    # a model the daemon does not serve is named in the error
    with pytest.raises(JobError, match="no model named 'nope'"):
        control(sup.control_endpoint, "tune", model="nope")


# --- the whole loop on TensorFlow -------------------------------------------------------

POLL = 0.2
WINDOW = 20


def drive(sup: Supervisor, stop: threading.Event, leaking: threading.Event,
          errors: list[str]) -> None:
    """One client, paced (so a leak grows at a rate a trend can be seen at): ordinary rows
    of 1 to 4, or marked rows while ``leaking`` is set."""
    rng = np.random.default_rng(0)
    with Client(sup.endpoint, timeout=60) as client:
        while not stop.is_set():
            x = rng.standard_normal((int(rng.integers(1, 5)), 16)).astype(np.float32)
            if leaking.is_set():
                x = np.full((1, 16), 5000.0, dtype=np.float32)
            try:
                client.infer("tf", {"x": x})
            except JobError as exc:
                errors.append(str(exc))
            stop.wait(0.02)


def tuned(sup: Supervisor) -> Any:
    """The tuning of the running daemon's record now (the rules the CLI runs)."""
    config = load_config(sup.config_path)
    recorded = parse_history(control(sup.control_endpoint, "tune", timeout=30, model="tf",
                                     limits=INTERNAL_HOP))
    return tune_model("tf", recorded.models["tf"], config.models["tf"], recorded, Options())


def events(sup: Supervisor, name: str) -> list[dict[str, Any]]:
    found = []
    for line in sup.log().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found.append(event)
    return found


@pytest.mark.tf
def test_tuned_policy_keeps_the_healthy_worker_and_recycles_the_leaking_one(
        supervisor_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorflow", reason="workers need the tensorflow extra")
    sup = supervisor_factory({"supervisor": {"poll_interval": f"{POLL}s"}, "models": {"tf": {
        "handler": "bench.leak_handlers:leak_on_demand", "workers": 1,
        "options": {"bytes_per_call": 256 * 1024},
        "tf": {"intra_op_threads": 1, "inter_op_threads": 1},
        "batching": {"max_batch_size": 8},
        "policy": {"trend_window": WINDOW, "warmup_seconds": "1s", "warmup_jobs": 10}}}})
    stop, leaking, errors = threading.Event(), threading.Event(), []
    client = threading.Thread(target=drive, args=(sup, stop, leaking, errors))
    client.start()
    try:
        # 1. ordinary traffic until tune has what it needs (it says when it has not)
        deadline = time.monotonic() + 240
        while True:
            tuning = tuned(sup)
            ready = {f.path: f.value for f in tuning.findings}
            if all(ready.get(("policy", k)) is not None for k in (
                    "max_memory", "warmup_seconds", "max_growth_per_1k_jobs",
                    "max_growth_per_hour")) and ready.get(("batching", "allowed_batch_sizes")):
                break
            assert time.monotonic() < deadline, [f.evidence for f in tuning.findings]
            time.sleep(0.5)
        # 2. tune --write, then reload: the running daemon takes the tuned policy
        assert main(["tune", "-c", str(sup.config_path), "tf", "--write"]) == 0
        out = capsys.readouterr().out
        assert "+++ " in out and "max_memory:" in out
        written = yaml.safe_load(sup.config_path.read_text())["models"]["tf"]
        policy = load_config(sup.config_path).models["tf"].policy
        assert policy.max_memory is not None and "max_memory" in written["policy"]
        assert sup.admin("reload").get("updated") == ["tf"]
        status = sup.wait_for(lambda s: s["models"]["tf"]["max_memory"] == policy.max_memory,
                              30, "the tuned max_memory in force")
        worker = status["models"]["tf"]["workers"][0]
        # 3. more ordinary traffic, three trend windows and 300 jobs of it: no recycle
        start_age, start_jobs = worker["age"], worker["jobs"]
        sup.wait_for(lambda s: s["models"]["tf"]["workers"][0]["age"] >= start_age
                     + 3 * WINDOW * POLL and s["models"]["tf"]["workers"][0]["jobs"]
                     >= start_jobs + 300, 120, "three windows of healthy traffic")
        status = sup.status()["models"]["tf"]
        assert status["recycles"] == {}, status["last_recycle"]
        assert [w["id"] for w in status["workers"]] == [worker["id"]]
        # 4. the same worker leaks: recycled for its trend, under the tuned max_memory
        leaking.set()
        sup.wait_for(lambda s: s["models"]["tf"]["recycles"], 120, "a recycle")
        leaking.clear()
        recycled = events(sup, "worker_recycling")
        assert len(recycled) == 1, recycled
        assert recycled[0]["worker"] == worker["id"]
        assert recycled[0]["reason"] in ("growth_per_1k_jobs", "growth_per_hour"), recycled[0]
        assert recycled[0]["memory"] < policy.max_memory
        assert recycled[0]["growth_per_1k_jobs"] > (policy.max_growth_per_1k_jobs or 0)
    finally:
        stop.set()
        client.join(60)
    assert errors == []
