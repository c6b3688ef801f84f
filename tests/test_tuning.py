"""`tfsupervisor tune`'s rules on recorded histories (supervisor/core/tuning.py), one test per
rule, and the command around them: saved histories (hostile ones too) and --write.

The histories are recorded as the daemon records them: samples go through the core's own
``History`` (its whole-life series coarsening with age) and ``WorkerRecord``, lengths through
``Traffic``; only the memory curves are synthetic. Where a rule promises something about the
policy (a healthy worker is never recycled, a leak is), the real policy is run on a fresh
series of the same kind with the tuned settings.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from supervisor.cli.commands import main
from supervisor.config.keys import ModelConfig, PolicyConfig
from supervisor.config.loading import parse_config
from supervisor.config.units import parse_duration, parse_size
from supervisor.core.history import LIFE_POINTS, History, Sample
from supervisor.core.policy import Ruling, WorkerFacts, evaluate
from supervisor.core.traffic import Traffic, WorkerRecord
from supervisor.core.tuning import (
    HISTORY_FORMAT,
    MIN_LENGTH_JOBS,
    Finding,
    ModelTuning,
    Options,
    fewest_sizes,
    parse_history,
    tune_model,
)
from supervisor.shared.protocol import TensorSpec

MiB = 1024**2
POLL = 1.0
STARTUP = 5.0  # spawn to ready, seconds
Curve = Callable[[float], float]  # seconds since ready -> bytes


def plateau(base: float = 500 * MiB, ramp: float = 40 * MiB, seconds: float = 60.0) -> Curve:
    """TF's warm-up: memory rises over the first ``seconds`` of traffic, then stays."""
    return lambda age: base + ramp * min(1.0, max(age, 0.0) / seconds)


def leak(per_job: float, base: float = 540 * MiB) -> Callable[[float, int], float]:
    return lambda age, jobs: base + per_job * jobs


def record(worker_id: str, curve: Callable[..., float], seconds: float, *, start: float = 0.0,
           rate: float = 20.0, noise: float = 0.3 * MiB, seed: int = 0,
           ended: bool = False, reason: str | None = None,
           per_job: bool = False, kept: int = 120) -> dict[str, Any]:
    """One worker as the daemon records it: a sample per poll from spawn, jobs arriving at
    ``rate`` per second after ready, memory from ``curve`` (of age, or of age and jobs)."""
    samples = series(curve, seconds, start=start, rate=rate, noise=noise, seed=seed,
                     per_job=per_job)
    history = History(kept)  # the daemon keeps 2 x trend_window (at least 64)
    for s in samples:
        history.add(s)
    end = samples[-1].t if ended else None
    return WorkerRecord.of(worker_id, start, start + STARTUP, end, reason, samples[-1].jobs,
                           history).to_wire()


def series(curve: Callable[..., float], seconds: float, *, start: float = 0.0,
           rate: float = 20.0, noise: float = 0.3 * MiB, seed: int = 0,
           per_job: bool = False) -> list[Sample]:
    rng = np.random.default_rng(seed)
    jobs, out = 0, []
    for i in range(int(seconds / POLL)):
        t = start + i * POLL
        age = t - start - STARTUP
        if age >= 0:
            jobs += int(rng.poisson(rate * POLL))
        value = curve(age, jobs) if per_job else curve(age)
        out.append(Sample(t, jobs, int(value + rng.normal(0, noise))))
    return out


def history(workers: list[dict[str, Any]], now: float, batch_rows: list[list[int]] | None = None,
            lengths: dict[str, Any] | None = None, jobs: int = 0) -> dict[str, Any]:
    return {"format": HISTORY_FORMAT, "now": now, "poll_interval": POLL,
            "models": {"m": {"traffic": {"jobs": jobs, "batch_rows": batch_rows or [],
                                         "lengths": lengths or {}},
                             "workers": workers}}}


CONFIG = """
models:
  m:
    handler: "worker.handlers:echo"
    batching: {max_batch_size: 32}
"""


def model_config(text: str = CONFIG) -> ModelConfig:
    return parse_config(text).models["m"]


def tune(raw: dict[str, Any], config: ModelConfig | None = None,
         options: Options | None = None) -> ModelTuning:
    recorded = parse_history(json.loads(json.dumps(raw)))  # as it travels: JSON
    return tune_model("m", recorded.models["m"], config or model_config(), recorded,
                      options or Options())


def found(tuning: ModelTuning, *path: str) -> Finding:
    matches = [f for f in tuning.findings if f.path == path]
    assert len(matches) == 1, (path, tuning.findings)
    return matches[0]


def tuned_policy(tuning: ModelTuning) -> PolicyConfig:
    """The policy the tuned snippet sets, validated as config would."""
    values = {f.path[1]: f.value for f in tuning.findings
              if f.path[0] == "policy" and f.value is not None}
    text = CONFIG + "    policy:\n" + "".join(f"      {k}: {v}\n" for k, v in values.items())
    return parse_config(text).models["m"].policy


def first_recycle(samples: list[Sample], policy: PolicyConfig,
                  start: float = 0.0) -> tuple[int, Any] | None:
    """Run the real policy over a series as the recycler does (a bounded history, the trend
    streak carried); the first sample index where it recycles, and its verdict."""
    recent: list[Sample] = []
    streak = 0
    for i, sample in enumerate(samples):
        recent = [*recent[-(2 * policy.trend_window - 1):], sample]
        if sample.t < start + STARTUP:
            continue
        facts = WorkerFacts(start, sample.jobs, 0.0, streak, start + STARTUP)
        verdict = evaluate(recent, facts, policy, sample.t)
        streak = verdict.trend_streak
        if verdict.ruling is not Ruling.KEEP:
            return i, verdict
    return None


# --- a healthy plateau ---------------------------------------------------------------------

def breathing(age: float) -> float:
    """A healthy plateau that breathes: +-8 MiB over 10 minutes (caches filled and trimmed)
    on top of the warm-up ramp. Its steepest stretches are real, confident slopes of
    ~300 MiB/h: a trend limit under them recycles it."""
    return plateau()(age) + 8 * MiB * math.sin(2 * math.pi * max(age, 0.0) / 600)


def test_a_healthy_plateau_gives_a_policy_that_never_recycles_it_and_catches_a_leak() -> None:
    raw = history([record("m-1", breathing, 1200), record("m-2", breathing, 900, start=300,
                                                          seed=1)], now=1200)
    tuning = tune(raw)
    policy = tuned_policy(tuning)
    # warm-up: the ramp enters the plateau's band 40-60 s after ready; times 1.5
    assert 40 * 1.5 <= policy.warmup_seconds <= 60 * 1.5 + 1, found(tuning, "policy",
                                                                      "warmup_seconds")
    assert policy.warmup_jobs >= 1.5 * 0.8 * 20 * 40
    # max_memory: never under what a healthy worker used, plus the headroom
    peak = max(s[2] for w in raw["models"]["m"]["workers"] for s in w["life"] + w["recent"])
    assert policy.max_memory is not None
    assert peak * 1.25 <= policy.max_memory <= peak * 1.25 + MiB
    # the trend limits alone (no max_memory to wait for) never recycle a fresh healthy
    # worker of the same kind (new noise) over a whole hour; at the steepest slope seen
    # (margin 0.8) they do, so this is the margin at work
    assert policy.max_growth_per_hour is not None
    trends_only = dataclasses.replace(policy, max_memory=None)
    for seed in (7, 8, 9):
        assert first_recycle(series(breathing, 3600, seed=seed), trends_only) is None, seed
    tight = tuned_policy(tune(raw, options=Options(trend_margin=0.8)))
    assert first_recycle(series(breathing, 3600, seed=7),
                         dataclasses.replace(tight, max_memory=None)) is not None
    # ... and a leak well over the tuned limit is recycled for its trend before max_memory
    assert policy.max_growth_per_1k_jobs is not None
    rate = 5 * policy.max_growth_per_1k_jobs / 1000
    leaking = series(leak(rate, base=540 * MiB), 3600, seed=3, per_job=True)
    caught = first_recycle(leaking, policy)
    assert caught is not None
    index, verdict = caught
    assert verdict.reason.value in ("growth_per_1k_jobs", "growth_per_hour")
    assert leaking[index].memory < policy.max_memory
    # the evidence says what it saw
    assert "steepest of" in found(tuning, "policy", "max_growth_per_hour").evidence
    assert "highest level" in found(tuning, "policy", "max_memory").evidence


def test_a_plateau_watched_too_briefly_says_how_much_more_is_needed() -> None:
    raw = history([record("m-1", plateau(), 90)], now=90)  # 85 s after ready; needs 120 s
    tuning = tune(raw)
    for key in ("warmup_seconds", "max_memory", "max_growth_per_1k_jobs"):
        finding = found(tuning, "policy", key)
        assert finding.value is None
        assert "not enough data" in finding.evidence
    evidence = found(tuning, "policy", "max_memory").evidence
    assert "need a worker watched 120s after ready" in evidence
    assert "(36s more)" in evidence  # watched 84 s (first to last sample after ready)


# --- a ramp that has not levelled off ------------------------------------------------------

def test_a_ramp_still_rising_is_not_mistaken_for_a_plateau() -> None:
    # Keras-predict-like: approaches +300 MiB with a 20-minute time constant; watched 10 min
    def ramp(age: float) -> float:
        return 500 * MiB + 300 * MiB * (1 - math.exp(-max(age, 0.0) / 1200))
    raw = history([record("m-1", ramp, 600)], now=600)
    tuning = tune(raw)
    assert found(tuning, "policy", "max_memory").value is None
    assert "no worker levelled off (1 still rising: m-1)" in \
        found(tuning, "policy", "max_memory").evidence
    assert found(tuning, "policy", "warmup_seconds").value is None
    notes = [f.evidence for f in tuning.findings if f.path == ("note",)]
    assert len(notes) == 1 and notes[0].startswith("m-1 was still rising")


# --- a leak --------------------------------------------------------------------------------

def test_a_leak_is_left_out_of_the_limits_and_the_tuned_limit_catches_it() -> None:
    leaker = record("m-1", leak(0.5 * MiB / 1000 * 60), 600, ended=True,
                    reason="growth_per_1k_jobs", per_job=True)  # 30 MiB per 1k jobs
    healthy = record("m-2", plateau(), 600, start=600, seed=2)
    tuning = tune(history([leaker, healthy], now=1200))
    policy = tuned_policy(tuning)
    assert policy.max_growth_per_1k_jobs is not None
    assert policy.max_growth_per_1k_jobs < 30 * MiB  # from the healthy worker alone
    evidence = found(tuning, "policy", "max_growth_per_1k_jobs").evidence
    assert "on m-2 " in evidence and "WARNING" not in evidence
    notes = [f.evidence for f in tuning.findings if f.path == ("note",)]
    assert any(n.startswith("m-1 was still rising") and "growth_per_1k_jobs" in n
               for n in notes)
    # max_memory from the healthy one, not the leak's highest sample
    assert policy.max_memory is not None and policy.max_memory < 700 * MiB


def test_a_slow_leak_under_the_tuned_limit_is_called_out() -> None:
    """A breathing plateau allows steep windows; a leak slower than they are would pass
    under the limit: the evidence says so rather than implying it is caught."""
    slow = record("m-1", lambda age: 540 * MiB + 60 * MiB * age / 3600, 900, seed=4)
    healthy = record("m-2", breathing, 1200, start=0, seed=2)
    tuning = tune(history([slow, healthy], now=1200))
    evidence = found(tuning, "policy", "max_growth_per_hour").evidence
    assert "WARNING: m-1" in evidence and "would pass under it" in evidence


def test_kill_memory_stays_above_the_tuned_max_memory() -> None:
    config = model_config(CONFIG + "    policy: {kill_memory: 600MiB}\n")
    tuning = tune(history([record("m-1", breathing, 1200)], now=1200), config)
    max_memory = parse_size(found(tuning, "policy", "max_memory").value)
    kill = parse_size(found(tuning, "policy", "kill_memory").value)
    assert max_memory > 600 * MiB and kill > max_memory
    text = CONFIG + f"    policy: {{max_memory: {max_memory}, kill_memory: {kill}}}\n"
    assert parse_config(text).models["m"].policy.kill_memory == kill  # check takes it


def test_only_leaking_workers_give_no_limits() -> None:
    workers = [record(f"m-{i}", leak(20 * MiB / 1000), 400, start=400 * i, seed=i,
                      ended=True, reason="growth_per_1k_jobs", per_job=True)
               for i in range(3)]
    tuning = tune(history(workers, now=1200))
    for key in ("max_memory", "warmup_seconds", "max_growth_per_1k_jobs",
                "max_growth_per_hour"):
        assert found(tuning, "policy", key).value is None
    assert "fix the leak" in found(tuning, "policy", "max_memory").evidence


def test_since_keeps_the_last_stretch_only() -> None:
    leaker = record("m-1", leak(20 * MiB / 1000), 400, ended=True, per_job=True)
    healthy = record("m-2", plateau(), 600, start=600, seed=2)
    raw = history([leaker, healthy], now=1200)
    assert len([f for f in tune(raw).findings if f.path == ("note",)]) == 1
    recent = tune(raw, options=Options(since=parse_duration("10m")))
    assert [f for f in recent.findings if f.path == ("note",)] == []  # the leaker ended earlier
    assert recent.summary.startswith("1 worker(s) that served (0 gone)")
    assert found(recent, "policy", "warmup_seconds").value == \
        found(tune(raw), "policy", "warmup_seconds").value
    # a worker ready before the cutoff shows only part of its way up: no warm-up from it
    late = tune(raw, options=Options(since=parse_duration("5m")))
    assert found(late, "policy", "max_memory").value is not None
    assert "no levelled worker became ready within --since" in \
        found(late, "policy", "warmup_seconds").evidence


# --- batch sizes ---------------------------------------------------------------------------

def padded_fraction(counts: dict[int, int], sizes: list[int]) -> float:
    padding = real = 0
    for length, n in counts.items():
        size = min(s for s in sizes if s >= length)
        padding += n * (size - length)
        real += n * length
    return padding / (padding + real)


def test_allowed_batch_sizes_are_the_fewest_within_the_padding_target() -> None:
    rows = {1: 500, 2: 260, 3: 90, 4: 40, 6: 30, 7: 12, 8: 60}
    config = model_config(CONFIG.replace("max_batch_size: 32", "max_batch_size: 8"))
    tuning = tune(history([], 0, batch_rows=[[r, n] for r, n in rows.items()]), config)
    finding = found(tuning, "batching", "allowed_batch_sizes")
    sizes = finding.value
    assert sizes[-1] == 8  # config requires max_batch_size among them
    assert sizes[0] == 1  # the smallest batch seen is never padded
    assert padded_fraction(rows, sizes) <= 0.10
    # none with one size fewer does as well (every choice tried)
    fewer = [[1, *c, 8] for c in itertools.combinations(range(2, 8), len(sizes) - 3)]
    assert all(padded_fraction(rows, c) > 0.10 for c in fewer)
    assert f"pad {padded_fraction(rows, sizes):.1%} of rows" in finding.evidence
    parse_config(CONFIG.replace("{max_batch_size: 32}",  # config takes it
                                f"{{max_batch_size: 8, allowed_batch_sizes: {sizes}}}"))


def test_too_few_batches_is_not_enough_data() -> None:
    tuning = tune(history([], 0, batch_rows=[[1, 40], [2, 9]]))
    finding = found(tuning, "batching", "allowed_batch_sizes")
    assert finding.value is None and "49 batches sent; need 100 (51 more)" in finding.evidence


# --- text lengths --------------------------------------------------------------------------

TEXT = """
models:
  m:
    handler: "worker.handlers:echo"
    padding:
      seq:
        inputs: {ids: 1}
        sizes: [32, 64, 128, 256, 512]
        mask_input: mask
"""


def lengths_traffic(lengths: list[int]) -> dict[str, Any]:
    """Lengths recorded as the core records them at admission."""
    traffic = Traffic()
    inputs = [TensorSpec("ids", "int32", (None, None))]
    for n in lengths:
        traffic.admitted([{"name": "ids", "dtype": "int32", "shape": [1, n]}], inputs)
    wire: dict[str, Any] = traffic.to_wire({})
    return wire


def test_padding_sizes_from_text_lengths() -> None:
    rng = np.random.default_rng(5)
    lengths = [int(min(431, max(3, v))) for v in rng.lognormal(4.0, 0.7, 4000)]
    traffic = lengths_traffic(lengths)
    assert traffic["jobs"] == 4000 and traffic["lengths"]["ids:1"]["jobs"] == 4000
    raw = history([], 0, lengths=traffic["lengths"], jobs=4000)
    tuning = tune(raw, model_config(TEXT))
    finding = found(tuning, "padding", "seq", "sizes")
    sizes = finding.value
    assert finding.write
    assert sizes[-1] == 512  # the largest configured size is kept: no job refused
    assert set(sizes[:-1]) <= set(lengths)  # each a length that occurred
    exact = padded_fraction({n: lengths.count(n) for n in set(lengths)}, sizes)
    assert exact <= 0.10, (sizes, exact)
    assert f"lengths {min(lengths)}..431" in finding.evidence
    assert "512 kept as the largest" in finding.evidence
    # the same without padding configured: shown for review, never written
    bare = tune(raw, model_config(CONFIG))
    review = found(bare, "padding", "ids", "sizes")
    assert not review.write and review.value[-1] == 431 and "not padded yet" in review.evidence


def test_fewest_sizes_is_minimal() -> None:
    rng = np.random.default_rng(9)
    lengths = [int(v) for v in rng.integers(1, 15, 300)] + [40] * 20
    counts = {n: lengths.count(n) for n in set(lengths)}
    groups = [(n, n, c) for n, c in counts.items()]
    for target in (0.05, 0.1, 0.2, 0.4):
        sizes, fraction = fewest_sizes(groups, target, 40, 16)
        assert math.isclose(fraction, padded_fraction(counts, sizes))
        assert fraction <= target and sizes[-1] == 40
        options = sorted(set(counts) - {40})
        assert all(padded_fraction(counts, [*c, 40]) > target
                   for c in itertools.combinations(options, len(sizes) - 2)), target


def test_too_few_lengths_is_not_enough_data() -> None:
    raw = history([], 0, lengths=lengths_traffic([10] * 50)["lengths"])
    finding = found(tune(raw, model_config(TEXT)), "padding", "seq", "sizes")
    assert finding.value is None
    assert f"50 jobs with a length on ids:1; need {MIN_LENGTH_JOBS} (150 more)" in \
        finding.evidence


# --- what is recorded stays bounded --------------------------------------------------------

def test_life_series_is_bounded_and_spans_the_whole_life() -> None:
    h = History(120)
    for i in range(100_000):
        h.add(Sample(float(i), i, i))
    points = h.life.points
    assert len(points) <= LIFE_POINTS + 1
    assert points[0].t == 0.0 and points[-1].t >= 100_000 - 2 * h.life.stride
    assert len(h) == 120


def test_length_histogram_is_bounded_whatever_the_lengths() -> None:
    traffic = Traffic()
    inputs = [TensorSpec("ids", "int32", (None, None)), TensorSpec("x", "float32", (None, 4))]
    for n in range(0, 3_000_000, 7):
        traffic.admitted([{"name": "ids", "dtype": "int32", "shape": [1, n]},
                          {"name": "x", "dtype": "float32", "shape": [1, 4]}], inputs)
    assert list(traffic.lengths) == ["ids:1"]  # the fixed axis is not recorded
    assert len(traffic.lengths["ids:1"].counts) <= 512
    assert traffic.jobs == len(range(0, 3_000_000, 7))


# --- the command ---------------------------------------------------------------------------

COMMENTED = """\
# the service of team X
supervisor:
  poll_interval: 1s        # sampled this often
models:
  m:
    handler: "worker.handlers:echo"   # our handler
    batching: {max_batch_size: 32}
    policy:
      max_memory: 2GiB     # a guess
      max_age: 24h         # backstop
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "config.yaml"
    config.write_text(COMMENTED)
    config.chmod(0o640)
    saved = tmp_path / "history.json"
    saved.write_text(json.dumps(history(
        [record("m-1", plateau(), 900), record("m-2", plateau(), 600, start=300, seed=1)],
        now=900, batch_rows=[[1, 600], [2, 200], [3, 100], [5, 40], [32, 10]])))
    return config, saved


def test_write_keeps_comments_prints_the_diff_and_checks_first(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    out = capsys.readouterr().out
    text = config.read_text()
    for comment in ("# the service of team X", "# sampled this often", "# our handler",
                    "# a guess", "# backstop"):
        assert comment in text
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o640
    # the file now says what the snippet said, and the diff is exactly the change
    policy = parse_config(text).models["m"].policy
    snippet = out.split("--- ")[0]
    assert f"max_memory: {policy.max_memory // MiB}MiB" in snippet
    diff = [line for line in out.splitlines() if line[:1] in "+-" and line[:3] not in
            ("---", "+++")]
    removed = {line[1:].strip() for line in diff if line.startswith("-")}
    added = {line[1:].strip() for line in diff if line.startswith("+")}
    assert removed == {"batching: {max_batch_size: 32}", "max_memory: 2GiB     # a guess"}
    assert len(added) == 6
    old_lines = set(COMMENTED.splitlines())
    assert {line for line in text.splitlines() if line not in old_lines} == \
        {line[1:] for line in diff if line.startswith("+")}
    # a second run has nothing left to change
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    assert config.read_text() == text
    assert "nothing to change" in capsys.readouterr().err


def test_write_refuses_what_check_refuses(files: tuple[Path, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    broken = COMMENTED.replace('handler: "worker.handlers:echo"', "saved_model: gone/model")
    config.write_text(broken)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 1
    err = capsys.readouterr().err
    assert "left unchanged: `check` refuses the tuned file" in err
    assert "models.m.saved_model" in err and "Traceback" not in err
    assert config.read_text() == broken


@pytest.mark.parametrize(("content", "message"), [
    ('{"format": "tfsupervisor-history/1", "now": 5, "poll_int', "not a valid history"),
    ('{"format": "tfsupervisor-history/1", "now": NaN, "poll_interval": 1, "models": {}}',
     "NaN is not a number a history holds"),
    ('{"format": "tfsupervisor-history/1", "now": [1, 2], "poll_interval": 1, "models": {}}',
     "history.now: expected a number, got list"),
    ('{"format": "tfsupervisor-history/1", "now": 1, "poll_interval": 1, "models": {"m": '
     '{"workers": [{"id": "m-1", "started_at": 0, "ready_at": 1, "life": [[1, 2, "3"]]}]}}}',
     "history.models.m.workers[0].life[0][2]: expected a number, got str"),
    ('{"format": "tfsupervisor-history/1", "now": 1, "poll_interval": 1, "models": {"m": '
     '{"traffic": {"lengths": {"ids:1": {"buckets": [[9, 3, 1]]}}}}}}', "shortest 9 > longest 3"),
    ('{"format": "tfsupervisor-history/1", "now": 9, "poll_interval": 1, "models": {"m": '
     '{"workers": [{"id": "m-1", "started_at": 0, "ready_at": 1, "life": [[1, 0, 5], '
     '[24996024, 0, 5], [2, 0, 5]]}]}}}',
     "life[2]: time 2 is before the point ahead of it (2.4996e+07)"),
    ('{"format": "something else"}', "not a tfsupervisor history"),
    ('[' * 100_000, "nested too deeply"),
    ('\xff\xfe', "not UTF-8"),
])
def test_hostile_history_files_get_a_clear_error(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], content: str,
        message: str) -> None:
    config, saved = files
    saved.write_bytes(content.encode("latin-1") if content.startswith("\xff")
                      else content.encode())
    assert main(["tune", "-c", str(config), "--history", str(saved)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_a_huge_history_file_is_refused_unread(files: tuple[Path, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    with open(saved, "wb") as f:
        f.truncate(65 * 1024**2)  # sparse: costs no disk
    assert main(["tune", "-c", str(config), "--history", str(saved)]) == 1
    assert "larger than 64 MiB" in capsys.readouterr().err


def test_unknown_models_are_named(files: tuple[Path, Path],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    assert main(["tune", "-c", str(config), "--history", str(saved), "nope"]) == 1
    assert "no model named 'nope' in" in capsys.readouterr().err
    config.write_text(COMMENTED.replace("  m:\n", "  other:\n"))
    assert main(["tune", "-c", str(config), "--history", str(saved), "other"]) == 1
    assert "has no record of model 'other' (recorded: m)" in capsys.readouterr().err


def test_the_snippet_is_valid_yaml_with_its_evidence(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    assert main(["tune", "-c", str(config), "--history", str(saved)]) == 0
    out = capsys.readouterr().out
    snippet = parse_config(out.replace("  m:\n", '  m:\n    handler: "a:b"\n', 1))
    policy = snippet.models["m"].policy
    assert policy.max_memory == parse_size(out.split("max_memory: ")[1].split()[0])
    assert "(now: 2.0GiB)" in out  # each value says what it replaces
    assert config.read_text() == COMMENTED  # without --write, nothing is written


# --- the review's findings: what tune refuses, keeps and says --------------------------------

SHARED = """\
models:
  m:
    handler: "worker.handlers:echo"
    batching: &bat {max_batch_size: 32}
    policy: &pol {max_age: 24h}
  other:
    handler: "worker.handlers:echo"
    batching: *bat
    policy: *pol
"""


def test_write_refuses_a_mapping_other_models_share_through_an_alias(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    config.write_text(SHARED)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 1
    captured = capsys.readouterr()
    assert "shared through a YAML anchor (&" in captured.err
    assert "in place of each alias *" in captured.err and "(models.other." in captured.err
    assert "Traceback" not in captured.err
    assert "+++ " not in captured.out
    assert config.read_text() == SHARED


MERGED = """\
models:
  other: &common
    handler: "worker.handlers:echo"
    batching: {max_batch_size: 32}
    policy: &pol {max_age: 24h}
  m:
    <<: *common
"""


def test_write_refuses_a_section_that_comes_from_a_merge_key(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    config.write_text(MERGED)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 1
    err = capsys.readouterr().err
    assert "models.m.policy comes from a merge key (`<<: *common`) in models.m" in err, err
    assert config.read_text() == MERGED


def test_write_into_a_models_own_mapping_that_merges_a_base(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    text = MERGED.replace("    <<: *common\n", """    handler: "worker.handlers:echo"
    batching: {max_batch_size: 32}
    policy:
      <<: *pol
      max_memory: 2GiB
""")
    config.write_text(text)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    written = parse_config(config.read_text())
    assert written.models["m"].policy.max_memory != 2 * 1024**3  # tuned ...
    assert written.models["m"].policy.max_age == 24 * 3600  # ... still merging the base
    assert written.models["other"].policy == parse_config(text).models["other"].policy
    assert "<<: *pol" in config.read_text()


def foreign_owner(monkeypatch: pytest.MonkeyPatch, config: Path) -> list[tuple[int, int]]:
    """Give the config an owner and group other than this user's: really as root (nobody's),
    otherwise as os.stat reports it (chown then only recorded). Returns the chown calls
    made on the temporary file (as root: empty, the file itself tells)."""
    calls: list[tuple[int, int]] = []
    if os.geteuid() == 0:
        os.chown(config, 65534, 65534)
        return calls
    real_stat = os.stat

    def fake_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        found = real_stat(path, *args, **kwargs)
        if os.path.realpath(path) != os.path.realpath(config):
            return found
        fields = list(found)
        fields[4:6] = [65534, 65534]
        return os.stat_result(fields)

    monkeypatch.setattr("supervisor.cli.tune_write.os.stat", fake_stat)
    monkeypatch.setattr("supervisor.cli.tune_write.os.chown",
                        lambda path, uid, gid: calls.append((uid, gid)))
    return calls


def test_write_keeps_the_files_owner_and_group(
        files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    calls = foreign_owner(monkeypatch, config)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    assert "max_memory" in config.read_text()
    if os.geteuid() == 0:
        found = os.lstat(config)
        assert (found.st_uid, found.st_gid) == (65534, 65534)
    else:
        assert calls == [(65534, 65534)]
    assert stat.S_IMODE(os.lstat(config).st_mode) == 0o640


def test_write_refuses_when_it_cannot_keep_the_owner(
        files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    foreign_owner(monkeypatch, config)

    def refuse(*args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("supervisor.cli.tune_write.os.chown", refuse)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 1
    captured = capsys.readouterr()
    assert "belongs to uid 65534, gid 65534" in captured.err
    assert "the service might then not read it: left unchanged" in captured.err
    assert "+++ " not in captured.out  # no diff shown as if applied
    assert config.read_text() == COMMENTED
    assert [p.name for p in config.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_save_refuses_what_is_not_a_new_regular_file(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    base = ["tune", "-c", str(config), "--history", str(saved)]
    fifo = config.parent / "fifo"
    os.mkfifo(fifo)
    assert main([*base, "--save", str(fifo), "--overwrite"]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert main([*base, "--save", str(config.parent), "--overwrite"]) == 1
    assert "not a regular file" in capsys.readouterr().err
    # the config itself, even with --overwrite and --write
    assert main([*base, "--save", str(config), "--overwrite", "--write"]) == 1
    assert "is the config file itself" in capsys.readouterr().err
    assert config.read_text() == COMMENTED
    # an existing file: only with --overwrite
    kept = config.parent / "kept.json"
    kept.write_text("mine")
    assert main([*base, "--save", str(kept)]) == 1
    assert "the file exists; give a new path, or pass --overwrite" in capsys.readouterr().err
    assert kept.read_text() == "mine"
    assert main([*base, "--save", str(kept), "--overwrite"]) == 0
    assert json.loads(kept.read_text()) == json.loads(saved.read_text())
    fresh = config.parent / "fresh.json"
    assert main([*base, "--save", str(fresh)]) == 0
    assert json.loads(fresh.read_text()) == json.loads(saved.read_text())
    assert [p.name for p in config.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_trend_window_longer_than_the_record_is_tuned_on_what_it_holds() -> None:
    config = model_config(CONFIG + "    policy: {trend_window: 1500}\n")
    raw = history([record("m-1", plateau(), 3200, kept=3000)], now=3200)
    assert len(raw["models"]["m"]["workers"][0]["recent"]) == 1024  # RECENT_POINTS
    tuning = tune(raw, config)
    for key in ("max_memory", "warmup_seconds", "max_growth_per_hour"):
        assert found(tuning, "policy", key).value is not None, found(tuning, "policy", key)
    evidence = found(tuning, "policy", "max_growth_per_hour").evidence
    assert "trend_window 1500 is more than the 1024 recent samples a record holds" in evidence


def test_too_short_a_since_says_only_a_wider_one_helps() -> None:
    raw = history([record("m-1", plateau(), 900)], now=900)
    evidence = found(tune(raw, options=Options(since=5.0)), "policy", "max_memory").evidence
    assert "only a wider --since (at least 122s) or none helps" in evidence, evidence
    assert "s more)" not in evidence


def test_evidence_says_no_zero_gaps_or_empty_spans() -> None:
    config = model_config(CONFIG + "    policy: {trend_window: 8}\n")
    tuning = tune(history([record("m-1", plateau(ramp=0), 40)], now=40), config)
    warmup = found(tuning, "policy", "warmup_seconds").evidence
    assert "0.0s apart" not in warmup and "from its first sample on" in warmup, warmup
    trend = found(tuning, "policy", "max_growth_per_hour").evidence
    assert "spanning 8s)" in trend, trend


def test_headroom_bounds_say_they_are_excluded(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "-c", "config.yaml", "--headroom", "0"])
    assert "above 0% and below 100% (both excluded), got '0'" in capsys.readouterr().err


def diff_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:1] in "+-" and line[:3] not in
            ("---", "+++")]


def test_write_keeps_crlf_line_endings_and_document_markers(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    plain = diff_lines(capsys.readouterr().out)
    config.write_bytes(("---\n" + COMMENTED + "...\n").replace("\n", "\r\n").encode())
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    captured = capsys.readouterr()
    assert diff_lines(captured.out) == plain  # only the tuned lines changed
    assert "CRLF line endings kept" in captured.err
    data = config.read_bytes().decode()
    assert data.count("\r\n") == data.count("\n")
    assert data.startswith("---\r\n") and data.endswith("\r\n...\r\n")


def test_write_keeps_a_four_space_layout(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    wide = COMMENTED.replace("  ", "    ")
    config.write_text(wide)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    assert len(diff_lines(capsys.readouterr().out)) == 8
    assert "\n    m:\n        handler:" in config.read_text()


def test_write_says_it_replaced_a_read_only_file(
        files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    config.chmod(0o444)
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 0
    assert "was read-only (mode 0444): replaced, mode kept" in capsys.readouterr().err
    assert stat.S_IMODE(os.lstat(config).st_mode) == 0o444


def test_write_shows_no_diff_when_it_cannot_write(
        files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files

    def denied(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("supervisor.cli.tune_write.tempfile.mkstemp", denied)  # a read-only dir
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 1
    captured = capsys.readouterr()
    assert "cannot write" in captured.err and "left unchanged" in captured.err
    assert "+++ " not in captured.out
    assert config.read_text() == COMMENTED


def test_write_says_which_user_to_run_it_as(
        files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, saved = files
    run = config.parent / "run"
    config.write_text(COMMENTED.replace("supervisor:\n", f"supervisor:\n  runtime_dir: {run}\n"))
    real = os.access
    monkeypatch.setattr("supervisor.cli.preflight.os.access",
                        lambda path, mode: False if Path(path) == config.parent
                        else real(path, mode))
    assert main(["tune", "-c", str(config), "--history", str(saved), "--write"]) == 1
    err = capsys.readouterr().err
    assert "supervisor.runtime_dir" in err and "by this user" in err
    assert "run it as the daemon's user, or as root" in err
