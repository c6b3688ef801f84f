"""The recycling policy: pure. Samples and settings in, a verdict with its reason out.

No clocks, no I/O: the time is passed in. Hard limits (``kill_memory``, ``max_memory``,
``max_vram``) and lifetime limits (``max_jobs``, ``max_age`` with jitter) are plain
comparisons; the rest of this docstring is about trends (docs/policy.md).

The window
----------
- Only samples after warm-up count (both ``warmup_jobs`` and ``warmup_seconds`` passed),
  or after ready when the warm-up's growth is the worker's own tracing (see *Explained
  warm-up*), the last ``trend_window`` of them: a full window without ``max_memory`` (nothing is
  urgent, and a ramp that levels off within it shows a flat second half), at least half
  a window with it (the time to the limit says when to act).

The fit
-------
- The slope is Theil-Sen (median of pairwise slopes), so one spike moves it little.
- A trend is *confident* only when both halves of the window, fitted on their own, are
  over the limit too. A step (flat, jump, flat) has two flat halves; a warm-up ramp that
  levels off has a flat second half; a steady leak has two steep halves.

Explained warm-up
-----------------
- Warm-up exists because TensorFlow allocates on the first calls of each input shape. Growth
  that came with new traced graphs is not that: a ``tf.function`` without input_signature
  traces (and keeps) a graph per shape, and a SavedModel's restored function does so for
  every length a text service sends. When at least EXPLAINED_BYTES grew since ready, more
  graphs were traced than a bounded set of shapes does (MIN_NEW_GRAPHS, and GRAPHS_PER_SHAPE
  per shape the model's settings allow), their count rose between MIN_RISES pairs of probe
  readings or more, and WITH_GRAPHS of the growth came between readings that counted new
  graphs, the warm-up is over from ready: the baseline is the
  pre-growth level and the trend is judged from ready (the seed's encoder grew 567 → 1,300
  MiB inside a 30 s warm-up and its baseline was taken at 1.2 GiB). Once so, it stays so.

Decay
-----
- Growth that is decaying (second half slower than the first) is projected as a geometric
  series; if it levels off under ``max_memory``, it is not a leak. Without ``max_memory``
  there is no ceiling to project to, but a series that converges is not a leak at any growth
  limit: growth whose second half is at most DECAYING of its first (over a full window;
  scaled for a shorter one) is left alone (a warm-up ramp that levels off after "ready",
  such as Keras ``predict()``'s).

The lead
--------
- With ``max_memory`` set, the worker lives as long as it safely can: a trend is acted on
  only when the projected time to ``max_memory`` is under the lead its replacement needs
  (``trend_lead`` times the worker's own measured start-up, for each turn of recycles the
  model's workers may need, plus the confirmations' polls), and never for growth that would
  not reach it within ``trend_horizon``. VRAM trends are judged on their own limit.

Confirmation
------------
- The condition must hold on ``trend_confirmations`` evaluations in a row (the caller keeps
  the streak and passes it back in).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np

from supervisor.config.keys import PolicyConfig
from supervisor.core.history import Sample
from supervisor.core.reasons import Reason

MIN_TREND_SAMPLES = 6
# How many standard errors a slope must clear its limit by: noise alone must not recycle.
CONFIDENCE_Z = 4.0
# Without max_memory, growth whose second half is at most this fraction of its first is a
# converging series, not a leak. A steady leak's halves agree to within noise (the halves'
# ratio of a leak 4 standard errors over its limit stays above ~0.7), so halving within one
# half-window is decay, not chance; a leak that only pauses shows steep halves again as the
# window moves on, and is recycled then.
DECAYING = 0.5
# The fewest samples in a window whose halves may show decay: fewer, and a noisy steady
# leak's halves differ by chance (with trend_window 8, one leak in four was never recycled).
MIN_DECAY_SAMPLES = 20
# Explained warm-up (see the module docstring): traced graphs since ready, more than this
# and more than GRAPHS_PER_SHAPE per input shape the model's settings allow
# (WorkerFacts.shapes). A tf.function without input_signature served at a bounded set of
# batch and padding sizes traces one graph per size on its first call after ready and takes
# its per-shape memory then (~400 MiB for an encoder at 4 batch sizes): that is warm-up,
# what warmup_seconds is for, however large. Only more graphs than such a set traces is
# tracing without a bound ...
MIN_NEW_GRAPHS = 32
# ... (a tf.function that calls another traces both per shape: a SavedModel's signature
# wrapper and its restored function) ...
GRAPHS_PER_SHAPE = 2
# ... in this many intervals between readings or more (a shape set seen at once, or readings
# far apart, put one interval's growth, whatever it was, down to its graphs) ...
MIN_RISES = 3
# ... the growth since ready that counts (a few shapes of a small model trace a few MiB of
# graphs: that is warm-up) ...
EXPLAINED_BYTES = 64 * 1024**2
# ... and the share of it that came with new graphs.
WITH_GRAPHS = 0.5


class Ruling(Enum):
    KEEP = "keep"
    RECYCLE = "recycle"  # graceful: replacement first, drain, stop
    KILL = "kill"  # hard: SIGKILL now, requeue its jobs


@dataclass(frozen=True)
class WorkerFacts:
    """What the policy needs to know about one worker besides its samples."""

    started_at: float  # when spawned: max_age counts from here
    jobs: int
    jitter: float  # this worker's fraction off max_jobs / max_age
    trend_streak: int = 0  # consecutive evaluations a trend limit was over
    ready_at: float | None = None  # warm-up counts from here (spawn time if not given)
    baseline: int | None = None  # as measured once before (the history is bounded: its
    # oldest warmed-up sample moves on, the first one does not)
    # Replacements that may have to start one after the other before this worker's can
    # (workers in lockstep, max_concurrent_recycles at a time): the lead waits for them all.
    recycle_turns: int = 1
    # Its warm-up's growth was found to be its own tracing (kept, like the baseline).
    warmup_explained: bool = False
    # Distinct input shapes its model's settings let it see: allowed batch sizes times every
    # combination of padding sizes (ModelConfig.input_shapes; 0: not known). Graphs traced
    # once for each are warm-up, not retracing.
    shapes: int = 0


@dataclass(frozen=True)
class Slope:
    """A fitted slope with the two half-window fits that make it confident or not."""

    value: float  # bytes per x unit over the whole window
    first_half: float
    second_half: float
    span: float  # x covered by the window (jobs or seconds)
    stderr: float  # robust standard error of ``value`` (MAD of the residuals)

    def confidently_over(self, limit: float) -> bool:
        """Over the limit beyond noise (CONFIDENCE_Z standard errors), in both halves as well."""
        return self.value - CONFIDENCE_Z * self.stderr > limit and \
            min(self.first_half, self.second_half) > limit


@dataclass(frozen=True)
class Assessment:
    """The numbers behind a verdict, shown by `status` and logged with every recycle."""

    memory: int | None = None
    vram: int | None = None
    # The worker's memory at its first sample after the policy's warm-up (warmup_jobs and
    # warmup_seconds after ready), kept for its life: what max_memory is tuned against.
    baseline: int | None = None
    warmed_up: bool = False
    # The warm-up ended at ready: its growth came with traced graphs (Explained warm-up).
    warmup_explained: bool = False
    window: int = 0  # samples in the trend window
    growth_per_1k_jobs: float | None = None  # bytes
    growth_per_hour: float | None = None  # bytes
    vram_growth_per_1k_jobs: float | None = None
    # To max_memory, at the steeper of the window's time slope and its recent half's.
    seconds_to_limit: float | None = None
    # How close to max_memory a trend may let the worker come (lead_seconds below): a trend
    # recycle waits until seconds_to_limit is under it.
    lead_seconds: float | None = None

    def fields(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if v is not None}
        for key in ("growth_per_1k_jobs", "growth_per_hour", "vram_growth_per_1k_jobs",
                    "seconds_to_limit", "lead_seconds"):
            if key in out:
                out[key] = round(out[key], 1)
        return out


@dataclass(frozen=True)
class Verdict:
    ruling: Ruling
    reason: Reason | None  # None when the ruling is KEEP
    detail: str
    assessment: Assessment = field(default_factory=Assessment)
    trend_streak: int = 0


def theil_sen(x: np.ndarray, y: np.ndarray) -> float | None:
    """Median of pairwise slopes over pairs with distinct x; None if there are none."""
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx > 0
    if not keep.any():
        return None
    return float(np.median((y[j] - y[i])[keep] / dx[keep]))


def fit(x: np.ndarray, y: np.ndarray) -> Slope | None:
    """Whole-window and half-window Theil-Sen slopes of y against x."""
    half = len(x) // 2
    whole = theil_sen(x, y)
    first = theil_sen(x[:half], y[:half])
    second = theil_sen(x[half:], y[half:])
    if whole is None or first is None or second is None:
        return None
    residuals = y - whole * x
    residuals -= np.median(residuals)
    scale = 1.4826 * float(np.median(np.abs(residuals)))  # robust sigma of the noise
    spread = float(np.sqrt(np.sum((x - x.mean()) ** 2)))
    stderr = scale / spread if spread > 0 else math.inf
    return Slope(whole, first, second, float(x[-1] - x[0]), stderr)


def warmed_up(samples: Sequence[Sample], facts: WorkerFacts, policy: PolicyConfig) -> list[Sample]:
    """Samples taken after warm-up: age >= warmup_seconds and jobs >= warmup_jobs; or,
    once the warm-up's growth is explained by graphs traced, every sample since ready."""
    if facts.warmup_explained:
        return since_ready(samples, facts)
    ready = _ready(facts)
    start = ready + policy.warmup_seconds
    after = [s for s in samples if s.t >= start and s.jobs >= policy.warmup_jobs]
    if not after and traced_growth(samples, facts).explained:
        return since_ready(samples, facts)
    return after


def explained_warmup(samples: Sequence[Sample], facts: WorkerFacts,
                     policy: PolicyConfig) -> bool:
    """Whether the warm-up is over early, its growth being the worker's own tracing."""
    if facts.warmup_explained:
        return True
    start = _ready(facts) + policy.warmup_seconds
    if any(s.t >= start and s.jobs >= policy.warmup_jobs for s in samples):
        return False  # warmed up the usual way first: nothing to explain
    return traced_growth(samples, facts).explained


def _ready(facts: WorkerFacts) -> float:
    return facts.ready_at if facts.ready_at is not None else facts.started_at


def since_ready(samples: Sequence[Sample], facts: WorkerFacts) -> list[Sample]:
    ready = _ready(facts)
    return [s for s in samples if s.t >= ready]


@dataclass(frozen=True)
class TracedGrowth:
    """Memory growth since ready, and how much of it came with new traced graphs: summed
    over the intervals between the worker's probe readings in which its count of graphs
    rose (a reading repeated by several heartbeats counts once)."""

    graphs: int = 0  # traced since ready
    growth: int = 0  # bytes, first reading since ready to the last
    # Bytes grown in intervals that traced new graphs: each interval's rise (a fall is not
    # credited, or one interval's drop would hide another's), at most the growth in all.
    with_graphs: int = 0
    jobs: int = 0
    rises: int = 0  # intervals between readings in which the count of graphs rose
    bound: int = MIN_NEW_GRAPHS  # graphs a bounded set of shapes may trace (see explained)

    @property
    def explained(self) -> bool:
        """The growth is the tracing's: enough of it, with more graphs than the model's
        bounded set of shapes traces, rising over several readings, mostly with them."""
        return self.graphs > self.bound and self.rises >= MIN_RISES and \
            self.growth >= EXPLAINED_BYTES and self.with_graphs >= WITH_GRAPHS * self.growth

    def fields(self) -> dict[str, int]:
        return {"graphs": self.graphs, "growth": self.growth,
                "growth_with_graphs": self.with_graphs, "jobs": self.jobs}


def traced_growth(samples: Sequence[Sample], facts: WorkerFacts) -> TracedGrowth:
    """See TracedGrowth; empty when fewer than two readings since ready counted graphs."""
    readings: list[tuple[Sample, int]] = []  # (sample, its reading's graphs)
    last_probes = None
    for s in since_ready(samples, facts):
        if s.probes is not None and s.probes.graphs is not None and s.probes != last_probes:
            readings.append((s, s.probes.graphs))
            last_probes = s.probes
    bound = max(MIN_NEW_GRAPHS, GRAPHS_PER_SHAPE * facts.shapes)
    if len(readings) < 2:
        return TracedGrowth(bound=bound)
    rising = [max(0, b.memory - a.memory) for (a, before), (b, after)
              in itertools.pairwise(readings) if after > before]
    (first, graphs_then), (last, graphs_now) = readings[0], readings[-1]
    growth = last.memory - first.memory
    return TracedGrowth(graphs=graphs_now - graphs_then, growth=growth,
                        with_graphs=min(sum(rising), max(0, growth)),
                        jobs=last.jobs - first.jobs, rises=len(rising), bound=bound)


def levels_off_below(slope: Slope, current: float, limit: int | None,
                     decaying: float = DECAYING) -> bool:
    """Decaying growth whose geometric tail stays under ``limit`` is not a leak; with no
    limit, growth whose halves decay by ``decaying`` or more converges: not a leak."""
    if slope.second_half >= slope.first_half or slope.first_half <= 0:
        return False
    ratio = max(0.0, slope.second_half / slope.first_half)
    if limit is None:
        return ratio <= decaying
    half_span = slope.span / 2
    remaining = slope.second_half * half_span * ratio / (1 - ratio)
    return current + remaining < limit


def assess(samples: Sequence[Sample], facts: WorkerFacts, policy: PolicyConfig) -> tuple[
        Assessment, Slope | None, Slope | None, Slope | None]:
    """Numbers for the verdict, and the memory-per-job, memory-per-second and
    VRAM-per-job fits (None when there is not enough warmed-up data)."""
    last = samples[-1] if samples else None
    explained = explained_warmup(samples, facts, policy)
    after = warmed_up(samples, replace(facts, warmup_explained=explained), policy)
    window = after[-policy.trend_window:]
    enough = len(window) >= window_needed(policy)
    per_job = per_second = vram_per_job = None
    if enough:
        jobs = np.array([s.jobs for s in window], dtype=float)
        times = np.array([s.t for s in window], dtype=float)
        memory = np.array([s.memory for s in window], dtype=float)
        per_job = fit(jobs, memory)
        per_second = fit(times, memory)
        vram = [s.vram for s in window]
        if all(v is not None for v in vram):
            vram_per_job = fit(jobs, np.array(vram, dtype=float))
    seconds_to_limit = None
    # The recent half's rate when it is the steeper: a leak that speeds up (a per-job leak
    # in a traffic burst) reaches the limit sooner than the whole window's slope says.
    rate = max(per_second.value, per_second.second_half) if per_second is not None else 0.0
    if last is not None and policy.max_memory is not None and rate > 0:
        seconds_to_limit = max(0.0, (policy.max_memory - last.memory) / rate)
    lead = lead_seconds(window, facts, policy) if policy.max_memory is not None else None
    assessment = Assessment(
        memory=last.memory if last else None,
        vram=last.vram if last else None,
        baseline=facts.baseline if facts.baseline is not None else
        (after[0].memory if after else None),
        warmed_up=bool(after),
        warmup_explained=explained,
        window=len(window) if enough else 0,
        growth_per_1k_jobs=per_job.value * 1000 if per_job else None,
        growth_per_hour=per_second.value * 3600 if per_second else None,
        vram_growth_per_1k_jobs=vram_per_job.value * 1000 if vram_per_job else None,
        seconds_to_limit=seconds_to_limit,
        lead_seconds=lead,
    )
    return assessment, per_job, per_second, vram_per_job


def window_needed(policy: PolicyConfig) -> int:
    """Warmed-up samples a trend is fitted on at the least. Without max_memory nothing is
    urgent: a full window, so a ramp that levels off within it shows its flat second half
    (Keras ``predict()``'s ramp on an encoder stopped abruptly ~60 s after ready, a minute
    after a half window had called it a leak). With max_memory, half a window: the time to
    the limit says when to act."""
    if policy.max_memory is None:
        return max(MIN_TREND_SAMPLES, policy.trend_window)
    return max(MIN_TREND_SAMPLES, policy.trend_window // 2)


def lead_seconds(window: Sequence[Sample], facts: WorkerFacts,
                 policy: PolicyConfig) -> float | None:
    """How long before max_memory a trend recycle must start: ``trend_lead`` times what this
    worker took from spawn to ready (its replacement needs as much, on a busier machine),
    once for each turn of replacements ahead of it (the model's workers may leak in
    lockstep, and only max_concurrent_recycles go at a time), plus the polls the
    confirmations take. None: no lead (``trend_lead`` 0, or the start-up is not known), and
    the horizon alone decides."""
    if policy.trend_lead <= 0 or facts.ready_at is None:
        return None
    startup = max(0.0, facts.ready_at - facts.started_at)
    gaps = [b.t - a.t for a, b in itertools.pairwise(window) if b.t > a.t]
    poll = float(np.median(gaps)) if gaps else 0.0
    turns = max(1, facts.recycle_turns)
    return policy.trend_lead * startup * turns + policy.trend_confirmations * poll


def evaluate(samples: Sequence[Sample], facts: WorkerFacts, policy: PolicyConfig,
             now: float) -> Verdict:
    """Decide what to do with one ready worker now."""
    assessment, per_job, per_second, vram_per_job = assess(samples, facts, policy)
    hard = _limits(assessment, facts, policy, now)
    if hard is not None:
        ruling, reason, detail = hard
        return Verdict(ruling, reason, detail, assessment, facts.trend_streak)
    trend = _trend(assessment, per_job, per_second, vram_per_job, policy)
    if trend is None:
        return Verdict(Ruling.KEEP, None, "", assessment, 0)
    streak = facts.trend_streak + 1
    reason, detail = trend
    if streak < policy.trend_confirmations:
        return Verdict(Ruling.KEEP, None, f"{detail} ({streak}/{policy.trend_confirmations} "
                       "confirmations)", assessment, streak)
    return Verdict(Ruling.RECYCLE, reason, detail, assessment, streak)


def byte_limits(policy: PolicyConfig) -> list[tuple[Reason, int]]:
    """The absolute limits that are set, most urgent first, named by the Reason they give."""
    limits = [(Reason.KILL_MEMORY, policy.kill_memory), (Reason.MAX_MEMORY, policy.max_memory),
              (Reason.MAX_VRAM, policy.max_vram)]
    return [(reason, limit) for reason, limit in limits if limit is not None]


def over_limits(memory: int | None, vram: int | None,
                policy: PolicyConfig) -> list[tuple[Reason, int, int]]:
    """(limit, figure, limit value) for each absolute limit these figures are at or over."""
    crossed = []
    for reason, limit in byte_limits(policy):
        value = vram if reason is Reason.MAX_VRAM else memory
        if value is not None and value >= limit:
            crossed.append((reason, value, limit))
    return crossed


def _limits(a: Assessment, facts: WorkerFacts, policy: PolicyConfig,
            now: float) -> tuple[Ruling, Reason, str] | None:
    """Hard and lifetime limits: they apply before warm-up too."""
    for reason, value, limit in over_limits(a.memory, a.vram, policy)[:1]:
        ruling = Ruling.KILL if reason is Reason.KILL_MEMORY else Ruling.RECYCLE
        figure = "VRAM" if reason is Reason.MAX_VRAM else "memory"
        return ruling, reason, f"{figure} {value} >= {reason.value} {limit}"
    scale = 1.0 - facts.jitter
    if policy.max_jobs is not None and facts.jobs >= policy.max_jobs * scale:
        return Ruling.RECYCLE, Reason.MAX_JOBS, \
            f"{facts.jobs} jobs >= max_jobs {policy.max_jobs} less {facts.jitter:.0%} jitter"
    age = now - facts.started_at
    if policy.max_age is not None and age >= policy.max_age * scale:
        return Ruling.RECYCLE, Reason.MAX_AGE, \
            f"age {age:.0f}s >= max_age {policy.max_age:.0f}s less {facts.jitter:.0%} jitter"
    return None


def _trend(a: Assessment, per_job: Slope | None, per_second: Slope | None,
           vram_per_job: Slope | None, policy: PolicyConfig) -> tuple[Reason, str] | None:
    """A confident growth trend over a limit that matters: host memory growth within the
    horizon (and, with a lead, soon enough that waiting longer would let the worker reach
    max_memory); VRAM growth whenever it is over its limit (the time to max_memory says
    nothing of it)."""
    if a.memory is None:
        return None
    # A window not yet full has shorter halves: the decay asked of them is scaled to match.
    # Halves of a few samples each cannot tell decay from noise: no exemption then.
    decaying = DECAYING ** (a.window / policy.trend_window) if a.window else DECAYING
    if a.window < MIN_DECAY_SAMPLES:
        decaying = 0.0
    checks = [
        (Reason.GROWTH_PER_1K_JOBS, per_job, policy.max_growth_per_1k_jobs, 1000, "per 1k jobs",
         policy.max_memory),
        (Reason.GROWTH_PER_HOUR, per_second, policy.max_growth_per_hour, 3600, "per hour",
         policy.max_memory),
        (Reason.VRAM_GROWTH_PER_1K_JOBS, vram_per_job, policy.max_vram_growth_per_1k_jobs, 1000,
         "of VRAM per 1k jobs", policy.max_vram),
    ]
    for reason, slope, limit, scale, unit, ceiling in checks:
        if slope is None or limit is None or not slope.confidently_over(limit / scale):
            continue
        vram = reason is Reason.VRAM_GROWTH_PER_1K_JOBS
        if not vram and not _host_memory_due(a, policy):
            continue
        current = a.vram if vram else a.memory
        if current is not None and levels_off_below(slope, current, ceiling, decaying):
            continue
        return reason, f"growing {slope.value * scale:.0f} bytes {unit} (halves " \
            f"{slope.first_half * scale:.0f} and {slope.second_half * scale:.0f}) > {limit}"
    return None


def _host_memory_due(a: Assessment, policy: PolicyConfig) -> bool:
    """Whether host memory growth matters now: it reaches max_memory within the horizon,
    and, with a lead, within the lead (until then the worker serves on)."""
    if a.seconds_to_limit is None:
        return True
    if a.seconds_to_limit > policy.trend_horizon:
        return False  # it may grow, but it will not reach max_memory in time to matter
    return a.lead_seconds is None or a.seconds_to_limit <= a.lead_seconds


def pressure_victim(candidates: Sequence[tuple[str, Assessment]]) -> str | None:
    """Under host memory pressure: the fastest-growing worker (per hour), else the largest."""
    if not candidates:
        return None

    def key(item: tuple[str, Assessment]) -> tuple[float, float]:
        _, a = item
        return (a.growth_per_hour or 0.0, float(a.memory or 0))

    return max(candidates, key=key)[0]
