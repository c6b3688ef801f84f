"""The container's memory budget: the limit that actually kills the service.

In a Kubernetes pod, a systemd unit with ``MemoryMax=`` or a ``docker run --memory``, the
kernel OOM-kills at the *cgroup's* limit, whatever the host has free. The daemon reads its
own cgroup at every poll (``supervisor/daemon/cgroup.py``) and hands the reading here; this
module decides, with no clock and no I/O:

- **headroom**: the tighter of the host's available memory and the cgroup's limit minus its
  working set (usage less inactive file cache: the kubelet's and cAdvisor's figure, since
  the kernel reclaims that cache before it kills);
- **kill buffer**: what must stay free when ``supervisor.min_available_memory`` is unset:
  ``BUFFER_FRACTION`` of the limit, at most ``MAX_BUFFER`` (Ray's memory monitor acts at 95 %
  of its cgroup);
- **pressure line**: under a limit, the kill buffer is not enough on its own: a leak of
  65 MiB a poll crosses a 75 MiB buffer in one poll, and a recycle takes longer than that
  while the other workers keep growing. Pressure starts when the headroom is under the kill
  buffer *plus* what the workers will grow by before a recycle can free memory: their
  growth rate (``growth_rate``, summed) times the lead (``Budget.lead``: one poll to notice,
  then a way out as long as the slowest of the last ones measured, with a margin). A way
  out counts at most ``MAX_WAY_OUT`` and the line is at most half the limit: a drain held
  by a long job must not put the line above the headroom of an idle container;
- **room**: whether one more process of a given size fits (working set + what the workers
  still loading will grow to + that size + the buffer, under the limit). A recycle starts its
  replacement first only when it does (``recycling.py``), and a replacement is spawned
  only when it does (``Pool.replenish``);
- **OOM kills**: the cgroup's OOM-kill counter, so a worker the kernel killed is named
  ``oom_killed`` instead of ``killed_externally``.

A budget never lifts a bound: ``kill_memory`` and ``max_memory`` hold whatever it says.
Outside any limit (no cgroup limit, or a reading that failed) every answer is what it was
before budgets existed: everything fits, and pressure is the host's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median_low

from supervisor.config.keys import ModelConfig, PolicyConfig
from supervisor.core.history import Sample
from supervisor.core.pool import Pool, State, WorkerHandle

MIB = 1024**2
# The default kill buffer: this fraction of the limit, capped (see the module docstring).
BUFFER_FRACTION = 0.05
MAX_BUFFER = 512 * MIB
# What the supervisor itself is allowed when a container is sized (it uses tens of MB).
SUPERVISOR_SHARE = 64 * MIB
# A worker's growth rate is read over its last RATE_POLLS poll intervals: the lower median
# of their rates, so that the rise must persist over most of them (a step, one large batch
# that the allocator keeps, is not a rate). Samples closer than RATE_MIN_GAP polls to the
# next are skipped (the ready sample and a poll 50 ms later are no interval to divide by),
# and a worker needs RATE_MIN_SPAN polls of samples since ready before it has a rate.
RATE_POLLS = 4
RATE_MIN_GAP = 0.5
RATE_MIN_SPAN = 1.5
# Ways out (drain and stop, from out of rotation to exited) remembered: the slowest of them
# is what the next recycle is expected to take.
WAYS_OUT_KEPT = 8
# The lead's margin over the slowest recent way out (a busier machine, a longer job).
LEAD_MARGIN = 1.5
# The most seconds of way out the lead counts: a drain that waits on a long job (up to
# drain_timeout) says nothing of how soon a leak must be acted on, and a lead of a minute
# would put the line above any headroom (a kill, ``_kill_for_room``, is the backstop).
MAX_WAY_OUT = 10.0
# Gaps between polls remembered, and the most the next one is expected to take, in poll
# intervals (a daemon stopped for a minute says nothing of the next poll).
POLL_GAPS_KEPT = 8
MAX_POLL_LATENESS = 3.0
# The pressure line is never above this fraction of the limit (an idle container is never
# under pressure, whatever the rate and lead say).
MAX_LINE_FRACTION = 0.5


@dataclass(frozen=True)
class CgroupMemory:
    """One reading of the supervisor's memory cgroup (every figure in bytes)."""

    version: int  # 1 or 2
    path: str  # the cgroup's directory
    limit: int | None  # memory.max / memory.limit_in_bytes (the tightest ancestor's); None: none
    usage: int  # memory.current / memory.usage_in_bytes
    inactive_file: int  # page cache the kernel reclaims before it kills
    high: int | None = None  # v2 memory.high: where the kernel starts throttling; None: none
    oom_kills: int | None = None  # the cgroup's OOM-kill counter; None: the kernel keeps none

    @property
    def working_set(self) -> int:
        return max(0, self.usage - self.inactive_file)

    @property
    def binding_limit(self) -> int | None:
        """The figure judged against: memory.high when it is lower than the hard limit (past
        it the kernel throttles and reclaims: a service in reclaim stalls long before it is
        killed)."""
        limits = [x for x in (self.limit, self.high) if x is not None]
        return min(limits) if limits else None


class OomCounter:
    """Kernel OOM kills of the cgroup, matched to worker deaths.

    The counter is cumulative for the cgroup, so only what rose since the daemon started
    counts, and an increment is matched to at most one SIGKILL the supervisor did not send.
    An increment no worker death claims (the kernel killed a worker's descendant, which the
    worker survived) expires at the poll after next, so a later ``kill -9`` from someone
    else is not blamed on the kernel."""

    def __init__(self) -> None:
        self.base: int | None = None  # the counter when first read: kills before us
        self.seen: int | None = None  # the counter at the latest reading
        self.consumed = 0  # the counter up to which increments are matched or expired
        self.polls: list[int] = []  # the counter at the last two polls

    def read(self, counter: int | None, poll: bool) -> None:
        if counter is None:
            return
        if self.base is None or (self.seen is not None and counter < self.seen):
            self.base = self.consumed = counter  # first reading, or another cgroup now
            self.polls = []
        self.seen = counter
        if poll:
            # What the poll before last already saw has had a whole poll interval for its
            # worker's death to be reaped (a large process can take a while to exit).
            if len(self.polls) == 2:
                self.consumed = max(self.consumed, self.polls[0])
            self.polls = [*self.polls[-1:], counter]

    def claim(self) -> bool:
        """One unmatched kernel OOM kill, taken for the worker death now being judged."""
        if self.seen is not None and self.seen > self.consumed:
            self.consumed += 1
            return True
        return False

    @property
    def total(self) -> int:
        """OOM kills in the cgroup since the daemon started (workers' or not)."""
        return 0 if self.seen is None or self.base is None else self.seen - self.base


# How the room a replacement needs was estimated (Room.estimate, the events' field
# ``replacement_estimate``): what a worker adds to the container, a warm worker's reading
# less the pages it shares with the others (its libraries and files, charged to the
# container once), once a private reading is known; else a warm worker's whole reading.
PRIVATE = "private"
WARM = "warm_size"


@dataclass(frozen=True)
class Room:
    """Why one more process does or does not fit; the figures go into the recycle event."""

    fits: bool
    limit: int | None = None
    working_set: int | None = None
    loading: int = 0  # what the workers still starting will grow to, beyond their reading
    needed: int = 0  # what the new process is expected to add to the container
    buffer: int = 0
    estimate: str = WARM  # how ``needed`` was estimated: PRIVATE or WARM

    def fields(self) -> dict[str, int | str | None]:
        if self.limit is None:
            return {}
        return {"budget_limit": self.limit, "working_set": self.working_set,
                "loading": self.loading, "replacement_size": self.needed,
                "replacement_estimate": self.estimate, "kill_buffer": self.buffer}

    def __str__(self) -> str:
        if self.limit is None:
            return "no memory limit"
        total = (self.working_set or 0) + self.loading + self.needed + self.buffer
        verb = "fits under" if self.fits else "exceeds"
        what = "a worker's private memory" if self.estimate == PRIVATE else "a warm worker"
        return (f"working set {_mib(self.working_set or 0)} + loading {_mib(self.loading)} + "
                f"{what} {_mib(self.needed)} + kill buffer {_mib(self.buffer)} = "
                f"{_mib(total)} {verb} the limit {_mib(self.limit)}")


class Budget:
    """What the core knows of the container's memory: the latest cgroup reading and the
    host's available memory, both given by the daemon at every poll."""

    def __init__(self) -> None:
        self.cgroup: CgroupMemory | None = None
        self.host_available: int | None = None
        self.polled: CgroupMemory | None = None  # the reading of the last poll
        self.oom = OomCounter()
        # How long the last ways out took (seconds from out of rotation to exited).
        self.ways_out: deque[float] = deque(maxlen=WAYS_OUT_KEPT)
        # The pressure line at the last poll under a limit (Pressure), shown by status.
        self.pressure: Pressure | None = None
        # When the last polls were judged, and the gaps between them (``poll_seconds``).
        self.last_poll: float | None = None
        self.poll_gaps: deque[float] = deque(maxlen=POLL_GAPS_KEPT)

    def polled_at(self, now: float) -> None:
        """A poll's readings were judged at ``now``."""
        if self.last_poll is not None:
            self.poll_gaps.append(max(0.0, now - self.last_poll))
        self.last_poll = now

    def poll_seconds(self, poll_interval: float) -> float:
        """How long until the next poll is judged: the slowest of the last gaps between
        polls, never less than ``poll_interval`` and never more than MAX_POLL_LATENESS of
        it. A daemon on a loaded machine polls late (its threads wait for a core), and a
        fast leak grows by the time it waits: the pressure line and the kill's test count
        the poll that will come, not the one configured."""
        slowest = max(self.poll_gaps, default=poll_interval)
        return max(poll_interval, min(MAX_POLL_LATENESS * poll_interval, slowest))

    def way_out(self, seconds: float) -> None:
        """A worker drained and stopped in ``seconds``: what a pressure recycle takes."""
        self.ways_out.append(max(0.0, seconds))

    def way_out_seconds(self, poll_interval: float) -> float:
        """What a way out takes: the slowest of the last ones but one (one stop that met a
        busy machine does not set the line for the next eight), never less than a poll
        (before any is measured, a poll) and never more than MAX_WAY_OUT (a drain held by a
        long job is no measure of how soon memory must be freed)."""
        slowest = sorted(self.ways_out)[-2:]
        measured = slowest[0] if slowest else poll_interval
        return max(poll_interval, min(MAX_WAY_OUT, measured))

    def lead(self, poll_interval: float) -> float:
        """How long before the limit a pressure recycle must begin: up to one poll (as late
        as polls come, ``poll_seconds``) before the headroom is seen to fall, then the way
        out with a margin."""
        return self.poll_seconds(poll_interval) + \
            LEAD_MARGIN * self.way_out_seconds(poll_interval)

    def update(self, cgroup: CgroupMemory | None, host_available: int | None,
               poll: bool = True) -> None:
        self.cgroup = cgroup
        if poll:
            self.polled = cgroup
        if host_available is not None:
            self.host_available = host_available
        self.oom.read(cgroup.oom_kills if cgroup is not None else None, poll)

    def at_last_poll(self) -> dict[str, int | None]:
        """The limit and working set the last poll saw (an OOM kill's event: a reading
        taken after the kill shows the memory it freed)."""
        if self.polled is None:
            return {}
        return {"budget_limit": self.polled.binding_limit,
                "working_set": self.polled.working_set, "oom_kills": self.oom.total}

    @property
    def limit(self) -> int | None:
        return self.cgroup.binding_limit if self.cgroup is not None else None

    def buffer(self, floor: int | None) -> int:
        """The kill buffer: the configured floor, else the default under a limit, else 0."""
        if floor is not None:
            return floor
        limit = self.limit
        return 0 if limit is None else min(MAX_BUFFER, int(limit * BUFFER_FRACTION))

    def headroom(self) -> int | None:
        """Under the limit (None when neither the cgroup nor the host was read)."""
        room = []
        if self.cgroup is not None and self.limit is not None:
            room.append(self.limit - self.cgroup.working_set)
        if self.host_available is not None:
            room.append(self.host_available)
        return min(room) if room else None

    def pressure_floor(self, floor: int | None) -> int | None:
        """Below how much headroom memory pressure recycles: the configured floor, else the
        kill buffer under a limit, else none (the host alone, as configured)."""
        if floor is not None:
            return floor
        return self.buffer(None) if self.limit is not None else None

    def room(self, needed: int, loading: int, floor: int | None,
             estimate: str = WARM) -> Room:
        """Whether a process expected to add ``needed`` bytes fits, with ``loading`` bytes
        still to come from workers that are starting."""
        limit = self.limit
        if self.cgroup is None or limit is None:
            return Room(True)
        buffer = self.buffer(floor)
        working = self.cgroup.working_set
        return Room(working + loading + needed + buffer <= limit, limit, working, loading,
                    needed, buffer, estimate)

    def snapshot(self, floor: int | None) -> dict[str, object] | None:
        """What status shows (None outside any cgroup limit)."""
        cgroup = self.cgroup
        if cgroup is None:
            return None
        pressure = self.pressure.fields() if self.pressure is not None else {}
        return {"cgroup": cgroup.path, "version": cgroup.version, "limit": cgroup.limit,
                "high": cgroup.high, "working_set": cgroup.working_set, "usage": cgroup.usage,
                "headroom": self.headroom(), "kill_buffer": self.buffer(floor),
                "host_available": self.host_available, "oom_kills": self.oom.total,
                **pressure}


@dataclass(frozen=True)
class Pressure:
    """The container's pressure line at one poll, with its parts (the recycle event's
    figures): pressure when the headroom is under ``line``."""

    headroom: int
    buffer: int  # the kill buffer: what stays free when the worst case happens
    rate: float  # bytes per second the serving workers grow by, together
    lead: float  # seconds a recycle takes to free memory, from the poll that decides it

    cap: int | None = None  # the most the line may be (MAX_LINE_FRACTION of the limit)

    @property
    def line(self) -> int:
        """The kill buffer plus the growth over the lead, at most ``cap`` (and never under
        the kill buffer): a line above the headroom of an idle container would drain it."""
        line = self.buffer + int(self.rate * self.lead)
        return line if self.cap is None else min(line, max(self.buffer, self.cap))

    @property
    def under(self) -> bool:
        return self.headroom < self.line

    @property
    def seconds_to_limit(self) -> float | None:
        """At this rate, when the limit is reached (None: not growing)."""
        return max(0.0, self.headroom / self.rate) if self.rate > 0 else None

    def fields(self) -> dict[str, int | float | None]:
        return {"headroom": self.headroom, "kill_buffer": self.buffer,
                "pressure_line": self.line, "growth_rate": round(self.rate),
                "recycle_lead_seconds": round(self.lead, 2),
                "seconds_to_limit": None if self.seconds_to_limit is None
                else round(self.seconds_to_limit, 1)}

    def __str__(self) -> str:
        return (f"container headroom {_mib(self.headroom)} under the pressure line "
                f"{_mib(self.line)}: kill buffer {_mib(self.buffer)} + growth "
                f"{_mib(int(self.rate))}/s x recycle lead {self.lead:.2f}s")


def growth_rate(samples: Sequence[Sample], since: float | None,
                poll_interval: float = 1.0, polls: int = RATE_POLLS) -> float:
    """Bytes per second a worker grows by now: the lower median of its rates over its last
    ``polls`` intervals, so that only a rise over most of them is a rate (one high reading,
    or a step that then stays flat, is not a leak); 0 while it shrinks, and 0 before it
    has a rate (``measured_rate``)."""
    rate = measured_rate(samples, since, poll_interval, polls)
    return 0.0 if rate is None else rate


def measured_rate(samples: Sequence[Sample], since: float | None,
                  poll_interval: float = 1.0, polls: int = RATE_POLLS) -> float | None:
    """``growth_rate``, or None while the worker has too few samples for one: only samples
    from ``since`` on count (ready: a worker's loading is budgeted as such,
    ``still_loading``), at least RATE_MIN_GAP polls apart (a sample just after another
    divides a first job's allocation by 50 ms), and none is read before they span
    RATE_MIN_SPAN polls."""
    spaced: list[Sample] = []
    for sample in reversed([s for s in samples if since is None or s.t >= since]):
        if not spaced or spaced[-1].t - sample.t >= RATE_MIN_GAP * poll_interval:
            spaced.append(sample)
        if len(spaced) > polls:
            break
    spaced.reverse()
    if len(spaced) < 3 or spaced[-1].t - spaced[0].t < RATE_MIN_SPAN * poll_interval:
        return None
    rates = [(b.memory - a.memory) / (b.t - a.t) for a, b in pairwise(spaced)]
    return max(0.0, median_low(rates))


def serving_growth(workers: Iterable[WorkerHandle], poll_interval: float) -> float:
    """Bytes per second the container's working set grows by: the growth rates of the
    workers in rotation, added up (a worker out of rotation runs at most the jobs it holds;
    one still loading is budgeted as such, ``still_loading``). A worker too fresh for a
    rate of its own counts at the median rate of its model's serving workers that have
    one (the lower median: one leaking worker among flat ones is not the model's rate):
    the replacement of a leaking worker runs the same code on the same traffic and grows
    from its first job, a poll or two before its own samples show it (counted at 0, a
    recycle under a fast leak left the other workers a third less headroom than they
    took). After a scale-up this overcounts for those polls, on the safe side."""
    measured: dict[str, list[float]] = {}
    fresh: dict[str, int] = {}
    for worker in workers:
        if worker.state is not State.READY:
            continue
        rate = measured_rate(list(worker.history), worker.ready_at, poll_interval)
        if rate is None:
            fresh[worker.model] = fresh.get(worker.model, 0) + 1
        else:
            measured.setdefault(worker.model, []).append(rate)
    total = sum(sum(rates) for rates in measured.values())
    for model, count in fresh.items():
        if measured.get(model):
            total += count * median_low(measured[model])
    return total


def _mib(value: int) -> str:
    return f"{value / MIB:.0f}MiB"


def warm_size(workers: Iterable[WorkerHandle], policy: PolicyConfig) -> int:
    """What a fresh worker of a model reaches once warm: the largest baseline (taken after
    warm-up) of its live workers, and never less than the smallest reading of its ready
    workers (with ``warmup_jobs: 0`` the baseline is taken before the first job, when a
    TensorFlow worker has yet to allocate for its shapes); before any has a baseline, its
    ``max_memory`` (else ``kill_memory``), else the largest reading of its workers so far,
    else 0."""
    workers = list(workers)
    baselines = [w.assessment.baseline for w in workers if w.assessment.baseline is not None]
    if baselines:
        serving = [s.memory for w in workers if w.state is State.READY
                   and (s := w.history.last()) is not None]
        return max(max(baselines), min(serving, default=0))
    for limit in (policy.max_memory, policy.kill_memory):
        if limit is not None:
            return limit
    readings = [s.memory for w in workers if (s := w.history.last()) is not None]
    return max(readings, default=0)


def replacement_size(workers: Iterable[WorkerHandle], policy: PolicyConfig) -> tuple[int, str]:
    """What one more worker of a model adds to the container, and how that was estimated.
    A warm worker's reading (``warm_size``) counts the pages it shares with the others
    (TensorFlow's libraries, the model's files: in the page cache, charged to the container
    once), which a replacement does not add again: once a ready worker has a private reading
    (its anonymous resident memory), the estimate is the warm size less the least any ready
    worker was measured to share (PRIVATE); before, the warm size itself (WARM)."""
    workers = list(workers)
    warm = warm_size(workers, policy)
    shared = [w.shared for w in workers if w.state is State.READY and w.shared is not None]
    if not shared:
        return warm, WARM
    return max(0, warm - min(shared)), PRIVATE


def still_loading(pool: Pool) -> int:
    """What the workers that are starting will still grow by (each up to what its model's
    replacement is expected to add): counted against the room, so two replacements spawned
    a poll apart do not both count on the same free memory."""
    total = 0
    for worker in pool.workers.values():
        if worker.state is not State.STARTING:
            continue
        state = pool.models[worker.model]
        size, estimate = replacement_size(pool.of_model(worker.model), state.config.policy)
        latest = worker.history.last()
        if estimate == PRIVATE and worker.private is not None:
            grown = worker.private
        else:
            grown = latest.memory if latest is not None else 0
        total += max(0, size - grown)
    return total


def sizing_problem(models: Mapping[str, ModelConfig], budget: Budget, floor: int | None,
                   allowance: int = SUPERVISOR_SHARE) -> str | None:
    """Why the configured workers cannot fit the limit the daemon can see (None when they
    do, or when there is no limit). Each worker counts at its hard limit (``kill_memory``,
    else ``max_memory``: the most a policy lets it hold), plus one replacement of the
    largest, the kill buffer and ``allowance`` for the supervisor itself: what a container
    needs for recycles to start their replacement first and never meet the OOM killer."""
    limit = budget.limit
    if limit is None:
        return None
    sizes = {name: m.policy.kill_memory or m.policy.max_memory for name, m in models.items()}
    unbounded = sorted(name for name, size in sizes.items() if size is None)
    if unbounded:
        return (f"models {', '.join(unbounded)} set neither kill_memory nor max_memory: "
                f"nothing keeps their workers under the container's limit of {_mib(limit)}")
    need = sum(models[n].workers * (size or 0) for n, size in sizes.items())
    largest = max((size or 0 for size in sizes.values()), default=0)
    buffer = budget.buffer(floor)
    if buffer * 4 >= limit:
        return (f"the kill buffer (min_available_memory, {_mib(buffer)}) is a quarter or more "
                f"of the container's limit of {_mib(limit)}: memory pressure will recycle "
                "workers long before the limit is near (a host-sized floor in a container?)")
    if need + allowance > limit:
        return (f"even without a replacement, the workers at their limits ({_mib(need)}: "
                f"workers x kill_memory, else max_memory) + the supervisor "
                f"({_mib(allowance)}) exceed the container's limit of {_mib(limit)}: the "
                "kernel's OOM killer, not the policy, bounds these workers; raise the limit "
                "or lower workers or kill_memory")
    total = need + largest + buffer + allowance
    if total <= limit:
        return None
    return (f"the workers at their limits ({_mib(need)}: workers x kill_memory, else "
            f"max_memory) + one replacement ({_mib(largest)}) + the kill buffer "
            f"({_mib(buffer)}) + the supervisor ({_mib(allowance)}) = {_mib(total)}, over "
            f"the container's limit of {_mib(limit)}: "
            "recycles will drain a worker before its replacement starts, and a worker "
            "that reaches its limit may meet the kernel's OOM killer first")
