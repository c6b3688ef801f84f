"""`tfsupervisor tune`: a model's policy and padding from what its workers and traffic did.

Pure: a recorded history (the daemon's ``tune`` control answer, or the same saved as JSON)
and the settings in force in, recommendations out, each with its evidence, or "not enough
data" with what is missing. No clock: the history's own ``now`` is the present.

The rules (docs/policy.md, "Tuning from traffic"):

- **Workers.** Each worker that served is read from its ready time on: its whole-life
  series (evenly spaced, coarsening with age) for its level, rise and settling, and its last
  samples at full resolution for its noise and trend windows. Its *level* is the median
  memory over the last quarter of its watched life; its *noise* the robust spread (1.4826 x
  MAD) of its recent samples around their Theil-Sen line; its *band* the largest of 4 x
  noise, 1 MiB, 0.5 % of the level and 1.5 x the farthest its last quarter strayed from the
  level (a plateau that breathes: caches filled and trimmed). It has *levelled off* when it
  rose no more than its band over the second half of its watched life (Theil-Sen against
  time), and it must have been watched for two trend windows. A worker still rising is a
  slow warm-up or a leak: it is reported, and left out of the limits.
- **warmup_seconds / warmup_jobs.** When a levelled worker last came up into its band
  (every later sample at or above level - band), since ready, in seconds and jobs: the
  slowest worker's, x WARMUP_MARGIN.
- **max_memory.** The highest of the levelled workers' levels and of every sample they
  ever took (loading included: the limit applies then too) + ``headroom``: never under
  what a healthy worker was seen to use.
- **max_growth_per_1k_jobs / max_growth_per_hour.** The policy's own fit (Theil-Sen over
  ``trend_window`` samples) slid over every levelled worker's samples after the tuned
  warm-up: the steepest slope it finds, x ``trend_margin``, at least TREND_FLOOR. The
  policy recycles only when a slope less 4 standard errors exceeds the limit, so a worker
  that behaves as it was seen to is never recycled for its trend.
- **allowed_batch_sizes.** From the batch sizes sent (rows before padding): the fewest
  sizes, max_batch_size among them (config requires it) and the smallest batch seen (an
  idle service's single jobs are never padded), whose padded rows are at most
  ``max_padding`` of all rows sent.
- **padding sizes.** Per variable-length input axis, from the length histogram: the fewest
  sizes, each a length that occurred, the longest among them (and the largest configured
  size kept, so no job admitted today is refused), whose padded positions are at most
  ``max_padding`` of all positions (an upper bound: each job counted at its bucket's
  shortest length).

Every rule needs a minimum of evidence (MIN_* below) and says how much more it needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from supervisor.config.keys import MAX_PAD_SIZE, MAX_WARMUP_SHAPES, ModelConfig
from supervisor.config.units import format_size
from supervisor.core.history import Sample
from supervisor.core.policy import fit, theil_sen
from supervisor.core.traffic import RECENT_POINTS

HISTORY_FORMAT = "tfsupervisor-history/1"

MIB = 1024**2
WARMUP_MARGIN = 1.5
TREND_FLOOR = 4 * MIB  # the smallest trend limit suggested, per 1k jobs and per hour
MIN_BAND = 1 * MIB
BAND_NOISE = 4.0  # a level's band: this many noise sigmas (or MIN_BAND, or BAND_FRACTION)
BAND_FRACTION = 0.005
BAND_SPREAD = 1.5  # ... or half again as far as its last quarter strayed from the level
MIN_BATCHES = 100  # batches sent before allowed_batch_sizes is suggested
MIN_LENGTH_JOBS = 200  # jobs with a length before padding sizes are suggested
MAX_SIZES = 16  # sizes a suggestion holds at most
# Bounds on a history file: past these it is not one the daemon wrote.
MAX_MODELS = 1024
MAX_WORKERS = 1024
MAX_POINTS = 100_000
MAX_BUCKETS = 10_000
MAX_NUMBER = 2**63


class HistoryError(ValueError):
    """A recorded history that cannot be read: says where and what."""


# --- the recorded history ------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerSeries:
    id: str
    started_at: float
    ready_at: float
    ended_at: float | None
    reason: str | None
    jobs: int
    life: tuple[Sample, ...]
    recent: tuple[Sample, ...]


@dataclass(frozen=True)
class LengthHistogram:
    jobs: int
    buckets: tuple[tuple[int, int, int], ...]  # (shortest, longest, jobs), ascending


@dataclass(frozen=True)
class ModelHistory:
    jobs: int
    batch_rows: tuple[tuple[int, int], ...]  # (rows, batches)
    lengths: Mapping[str, LengthHistogram]  # "input:axis" -> histogram
    workers: tuple[WorkerSeries, ...]


@dataclass(frozen=True)
class Recorded:
    now: float
    poll_interval: float
    models: Mapping[str, ModelHistory]


def _number(value: object, where: str, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HistoryError(f"{where}: expected a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise HistoryError(f"{where}: expected a finite number, got {value}")
    if integer and not isinstance(value, int):
        raise HistoryError(f"{where}: expected an integer, got {value!r:.40}")
    if abs(value) >= MAX_NUMBER:
        raise HistoryError(f"{where}: {value:.3g} is out of range")
    return value


def _int(value: object, where: str) -> int:
    number = _number(value, where, integer=True)
    if number < 0:
        raise HistoryError(f"{where}: expected an integer >= 0, got {number}")
    return int(number)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise HistoryError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: object, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise HistoryError(f"{where}: expected a list, got {type(value).__name__}")
    if len(value) > limit:
        raise HistoryError(f"{where}: {len(value)} items, more than the {limit} a recorded "
                           "history holds")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise HistoryError(f"{where}: expected a name (1 to 256 characters)")
    return value


def _points(raw: object, where: str) -> tuple[Sample, ...]:
    points: list[Sample] = []
    for i, item in enumerate(_list(raw, where, MAX_POINTS)):
        here = f"{where}[{i}]"
        triple = _list(item, here, 3)
        if len(triple) != 3:
            raise HistoryError(f"{here}: expected [time, jobs, memory]")
        point = Sample(float(_number(triple[0], f"{here}[0]")), _int(triple[1], f"{here}[1]"),
                       _int(triple[2], f"{here}[2]"))
        if points and point.t < points[-1].t:  # the daemon records them in time order
            raise HistoryError(f"{here}: time {point.t:g} is before the point ahead of it "
                               f"({points[-1].t:g}): not a series the daemon recorded")
        points.append(point)
    return tuple(points)


def _worker(raw: object, where: str) -> WorkerSeries | None:
    w = _mapping(raw, where)
    ready = w.get("ready_at")
    if ready is None:
        return None  # never served: nothing to learn from its memory
    ended = w.get("ended_at")
    reason = w.get("reason")
    return WorkerSeries(
        _text(w.get("id"), f"{where}.id"),
        float(_number(w.get("started_at"), f"{where}.started_at")),
        float(_number(ready, f"{where}.ready_at")),
        None if ended is None else float(_number(ended, f"{where}.ended_at")),
        None if reason is None else _text(reason, f"{where}.reason"),
        _int(w.get("jobs", 0), f"{where}.jobs"),
        _points(w.get("life", []), f"{where}.life"),
        _points(w.get("recent", []), f"{where}.recent"))


def _model(raw: object, where: str) -> ModelHistory:
    m = _mapping(raw, where)
    traffic = _mapping(m.get("traffic", {}), f"{where}.traffic")
    rows = []
    for i, item in enumerate(_list(traffic.get("batch_rows", []), f"{where}.traffic.batch_rows",
                                   MAX_BUCKETS)):
        pair = _list(item, f"{where}.traffic.batch_rows[{i}]", 2)
        if len(pair) != 2:
            raise HistoryError(f"{where}.traffic.batch_rows[{i}]: expected [rows, batches]")
        rows.append((_int(pair[0], f"{where}.traffic.batch_rows[{i}][0]"),
                     _int(pair[1], f"{where}.traffic.batch_rows[{i}][1]")))
    lengths = {}
    for key, hist in _mapping(traffic.get("lengths", {}), f"{where}.traffic.lengths").items():
        here = f"{where}.traffic.lengths.{_text(key, f'{where}.traffic.lengths')}"
        h = _mapping(hist, here)
        found = []
        for i, item in enumerate(_list(h.get("buckets", []), f"{here}.buckets", MAX_BUCKETS)):
            triple = _list(item, f"{here}.buckets[{i}]", 3)
            if len(triple) != 3:
                raise HistoryError(f"{here}.buckets[{i}]: expected [shortest, longest, jobs]")
            low, high, n = (_int(v, f"{here}.buckets[{i}][{j}]") for j, v in enumerate(triple))
            if low > high:
                raise HistoryError(f"{here}.buckets[{i}]: shortest {low} > longest {high}")
            found.append((low, high, n))
        lengths[key] = LengthHistogram(_int(h.get("jobs", 0), f"{here}.jobs"),
                                       tuple(sorted(found)))
    workers = [_worker(w, f"{where}.workers[{i}]")
               for i, w in enumerate(_list(m.get("workers", []), f"{where}.workers", MAX_WORKERS))]
    return ModelHistory(_int(traffic.get("jobs", 0), f"{where}.traffic.jobs"),
                        tuple(sorted(rows)), lengths, tuple(w for w in workers if w is not None))


def parse_history(raw: object) -> Recorded:
    """A recorded history, checked whole; HistoryError says what is wrong and where."""
    top = _mapping(raw, "history")
    if top.get("format") != HISTORY_FORMAT:
        raise HistoryError(f"history: not a tfsupervisor history (expected format "
                           f"{HISTORY_FORMAT!r}, got {str(top.get('format'))[:40]!r})")
    models = _mapping(top.get("models"), "history.models")
    if len(models) > MAX_MODELS:
        raise HistoryError(f"history.models: more than {MAX_MODELS} models")
    poll = float(_number(top.get("poll_interval"), "history.poll_interval"))
    if poll <= 0:
        raise HistoryError("history.poll_interval: expected a number of seconds > 0")
    return Recorded(float(_number(top.get("now"), "history.now")), poll,
                    {_text(name, "history.models"): _model(m, f"history.models.{name}")
                     for name, m in models.items()})


# --- recommendations -----------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    max_padding: float = 0.10  # padded fraction allowed (rows, positions)
    headroom: float = 0.25  # max_memory over the highest healthy figure
    trend_margin: float = 2.0  # trend limits over the steepest healthy slope
    since: float | None = None  # seconds before the history's now; None: all of it


@dataclass(frozen=True)
class Finding:
    """One setting (a path under models.NAME), its suggested value (None: no suggestion,
    then ``evidence`` says why) and the evidence, in words."""

    path: tuple[str, ...]
    value: Any
    evidence: str
    write: bool = True  # False: shown for review only (a new padding block)


@dataclass
class ModelTuning:
    model: str
    summary: str
    findings: list[Finding] = field(default_factory=list)


@dataclass(frozen=True)
class Worker:
    """One worker as the rules read it."""

    id: str
    ready_at: float
    reason: str | None
    samples: tuple[Sample, ...]  # from ready on, life and recent merged
    recent: tuple[Sample, ...]  # full resolution, from ready on
    peak: int  # every sample, loading included
    watched: float  # seconds from its first to its last sample after ready
    level: float | None = None
    noise: float | None = None
    band: float | None = None
    rise: float | None = None  # over the second half of its watched life
    settled_after: tuple[float, int] | None = None  # (seconds, jobs) from ready
    state: str = "young"  # young | rising | level


def size_text(nbytes: float) -> str:
    """Whole MiB, rounded up, as config takes it."""
    return f"{max(1, math.ceil(nbytes / MIB))}MiB"


def duration_text(seconds: float) -> str:
    whole = max(1, math.ceil(seconds))
    if whole >= 120 and whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{whole}s"


def read_worker(series: WorkerSeries, window: int, poll: float,
                cutoff: float | None, samples: int | None = None) -> Worker:
    """Classify one worker (see the module's docstring). ``samples``: the recent samples
    it needs (default ``window``; fewer where the record holds fewer than a window)."""
    samples = window if samples is None else samples
    keep = (lambda s: s.t >= cutoff) if cutoff is not None else (lambda s: True)
    every = [s for s in (*series.life, *series.recent) if keep(s)]
    peak = max((s.memory for s in every), default=0)
    recent = tuple(s for s in series.recent if s.t >= series.ready_at and keep(s))
    # The life's points are evenly spaced (every stride-th sample): the level, the rise and
    # the settling are read on them (and the last sample), so the dense recent samples do
    # not outweigh the rest of the life.
    after = tuple(s for s in series.life if s.t >= series.ready_at and keep(s))
    if recent and (not after or recent[-1].t > after[-1].t):
        after = (*after, recent[-1])
    watched = after[-1].t - after[0].t if len(after) >= 2 else 0.0
    worker = Worker(series.id, series.ready_at, series.reason, after, recent, peak, watched)
    if watched < 2 * window * poll or len(recent) < samples:
        return worker
    end = after[-1].t
    last = [s.memory for s in after if s.t >= end - watched / 4]
    level = float(np.median(last))
    noise = _noise(recent)
    spread = max(abs(m - level) for m in last)
    band = max(BAND_NOISE * noise, MIN_BAND, BAND_FRACTION * level, BAND_SPREAD * spread)
    second = [s for s in after if s.t >= end - watched / 2]
    slope = theil_sen(np.array([s.t for s in second]), np.array([s.memory for s in second],
                                                                  dtype=float)) or 0.0
    rise = slope * (second[-1].t - second[0].t)
    state = "rising" if rise > band else "level"
    settled = None
    # (a worker ready before --since's cutoff shows only part of its way to the level)
    if state == "level" and (cutoff is None or series.ready_at >= cutoff):
        index = len(after)
        while index > 0 and after[index - 1].memory >= level - band:
            index -= 1
        first = after[min(index, len(after) - 1)]
        settled = (first.t - series.ready_at, first.jobs - after[0].jobs)
    return Worker(series.id, series.ready_at, series.reason, after, recent, peak, watched,
                  level, noise, band, rise, settled, state)


def _noise(samples: Sequence[Sample]) -> float:
    t = np.array([s.t for s in samples])
    y = np.array([s.memory for s in samples], dtype=float)
    slope = theil_sen(t, y) or 0.0
    residuals = y - slope * t
    residuals -= np.median(residuals)
    return 1.4826 * float(np.median(np.abs(residuals)))


def tune_model(name: str, history: ModelHistory, config: ModelConfig, recorded: Recorded,
               options: Options) -> ModelTuning:
    policy = config.policy
    window, poll = policy.trend_window, recorded.poll_interval
    # A record holds RECENT_POINTS samples at full resolution: a longer trend_window is
    # tuned on windows of that many (said in the evidence)
    samples = min(window, RECENT_POINTS)
    cutoff = recorded.now - options.since if options.since is not None else None
    series = [w for w in history.workers
              if cutoff is None or w.ended_at is None or w.ended_at >= cutoff]
    workers = [read_worker(w, window, poll, cutoff, samples) for w in series]
    level = [w for w in workers if w.state == "level"]
    rising = [w for w in workers if w.state == "rising"]
    young = [w for w in workers if w.state == "young"]
    gone = sum(1 for w in series if w.ended_at is not None)
    summary = (f"{len(series)} worker(s) that served ({gone} gone), {history.jobs:,} jobs "
               f"admitted since the daemon started; {len(level)} levelled off, "
               f"{len(rising)} still rising, {len(young)} watched too briefly")
    tuning = ModelTuning(name, summary)
    tuning.findings += _workers_found(workers)
    wait = _Wait(window, poll, samples, options.since)
    warmup, settled = _warmup(level, rising, young, wait)
    tuning.findings += warmup
    tuning.findings += _max_memory(level, rising, young, config, options, wait)
    seconds, jobs = settled if settled is not None else \
        (policy.warmup_seconds, policy.warmup_jobs)
    tuning.findings += _trends(level, rising, wait, options, seconds, jobs)
    tuning.findings += _batch_sizes(history, config, options)
    tuning.findings += _padding(history, config, options)
    return tuning


@dataclass(frozen=True)
class _Wait:
    """What a worker must show before it counts: watched 2 x window polls, with
    ``samples`` recent samples; ``since``: the stretch --since keeps."""

    window: int
    poll: float
    samples: int
    since: float | None


def _watch_more(workers: Sequence[Worker], wait: _Wait) -> str:
    need = 2 * wait.window * wait.poll
    longest = max((w.watched for w in workers), default=0.0)
    recent = max((len(w.recent) for w in workers), default=0)
    if wait.since is not None and wait.since < need:
        more = (f"--since {wait.since:g}s is shorter than that: only a wider --since (at "
                f"least {duration_text(need + 2 * wait.poll)}) or none helps")
    elif longest < need:
        more = f"{need - longest:.0f}s more"
    else:
        more = f"{max(0, wait.samples - recent)} samples more"
    return (f"need a worker watched {need:.0f}s after ready (2 x trend_window {wait.window} x "
            f"poll {wait.poll:g}s) with {wait.samples} recent samples; the longest so far: "
            f"{longest:.0f}s, {recent} samples ({more})")


def _workers_found(workers: Sequence[Worker]) -> list[Finding]:
    """Notes on workers that are not used (still rising): the evidence of a leak."""
    notes = []
    for w in workers:
        if w.state != "rising" or w.rise is None:
            continue
        per_hour = w.rise / max(w.watched / 2, 1e-9) * 3600
        left = f", then left ({w.reason})" if w.reason else ""
        notes.append(Finding(("note",), None, f"{w.id} was still rising: +{format_size(w.rise)}"
                             f" over the second half of its {w.watched:.0f}s watched "
                             f"({format_size(per_hour)}/h){left}; a slow warm-up or a leak "
                             "(`tfsupervisor explain`); left out of the limits"))
    return notes


def _not_enough(path: tuple[str, ...], why: str) -> Finding:
    return Finding(path, None, f"not enough data: {why}")


def _warmup(level: Sequence[Worker], rising: Sequence[Worker], young: Sequence[Worker],
            wait: _Wait) -> tuple[list[Finding], tuple[float, int] | None]:
    """The findings, and the warm-up suggested (seconds, jobs) when there is one."""
    paths = (("policy", "warmup_seconds"), ("policy", "warmup_jobs"))
    if not level:
        why = _no_level(rising, young, wait)
        return [_not_enough(p, why) for p in paths], None
    timed = [w for w in level if w.settled_after is not None]
    if not timed:
        why = "no levelled worker became ready within --since: its way up is not in it"
        return [_not_enough(p, why) for p in paths], None
    slowest = max(timed, key=lambda w: w.settled_after[0] if w.settled_after else 0.0)
    seconds = max(w.settled_after[0] for w in timed if w.settled_after)
    jobs = max(w.settled_after[1] for w in timed if w.settled_after)
    resolution = max(_resolution(w) for w in timed)
    value_s = max(1, math.ceil(max(seconds * WARMUP_MARGIN, wait.poll)))
    value_j = math.ceil(jobs * WARMUP_MARGIN)
    where = (f"{len(timed)} levelled worker(s): the slowest ({slowest.id}) stayed within "
             f"{format_size(slowest.band)} of its level {format_size(slowest.level)} from "
             f"{seconds:.0f}s and {jobs:,} jobs after ready " +
             (f"(samples {resolution:.1f}s apart there)" if resolution > 0 else
              "(from its first sample on)"))
    return [Finding(paths[0], duration_text(value_s), f"{where}; times {WARMUP_MARGIN:g}"),
            Finding(paths[1], value_j, f"the slowest worker's {jobs:,} jobs to its level "
                    f"times {WARMUP_MARGIN:g}")], (float(value_s), value_j)


def _resolution(w: Worker) -> float:
    if w.settled_after is None or len(w.samples) < 2:
        return 0.0
    t = w.ready_at + w.settled_after[0]
    gaps = [b.t - a.t for a, b in zip(w.samples, w.samples[1:], strict=False) if b.t <= t + 1e-9]
    return max(gaps, default=0.0)


def _no_level(rising: Sequence[Worker], young: Sequence[Worker], wait: _Wait) -> str:
    if rising:
        return (f"no worker levelled off ({len(rising)} still rising: "
                f"{', '.join(w.id for w in rising[:4])}); watch a healthy worker longer, or "
                "fix the leak")
    return f"no worker watched long enough: {_watch_more(young, wait)}"


def _max_memory(level: Sequence[Worker], rising: Sequence[Worker], young: Sequence[Worker],
                config: ModelConfig, options: Options, wait: _Wait) -> list[Finding]:
    path = ("policy", "max_memory")
    if not level:
        return [_not_enough(path, _no_level(rising, young, wait))]
    top = max(level, key=lambda w: w.level or 0.0)
    high = max(level, key=lambda w: w.peak)
    base = max(top.level or 0.0, float(high.peak))
    value = max(1, math.ceil(base * (1 + options.headroom) / MIB)) * MIB
    found = [Finding(path, size_text(value),
                     f"highest level {format_size(top.level)} ({top.id}, median of its last "
                     f"{top.watched / 4:.0f}s), highest sample {format_size(high.peak)} "
                     f"({high.id}, loading included); + {options.headroom:.0%} headroom")]
    kill = config.policy.kill_memory
    if kill is not None and kill <= value:
        found.append(Finding(("policy", "kill_memory"), size_text(value * 1.25),
                             f"must stay above max_memory: {format_size(kill)} is not; "
                             "max_memory x 1.25"))
    return found


def _windows(samples: Sequence[Sample], window: int) -> list[tuple[float, float]]:
    """(per job, per second) Theil-Sen slopes over every run of ``window`` samples (a
    stride of a quarter window): the policy's own fit, slid along."""
    found = []
    step = max(1, window // 4)
    for start in range(0, len(samples) - window + 1, step):
        part = samples[start:start + window]
        memory = np.array([s.memory for s in part], dtype=float)
        per_job = fit(np.array([s.jobs for s in part], dtype=float), memory)
        per_second = fit(np.array([s.t for s in part]), memory)
        found.append((per_job.value if per_job else math.nan,
                      per_second.value if per_second else math.nan))
    return found


def _trends(level: Sequence[Worker], rising: Sequence[Worker], wait: _Wait, options: Options,
            warmup_seconds: float, warmup_jobs: int) -> list[Finding]:
    # window: the samples a fit spans here, trend_window or the fewer a record holds
    trend_window, window, poll = wait.window, wait.samples, wait.poll
    paths = (("policy", "max_growth_per_1k_jobs"), ("policy", "max_growth_per_hour"))
    if not level:
        return [_not_enough(p, "no worker levelled off (see max_memory)") for p in paths]
    slopes: list[tuple[float, float]] = []
    used = []
    longest = 0.0
    for w in level:
        def warm(samples: Sequence[Sample], w: Worker = w) -> list[Sample]:
            return [s for s in samples if s.t >= w.ready_at + warmup_seconds
                    and s.jobs - w.samples[0].jobs >= warmup_jobs]
        # The recent samples at full resolution (the policy's own windows), and the life's
        # evenly spaced points (windows as many points long, spanning more time: slow drifts)
        found = _windows(warm(w.recent), window)
        life = warm(w.samples)
        found += _windows(life, window)
        if found:
            used.append(w.id)
            slopes += found
        if len(life) >= window:
            longest = max(longest, max(b.t - a.t for a, b in zip(
                life, life[window - 1:], strict=False)))
    if not slopes:
        why = (f"no levelled worker has {window} recent samples (trend_window) after the "
               f"warm-up above; watch {window * poll:.0f}s more")
        return [_not_enough(p, why) for p in paths]
    shorter = (f"; trend_window {trend_window} is more than the {RECENT_POINTS} recent "
               f"samples a record holds: fitted on windows of {window} (steeper than the "
               "policy's longer windows see: a looser limit)" if window < trend_window else "")
    low, high = window * poll, max(longest, window * poll)
    spanning = f"{low:.0f}s" if f"{low:.0f}" == f"{high:.0f}" else f"{low:.0f}s to {high:.0f}s"
    findings = []
    for index, (path, scale, unit) in enumerate(zip(paths, (1000.0, 3600.0),
                                                    ("per 1k jobs", "per hour"), strict=True)):
        values = [s[index] * scale for s in slopes if math.isfinite(s[index])]
        if not values:
            findings.append(_not_enough(path, "no window with distinct job counts (no traffic "
                                        "while watched)"))
            continue
        steepest = max(values)
        limit = max(TREND_FLOOR, steepest * options.trend_margin)
        floor = f" (floor {format_size(TREND_FLOOR)})" if limit == TREND_FLOOR else ""
        caught = [f"{w.id} {format_size(r)}" for w in rising
                  if (r := _rising_rate(w, index)) is not None and r <= limit]
        warn = (f"; WARNING: {', '.join(caught)} {unit} (still rising) would pass under it"
                if caught else "")
        findings.append(Finding(path, size_text(limit),
                                f"steepest of {len(values)} windows of {window} samples on "
                                f"{', '.join(used)} after warm-up (spanning {spanning}): "
                                f"{format_size(steepest)} {unit}; times {options.trend_margin:g}"
                                f"{floor}{warn}{shorter}"))
    return findings


def _rising_rate(w: Worker, index: int) -> float | None:
    """A rising worker's slope over its last half, per 1k jobs (0) or per hour (1)."""
    half = [s for s in w.samples if s.t >= w.samples[-1].t - w.watched / 2]
    x = np.array([s.jobs if index == 0 else s.t for s in half], dtype=float)
    slope = theil_sen(x, np.array([s.memory for s in half], dtype=float))
    return None if slope is None else slope * (1000.0 if index == 0 else 3600.0)


# --- sizes ---------------------------------------------------------------------------------

def fewest_sizes(groups: Sequence[tuple[int, int, int]], target: float, largest: int,
                 max_sizes: int, keep_first: bool = False) -> tuple[list[int], float]:
    """The fewest sizes (each a group's longest, and ``largest`` the last) whose padding is
    at most ``target`` of all padded elements, counting each group at its shortest; past
    ``max_sizes`` the best that many can do. ``keep_first``: the first group is a size of
    its own. Returns (sizes, padded fraction)."""
    items = sorted(g for g in groups if g[2] > 0)
    if not items or items[-1][1] < largest:
        items.append((largest, largest, 0))
    lows = np.array([g[0] for g in items], dtype=float)
    highs = np.array([g[1] for g in items], dtype=float)
    counts = np.array([g[2] for g in items], dtype=float)
    n = len(items)
    cum_c = np.concatenate([[0.0], np.cumsum(counts)])
    cum_l = np.concatenate([[0.0], np.cumsum(counts * lows)])
    real = cum_l[-1]

    def cost(first: np.ndarray, last: int) -> np.ndarray:
        """Padding of groups first..last (inclusive) padded to highs[last]."""
        padded: np.ndarray = highs[last] * (cum_c[last + 1] - cum_c[first]) - \
            (cum_l[last + 1] - cum_l[first])
        return padded

    # best[k][j]: the least padding of groups 0..j with k + 1 sizes, the last highs[j]
    best = [np.array([cost(np.array([0]), j)[0] if j == 0 or not keep_first else math.inf
                      for j in range(n)])]
    choice: list[np.ndarray] = [np.full(n, -1)]
    for k in range(1, min(max_sizes, n)):
        if _fraction(best[-1][n - 1], real) <= target:
            break
        prev = best[-1]
        row = np.full(n, math.inf)
        arg = np.full(n, -1)
        for j in range(k, n):
            starts = np.arange(k, j + 1)  # the last size's first group
            totals = prev[starts - 1] + cost(starts, j)
            pick = int(np.argmin(totals))
            row[j], arg[j] = totals[pick], starts[pick]
        best.append(row)
        choice.append(arg)
    k = len(best) - 1
    sizes, j = [], n - 1
    while k >= 0:
        sizes.append(int(highs[j]))
        j = int(choice[k][j]) - 1
        k -= 1
    return sorted(sizes), float(_fraction(best[-1][n - 1], real))


def _fraction(padding: float, real: float) -> float:
    if not math.isfinite(padding):
        return 1.0
    total = padding + real
    return float(padding / total) if total > 0 else 0.0


def _short(padded: float, target: float, sizes: Sequence[int]) -> str:
    """What to say when the target could not be met within the sizes allowed."""
    if padded <= target:
        return ""
    return f"; the target needs more than {len(sizes)} sizes: these are the best that many do"


def _batch_sizes(history: ModelHistory, config: ModelConfig, options: Options) -> list[Finding]:
    path = ("batching", "allowed_batch_sizes")
    largest = config.batching.max_batch_size
    rows = [(r, n) for r, n in history.batch_rows if 1 <= r <= largest]
    sent = sum(n for _, n in rows)
    if largest == 1:
        return []
    if sent < MIN_BATCHES:
        return [_not_enough(path, f"{sent} batches sent; need {MIN_BATCHES} "
                            f"({MIN_BATCHES - sent} more)")]
    # The smallest batch is never padded: an idle service sends single jobs, and padding
    # them would add to every quiet request's latency.
    sizes, padded = fewest_sizes([(r, r, n) for r, n in rows], options.max_padding, largest,
                                 MAX_SIZES, keep_first=True)
    powers = sorted({min(2**i, largest) for i in range(largest.bit_length() + 1)})
    default = _padded([(r, r, n) for r, n in rows], powers)
    common = ", ".join(f"{r} ({n / sent:.0%})" for r, n in sorted(rows, key=lambda x: -x[1])[:4])
    return [Finding(path, sizes, f"{sent:,} batches sent, most often of {common} rows; "
                    f"these {len(sizes)} sizes pad {padded:.1%} of rows (target <= "
                    f"{options.max_padding:.0%}), powers of two ({len(powers)} sizes) "
                    f"{default:.1%}{_short(padded, options.max_padding, sizes)}")]


def _padded(groups: Sequence[tuple[int, int, int]], sizes: Sequence[int]) -> float:
    padding = real = 0.0
    for low, _, n in groups:
        size = next((s for s in sorted(sizes) if s >= low), low)
        padding += n * (size - low)
        real += n * low
    return _fraction(padding, real)


def _padding(history: ModelHistory, config: ModelConfig, options: Options) -> list[Finding]:
    found = []
    configured = {(name, axis): dim for dim, c in config.padding.items()
                  for name, axis in c.inputs.items()}
    shapes_per_size = len(config.warmup_batch_sizes)
    for key, hist in sorted(history.lengths.items()):
        name, _, axis_text = key.rpartition(":")
        axis = int(axis_text) if axis_text.isdigit() else -1
        dim = configured.get((name, axis))
        path = ("padding", dim, "sizes") if dim else ("padding", name, "sizes")
        jobs = sum(n for _, _, n in hist.buckets)
        if jobs < MIN_LENGTH_JOBS:
            found.append(_not_enough(path, f"{jobs} jobs with a length on {key}; need "
                                     f"{MIN_LENGTH_JOBS} ({MIN_LENGTH_JOBS - jobs} more)"))
            continue
        longest = max(high for _, high, _ in hist.buckets)
        current = max(config.padding[dim].sizes) if dim else 0
        largest = min(MAX_PAD_SIZE, max(longest, current))
        others = math.prod(len(c.sizes) for d, c in config.padding.items() if d != dim)
        room = max(1, MAX_WARMUP_SHAPES // max(1, shapes_per_size * others))
        sizes, padded = fewest_sizes(hist.buckets, options.max_padding, largest,
                                     min(MAX_SIZES, room))
        shortest = min(low for low, _, _ in hist.buckets)
        median = _quantile(hist.buckets, 0.5)
        p90 = _quantile(hist.buckets, 0.9)
        kept = (f"; {current} kept as the largest (configured; longest seen {longest})"
                if current > longest else "")
        evidence = (f"{jobs:,} jobs on {key}: lengths {shortest}..{longest}, median about "
                    f"{median}, 90% under about {p90}; these {len(sizes)} sizes pad at most "
                    f"{padded:.1%} of positions (target <= {options.max_padding:.0%}){kept}"
                    f"{_short(padded, options.max_padding, sizes)}")
        if dim is None:
            evidence += ("; '" + name + "' is not padded yet: a padding needs the model to "
                         "ignore padded positions (a mask or lengths input, docs/batching.md), "
                         "so this is shown, not written")
        found.append(Finding(path, sizes, evidence, write=dim is not None))
    return found


def _quantile(buckets: Sequence[tuple[int, int, int]], q: float) -> int:
    total = sum(n for _, _, n in buckets)
    seen = 0
    for _, high, n in buckets:
        seen += n
        if seen >= q * total:
            return high
    return buckets[-1][1] if buckets else 0
