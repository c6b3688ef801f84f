"""Container pressure at its edges (budget.py, recycling.py): a worker stuck draining, long
drains, a fresh worker's first samples, a one-off step, several models, a throttled cgroup
with nothing growing. Each pins a misfire the rate-based line once had. Helpers as in
tests/test_budget.py."""

from __future__ import annotations

from supervisor.core.budget import Budget, CgroupMemory, Pressure, growth_rate
from supervisor.core.history import Sample
from supervisor.core.pool import State
from supervisor.core.reasons import Reason
from tests.test_budget import GIB, LEAKY, MIB, WARM, container, spawned, world
from tests.test_core_cases import World
from tests.test_core_model import valid

LIMIT = 4 * GIB


def set_usage(w: World, usage: int, high: int | None = None) -> None:
    w.core.memory(CgroupMemory(1, "/cg", LIMIT, usage, 0, high, 0), None, poll=True)


def beat(w: World) -> None:
    for x in list(w.core.pool.workers.values()):
        if x.state is not State.STARTING:
            w.heartbeat(x.id)


def flat(w: World, polls: int, usage: int) -> None:
    for _ in range(polls):
        beat(w)
        w.tick(1.0)
        set_usage(w, usage)
        w.poll()


def pressure_recycles(w: World) -> int:
    return sum(n for state in w.core.pool.models.values()
               for r, n in state.recycles.items() if "pressure" in r)


# 1. One reading at the end of the window is a leak -------------------------------------

def test_one_high_last_reading_is_not_a_leak() -> None:
    """The docstring: 'a rise over several polls, not the last one alone, so that one noisy
    reading does not make a leak'. A single high *last* reading does."""
    samples = [Sample(float(t), 0, m) for t, m in enumerate([100, 100, 100, 100, 140])]
    assert growth_rate(samples, None) == 0.0  # got 20.0 (the step over the last two polls)


def test_a_one_off_step_then_flat_is_no_container_pressure() -> None:
    """A healthy pool, flat for minutes; one worker takes one large batch and its memory
    steps up 300 MiB and stays there (TF's allocator keeps it). 300 MiB of headroom is left,
    over the 205 MiB kill buffer: nothing grows any more, nothing should be recycled.
    Got: the step is read as 150 MiB/s for the next polls, the line is 205 + 375 MiB, and the
    worker is drained for container_pressure."""
    w = world(LIMIT, LIMIT - 600 * MIB, LEAKY)
    flat(w, 5, LIMIT - 600 * MIB)
    w.memory["a-1"] += 300 * MIB
    flat(w, 4, LIMIT - 300 * MIB)
    assert pressure_recycles(w) == 0


def test_a_one_off_step_does_not_kill() -> None:
    """Same, tighter: the step leaves 140 MiB, under the kill buffer (before this change: a
    drain). The memory is flat, so the headroom lasts forever; got a SIGKILL mid-batch
    ('the headroom lasts 0.93s, not until the next poll')."""
    w = world(LIMIT, LIMIT - 600 * MIB, LEAKY)
    flat(w, 5, LIMIT - 600 * MIB)
    w.memory["a-1"] += 460 * MIB
    flat(w, 1, LIMIT - 140 * MIB)
    assert not [x for x in w.core.pool.workers.values() if x.killed]


# 2. A fresh worker: the ready sample and the first poll a fraction of a poll apart ---------

def test_first_allocation_just_after_ready_is_not_a_leak_of_gigabytes_a_second() -> None:
    """The ready message is sampled at once (SampleNow), so the first poll after it can be
    50 ms later: 20 MiB of a first job's allocation over 50 ms reads as 400 MiB/s, the line
    jumps to 205 MiB + 1 GiB, and with 1 GiB of headroom (a quarter of the limit) the fresh
    worker is drained for container_pressure. Its replacement does the same on its first
    job: a storm in a healthy pool. Before the change: no recycle (headroom >> buffer)."""
    w = World(LEAKY)
    container(w, LIMIT, LIMIT - GIB)
    for worker_id in list(w.memory):
        w.memory[worker_id] = WARM
        w.ready(worker_id)
    w.tick(0.05)
    w.memory["a-1"] += 20 * MIB  # its first job
    set_usage(w, LIMIT - GIB + 20 * MIB)
    w.poll()
    pressure = w.core.budget.pressure
    assert pressure is not None
    assert pressure.rate < 50 * MIB, pressure  # got 400 MiB/s
    assert pressure_recycles(w) == 0


# 3. A worker stuck draining counts as memory freed, forever ------------------------------

def test_a_worker_stuck_draining_does_not_hide_the_others_leak() -> None:
    """a-1 (grown 500 MiB) is drained for pressure but holds a long job (drain_timeout 60s).
    It counts as 500 MiB 'on its way out' at every poll, so while a-2 and a-3 leak 100 MiB/s
    together the short is never positive and the kill check (headroom + 500 MiB < 100 MiB)
    can never hold with headroom >= 0: nothing is done until the kernel's OOM killer acts.
    Expected: by the time the headroom will not last a poll, something is done (a drain or
    a kill); got: nothing."""
    w = world(LIMIT, LIMIT - GIB, LEAKY.replace("workers: 2", "workers: 3"))
    flat(w, 3, LIMIT - GIB)
    w.request(valid("a", 1))
    w.tick()
    [busy] = [x for x in w.core.pool.workers.values() if w.batches.get(x.id)]
    w.memory[busy.id] += 500 * MIB
    flat(w, 5, LIMIT - GIB)  # grown, then flat: 0 B/s, the line is the kill buffer
    usage = LIMIT - 200 * MIB
    flat(w, 1, usage)
    assert busy.state is State.DRAINING and busy.reason is Reason.CONTAINER_PRESSURE
    acted = False
    for _ in range(8):  # others leak 50 MiB/s each; the headroom falls to 0 by the 4th
        beat(w)
        w.tick(1.0)
        for x in w.core.pool.ready("a"):
            if x is not busy:
                w.memory[x.id] += 50 * MIB
                usage = min(LIMIT, usage + 50 * MIB)
        set_usage(w, usage)
        w.poll()
        others = [x for x in w.core.pool.workers.values() if x is not busy]
        if busy.killed or any(x.leaving or x.killed for x in others):
            acted = True
            break
    assert acted, f"headroom {LIMIT - usage}: nothing freed before the limit"


# 4. The line is not bounded by the limit: a slow leak drains every worker ----------------

def test_two_long_ways_out_do_not_drain_the_whole_pool() -> None:
    """Two ways out that took 50 s (workers that finished a 50 s job while draining: within
    the default 60 s drain_timeout) set the lead to 1 + 1.5 x 50 = 76 s for the next eight.
    Four workers each growing 4 MiB/s (an ordinary slow leak, 16 MiB/s together) then put
    the line at 205 MiB + 1.2 GiB, with 1.3 GiB (a third of the limit) free: every worker
    grown 16 MiB is drained at once but the last (short is never covered). Expected: at most
    one recycle for a slow leak with a third of the container free."""
    w = world(LIMIT, LIMIT - 1300 * MIB, LEAKY.replace("workers: 2", "workers: 4"))
    w.core.budget.way_out(50.0)
    w.core.budget.way_out(50.0)
    usage = LIMIT - 1300 * MIB
    for _ in range(6):
        w.tick(1.0)
        for x in w.core.pool.ready("a"):
            if not x.leaving:
                w.memory[x.id] += 4 * MIB
        set_usage(w, usage)  # the cgroup's figure held flat: only the rate matters here
        w.poll()
    pressure = w.core.budget.pressure
    assert pressure is not None
    assert pressure_recycles(w) <= 1, (pressure, pressure_recycles(w))


def test_the_pressure_line_never_exceeds_the_limit() -> None:
    """Pressure.line has no cap: with any rate x lead above the limit the headroom is always
    under it, whatever is freed."""
    budget = Budget()
    for _ in range(2):
        budget.way_out(60.0)
    pressure = Pressure(LIMIT, 205 * MIB, 50 * MIB, budget.lead(1.0))
    assert pressure.line <= LIMIT
    assert not pressure.under  # the container is empty


# 5. Several models: the "second at once" takes another model's last ready worker ----------

TWO_MODELS = LEAKY + """
  b:
    handler: "mod:b"
    workers: 1
    policy: {warmup_jobs: 0, warmup_seconds: 0, max_memory: 3GiB, max_jobs: 1000}
"""


def test_a_second_drain_at_once_never_takes_a_models_last_ready_worker() -> None:
    """docs/deployment.md: 'a second worker drains beside the first (past
    max_concurrent_recycles, never a model's last ready worker) only when one cannot free
    enough in time'. a-1 is drained first; the second is b-1, model b's only worker: b is
    left with none serving."""
    w = world(LIMIT, LIMIT - 100 * MIB, TWO_MODELS)
    w.memory["a-1"] = WARM + 100 * MIB
    w.memory["b-1"] = WARM + 90 * MIB
    flat(w, 5, LIMIT - GIB)  # grown, then flat: 0 B/s, the line is the kill buffer
    flat(w, 1, LIMIT - 100 * MIB)  # 100 MiB free: a-1 frees 100, 5 MiB short
    assert pressure_recycles(w) >= 1
    assert w.core.pool.ready("b"), "model b's last ready worker drained as the second"


# 6. Negative headroom with nothing growing kills -----------------------------------------

def test_over_memory_high_with_nothing_growing_drains_not_kills() -> None:
    """v2 memory.high under the working set (the kernel throttles there, it never kills):
    headroom is negative, growth 0, so 'available + freeing < rate x poll' is -x < 0 and
    the most grown worker is SIGKILLed 'before the kernel does' though nothing grows and
    the kernel does not kill at memory.high. Expected: a drain."""
    w = world(LIMIT, 3 * GIB, LEAKY)
    flat(w, 5, 3 * GIB)
    w.memory["a-1"] += 100 * MIB
    flat(w, 5, 3 * GIB + 100 * MIB)  # flat again: 0 B/s when judged
    w.core.memory(CgroupMemory(2, "/cg", LIMIT, 3 * GIB + 100 * MIB, 0, 3 * GIB, 0), None)
    w.tick(1.0)
    w.poll()
    assert w.core.budget.pressure is not None and w.core.budget.pressure.rate == 0
    assert not [x for x in w.core.pool.workers.values() if x.killed]


# 9. A fast leak on a loaded machine -------------------------------------------------------

def leak_every(w: World, seconds: float, per_poll: int, polls: int, usage: int) -> int:
    """Polls ``seconds`` apart (late ones, on a loaded machine: the configured interval is
    1 s), every worker in rotation ``per_poll`` bigger at each; returns the usage."""
    for _ in range(polls):
        beat(w)
        w.tick(seconds)
        for worker in w.core.pool.ready("a"):
            w.memory[worker.id] += per_poll
            usage += per_poll
        set_usage(w, usage)
        w.poll()
    return usage


def test_headroom_that_outlasts_a_poll_but_not_a_late_one_kills() -> None:
    """Polls come 2 s apart where 1 s is configured (the daemon's threads wait for a core),
    two workers grow 100 MiB/s together. 150 MiB of headroom lasts the configured poll, not
    the one that will come: a drain, with the other worker growing all the while, would
    leave the kernel to kill. Got: a drain (the test counted the configured interval)."""
    w = world(LIMIT, GIB, LEAKY)
    usage = leak_every(w, 2.0, 100 * MIB, 4, GIB)
    assert w.core.budget.poll_seconds(1.0) == 2.0
    assert pressure_recycles(w) == 0
    assert not any(x.killed for x in w.core.pool.workers.values())
    leak_every(w, 2.0, 100 * MIB, 1, LIMIT - 350 * MIB)  # 150 MiB left after this poll
    assert usage < LIMIT - 350 * MIB
    killed = [x for x in w.core.pool.workers.values() if x.killed]
    assert [x.kill_reason for x in killed] == [Reason.CONTAINER_PRESSURE]


def test_polls_on_time_again_bring_the_line_back_and_one_stall_counts_at_most_thrice() -> None:
    budget = Budget()
    assert budget.poll_seconds(0.5) == 0.5  # none measured: the interval
    for t in (0.0, 0.5, 1.0, 1.75, 2.25):
        budget.polled_at(t)
    assert budget.poll_seconds(0.5) == 0.75  # the slowest recent gap
    budget.polled_at(62.25)  # a daemon stopped for a minute says nothing of the next poll
    assert budget.poll_seconds(0.5) == 1.5 and budget.lead(0.5) == 1.5 + 1.5 * 0.5
    for k in range(1, 9):  # eight polls on time: the stall is forgotten
        budget.polled_at(62.25 + 0.5 * k)
    assert budget.poll_seconds(0.5) == 0.5


def replaced_after_a_crash(w: World, worker_id: str) -> str:
    """The worker crashes; its replacement, spawned after the restart backoff, is ready."""
    w.exit(worker_id, 1)
    while not spawned(w):
        w.tick(0.25)
    [fresh] = spawned(w)
    w.memory[fresh] = WARM
    w.ready(fresh)
    return fresh


def test_a_fresh_replacement_counts_at_its_models_rate_from_its_first_poll() -> None:
    """Two workers leak 50 MiB/s each; one crashes and its replacement, ready, leaks as it
    did from its first job, a poll or two before its own samples show a rate. The line
    counts both workers' growth: 100 MiB/s, not 50 (counted at 0, the fresh worker's growth
    took the others' headroom unseen)."""
    w = world(LIMIT, GIB, LEAKY)
    usage = leak_every(w, 1.0, 50 * MIB, 5, GIB)
    pressure = w.core.budget.pressure
    assert pressure is not None and pressure.rate == 100 * MIB
    replaced_after_a_crash(w, "a-1")
    leak_every(w, 1.0, 50 * MIB, 1, usage)
    pressure = w.core.budget.pressure
    assert pressure is not None and pressure.rate == 100 * MIB
    # A model whose serving workers do not grow gives its fresh worker no rate either.
    flat_world = world(LIMIT, GIB, LEAKY)
    flat(flat_world, 5, GIB)
    replaced_after_a_crash(flat_world, "a-1")
    flat(flat_world, 1, GIB)
    pressure = flat_world.core.budget.pressure
    assert pressure is not None and pressure.rate == 0.0


def test_one_leaking_worker_does_not_make_its_fresh_siblings_leak() -> None:
    """Three workers, one leaking 100 MiB/s, two flat; a flat one crashes and its fresh
    replacement counts at the model's median rate (0), not the leaker's: a scale-up or a
    replacement beside one bad worker does not raise the line for two polls."""
    w = world(LIMIT, GIB, LEAKY.replace("workers: 2", "workers: 3"))
    usage = GIB
    for _ in range(5):
        beat(w)
        w.tick(1.0)
        w.memory["a-1"] += 100 * MIB
        usage += 100 * MIB
        set_usage(w, usage)
        w.poll()
    pressure = w.core.budget.pressure
    assert pressure is not None and pressure.rate == 100 * MIB
    replaced_after_a_crash(w, "a-3")
    w.memory["a-1"] += 100 * MIB
    set_usage(w, usage + 100 * MIB)
    w.tick(1.0)
    w.poll()
    pressure = w.core.budget.pressure
    assert pressure is not None and pressure.rate == 100 * MIB

