"""The container's memory budget: reading cgroups (v1 and v2, laid out as the kernel writes
them), the pure rules (headroom, kill buffer, room, OOM kills), and the core's recycles
under a limit, step by step. The live cgroup tests are in test_container_budget.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli.render import render_explain, render_status
from supervisor.config.loading import parse_config
from supervisor.core.budget import (
    MAX_BUFFER,
    MAX_WAY_OUT,
    MIB,
    PRIVATE,
    WAYS_OUT_KEPT,
    Budget,
    CgroupMemory,
    OomCounter,
    Pressure,
    growth_rate,
    sizing_problem,
)
from supervisor.core.history import Reading, Sample
from supervisor.core.pool import State
from supervisor.core.reasons import ExitCause, Hold, Reason
from supervisor.core.recycling import held_back
from supervisor.daemon import cgroup
from supervisor.daemon.control import Controller
from supervisor.daemon.metrics import Metrics
from tests.test_core_cases import World

GIB = 1024 * MIB


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def proc(tmp: Path, cgroup_lines: str, mountinfo: str) -> Path:
    return write(tmp / "proc", {"cgroup": cgroup_lines, "mountinfo": mountinfo})


V2_MOUNT = "30 23 0:26 / {point} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 " \
           "rw,nsdelegate,memory_recursiveprot\n"
V1_MOUNT = "35 31 0:32 {root} {point} rw,relatime - cgroup cgroup rw,memory\n"


def v2_level(directory: Path, maximum: str, current: int, inactive: int,
             high: str = "max", oom_kill: int = 0) -> Path:
    return write(directory, {
        "memory.max": f"{maximum}\n", "memory.high": f"{high}\n",
        "memory.current": f"{current}\n",
        "memory.stat": f"anon {current - inactive}\nfile {inactive}\nactive_file 0\n"
                       f"inactive_file {inactive}\n",
        "memory.events": f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\n"
                         "oom_group_kill 0\n"})


def test_cgroup_v2_own_limit_working_set_and_oom_counter(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root, {"cgroup.controllers": "cpu memory\n"})  # the root has no memory.max
    v2_level(root / "kubepods.slice", "max", 9 * GIB, GIB)
    v2_level(root / "kubepods.slice" / "pod", str(6 * GIB), 5 * GIB, GIB, oom_kill=2)
    found = cgroup.locate(proc(tmp_path, "0::/kubepods.slice/pod\n",
                               V2_MOUNT.format(point=root)))
    assert found is not None and found.version == 2
    reading = cgroup.read(found)
    assert (reading.limit, reading.usage, reading.working_set, reading.oom_kills) == \
        (6 * GIB, 5 * GIB, 4 * GIB, 2)


def test_cgroup_v2_the_tightest_ancestor_binds_and_memory_high_counts(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v2_level(root / "system.slice", str(4 * GIB), 3 * GIB + 512 * MIB, 0)  # 512 MiB of room
    v2_level(root / "system.slice" / "tfs.service", "max", GIB, 0, high=str(3 * GIB),
             oom_kill=1)
    found = cgroup.locate(proc(tmp_path, "0::/system.slice/tfs.service\n",
                               V2_MOUNT.format(point=root)))
    assert found is not None
    reading = cgroup.read(found)
    assert reading.path.endswith("system.slice") and reading.limit == 4 * GIB
    assert reading.oom_kills == 1  # the events of our own cgroup: our processes' kills
    # The unit alone: its memory.high (3 GiB) is the figure judged against, not "max".
    own = cgroup.read(cgroup.Location(2, found.directory, found.directory))
    assert (own.limit, own.high, own.binding_limit) == (None, 3 * GIB, 3 * GIB)


def test_cgroup_v2_without_a_memory_controller_is_none(tmp_path: Path) -> None:
    root = write(tmp_path / "cg" / "user.slice", {"cgroup.procs": ""})
    assert cgroup.locate(proc(tmp_path, "0::/user.slice\n",
                              V2_MOUNT.format(point=root.parent))) is None


def test_cgroup_v1_hierarchical_limit_and_unlimited(tmp_path: Path) -> None:
    point = tmp_path / "memory"
    own = write(point / "docker" / "abc", {
        "memory.limit_in_bytes": "9223372036854771712\n",
        "memory.usage_in_bytes": f"{3 * GIB}\n",
        "memory.stat": f"cache 1\nhierarchical_memory_limit {2 * GIB}\n"
                       f"total_inactive_file {GIB}\n",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"})
    # A container sees its own cgroup as the mount's root.
    found = cgroup.locate(proc(tmp_path, "12:memory:/docker/abc\n0::/\n",
                               V1_MOUNT.format(root="/docker/abc", point=point / "docker/abc")))
    assert found == cgroup.Location(1, own, point / "docker/abc")
    reading = cgroup.read(found)
    assert (reading.limit, reading.working_set, reading.oom_kills) == (2 * GIB, 2 * GIB, 4)
    (own / "memory.stat").write_text("hierarchical_memory_limit 9223372036854771712\n")
    assert cgroup.read(found).limit is None  # v1's "no limit"


def test_cgroup_v1_a_parents_limit_is_judged_against_the_parents_usage(tmp_path: Path) -> None:
    """A systemd slice (or a pod with a sidecar) on v1: a sibling's memory counts."""
    point = tmp_path / "memory"
    unlimited = "9223372036854771712\n"
    write(point, {"memory.limit_in_bytes": unlimited, "memory.usage_in_bytes": f"{8 * GIB}\n",
                  "memory.stat": ""})
    write(point / "slice", {"memory.limit_in_bytes": f"{300 * MIB}\n",
                            "memory.usage_in_bytes": f"{215 * MIB}\n",
                            "memory.stat": "total_inactive_file 0\n"})
    own = write(point / "slice" / "tfs", {
        "memory.limit_in_bytes": unlimited, "memory.usage_in_bytes": f"{26 * MIB}\n",
        "memory.stat": f"hierarchical_memory_limit {300 * MIB}\ntotal_inactive_file 0\n",
        "memory.oom_control": "oom_kill 0\n"})
    found = cgroup.locate(proc(tmp_path, "4:memory:/slice/tfs\n",
                               V1_MOUNT.format(root="/", point=point)))
    assert found is not None and found.directory == own
    reading = cgroup.read(found)
    assert (reading.path, reading.limit, reading.working_set) == \
        (str(point / "slice"), 300 * MIB, 215 * MIB)  # 85 MiB of room, not 274


def test_reader_never_raises_and_finds_the_cgroup_again(tmp_path: Path) -> None:
    point = tmp_path / "memory"
    files = {"memory.usage_in_bytes": "100\n", "memory.stat": "hierarchical_memory_limit 1000\n",
             "memory.oom_control": "oom_kill 0\n", "memory.limit_in_bytes": "1000\n"}
    write(point, {"memory.limit_in_bytes": "9223372036854771712\n",
                  "memory.usage_in_bytes": "5000\n", "memory.stat": ""})
    write(point / "svc", files)
    proc_dir = proc(tmp_path, "4:memory:/svc\n", V1_MOUNT.format(root="/", point=point))
    reader = cgroup.CgroupReader(proc_dir)
    assert reader.read() is not None
    (point / "svc" / "memory.usage_in_bytes").write_text("garbage\n")
    assert reader.read() is None  # logged once, judged by the host meanwhile
    (point / "svc" / "memory.usage_in_bytes").write_text("200\n")
    reading = reader.read()
    assert reading is not None and reading.usage == 200
    (proc_dir / "cgroup").write_text("")
    (point / "svc" / "memory.usage_in_bytes").unlink()
    assert reader.read() is None and reader.read() is None


def test_the_real_cgroup_of_this_process_reads() -> None:
    """On any Linux host with a memory controller: the reading is sane (no limit is fine)."""
    location = cgroup.locate()
    if location is None:
        assert not Path("/sys/fs/cgroup/memory").is_dir()
        return
    reading = cgroup.read(location)
    assert reading.usage > 0 and 0 <= reading.working_set <= reading.usage


def reading(limit: int | None, usage: int, inactive: int = 0, oom: int | None = 0,
            high: int | None = None) -> CgroupMemory:
    return CgroupMemory(2, "/cg", limit, usage, inactive, high, oom)


def test_headroom_is_the_tighter_of_host_and_container() -> None:
    budget = Budget()
    budget.update(reading(6 * GIB, 5 * GIB, inactive=GIB), host_available=50 * GIB)
    assert budget.headroom() == 2 * GIB  # 6 - (5 - 1)
    budget.update(reading(None, 5 * GIB), host_available=GIB)
    assert budget.headroom() == GIB and budget.pressure_floor(None) is None
    budget.update(None, None)
    assert budget.room(10 * GIB, 0, None).fits  # no limit: as before budgets existed


def test_kill_buffer_default_is_a_capped_fraction_and_a_setting_replaces_it() -> None:
    budget = Budget()
    budget.update(reading(2 * GIB, 0), None)
    assert budget.buffer(None) == int(2 * GIB * 0.05) == budget.pressure_floor(None)
    budget.update(reading(64 * GIB, 0), None)
    assert budget.buffer(None) == MAX_BUFFER
    assert budget.buffer(100 * MIB) == budget.pressure_floor(100 * MIB) == 100 * MIB


def test_room_counts_loading_workers_and_the_buffer() -> None:
    budget = Budget()
    budget.update(reading(4 * GIB, 2 * GIB), None)
    buffer = budget.buffer(None)
    assert budget.room(2 * GIB - buffer, 0, None).fits
    room = budget.room(2 * GIB - buffer, 1, None)
    assert not room.fits and "exceeds the limit 4096MiB" in str(room)
    assert room.fields()["working_set"] == 2 * GIB


def test_oom_counter_matches_kills_to_deaths_and_forgets_unclaimed_ones() -> None:
    oom = OomCounter()
    oom.read(5, poll=True)  # kills before the daemon started are not ours
    assert not oom.claim() and oom.total == 0
    oom.read(7, poll=False)
    assert oom.claim() and oom.claim() and not oom.claim() and oom.total == 2
    oom.read(8, poll=True)  # a kill seen by a poll before its worker's death was reaped
    oom.read(8, poll=True)
    assert oom.claim()  # still claimable at the poll after
    oom.read(9, poll=True)  # a descendant's OOM kill: no worker died of it
    oom.read(9, poll=True)
    oom.read(9, poll=True)
    assert not oom.claim()  # expired: a later kill -9 by someone else is not the kernel's


CONTAINER = """
supervisor:
  runtime_dir: /tmp/tfs-budget
models:
  a:
    handler: "mod:a"
    workers: 2
    policy: {warmup_jobs: 0, warmup_seconds: 0, max_memory: 1GiB, kill_memory: 2GiB,
             max_jobs: 1000}
"""


WARM = 900 * MIB  # what each worker uses once ready: its baseline, the replacement's size


def world(limit: int | None, usage: int, text: str = CONTAINER) -> World:
    w = World(text)
    container(w, limit, usage)
    for worker_id in list(w.memory):
        w.memory[worker_id] = WARM
        w.ready(worker_id)
    return w


def container(w: World, limit: int | None, usage: int, oom: int = 0) -> None:
    w.core.memory(CgroupMemory(1, "/cg", limit, usage, 0, None, oom), None, poll=True)


def spawned(w: World) -> list[str]:
    return [x.id for x in w.core.pool.workers.values() if x.state is State.STARTING]


def test_replacement_first_when_it_fits() -> None:
    w = world(8 * GIB, 2 * GIB)
    w.core.recycle("a", "a-1")
    w.poll()
    w.tick()
    assert spawned(w) == ["a-3"]  # beside a-1, which serves on until a-3 is ready
    assert w.core.pool.workers["a-1"].state is State.READY


def test_drain_first_when_no_room_then_the_replacement() -> None:
    w = world(3 * GIB, 2 * GIB)  # 2 GiB + 900 MiB + the buffer (154 MiB) > 3 GiB
    w.core.recycle("a", "a-1")
    w.poll()
    w.tick()
    assert w.core.pool.workers["a-1"].state is State.STOPPING  # drained (held nothing)
    assert spawned(w) == []  # not beside it
    w.tick(1.0)
    assert spawned(w) == []
    w.exit("a-1", 0)
    w.tick()
    assert spawned(w) == ["a-3"]  # the replacement follows it
    assert w.core.pool.models["a"].recycles == {"manual": 1}


def test_a_shrinking_limit_drains_a_worker_waiting_for_its_replacement() -> None:
    w = world(8 * GIB, 2 * GIB)
    w.core.recycle("a", "a-1")
    w.poll()
    w.tick()
    w.exit("a-3", 1)  # the replacement crashed while loading ...
    container(w, 3 * GIB, 2 * GIB)  # ... and the pod was resized meanwhile
    w.core.pool.models["a"].failures = 0  # (no back-off: this is about room)
    w.tick(60.0)
    assert w.core.pool.workers["a-1"].state is State.STOPPING
    assert spawned(w) == []


def test_two_replacements_do_not_count_on_the_same_free_memory() -> None:
    text = CONTAINER.replace("max_jobs: 1000}", "max_jobs: 1000, max_concurrent_recycles: 2}")
    w = world(2 * GIB + 512 * MIB, GIB, text)
    w.core.recycle("a", None)
    w.poll()
    w.tick()
    # 1 GiB used + a 900 MiB replacement + the buffer (128 MiB) fits 2.5 GiB; a second one
    # counts the first as loading (it will grow to 900 MiB too), and does not fit.
    assert len(spawned(w)) == 1
    assert all(w.core.pool.workers[x].state is State.READY for x in ("a-1", "a-2"))


def test_kill_memory_holds_whatever_the_budget() -> None:
    w = world(3 * GIB, 2 * GIB)
    w.memory["a-1"] = 2 * GIB
    w.poll()
    assert ("a-1", Reason.KILL_MEMORY) in w.killed


def test_kernel_oom_kill_is_named_with_the_figures() -> None:
    w = world(3 * GIB, 2 * GIB)
    container(w, 3 * GIB, 2 * GIB, oom=1)
    w.core.memory(CgroupMemory(1, "/cg", 3 * GIB, GIB, 0, None, 1), None, poll=False)
    w.exit("a-1", -9)
    state = w.core.pool.models["a"]
    assert state.exits == {ExitCause.OOM_KILLED: 1}
    w.exit("a-2", -9)  # no kill counted for this one: someone else's SIGKILL
    assert state.exits == {ExitCause.OOM_KILLED: 1, ExitCause.KILLED_EXTERNALLY: 1}
    controller = Controller(w.core, lambda answer: None, lambda: True, lambda: True)
    report = controller.status(w.now)
    assert report["memory_budget"]["oom_kills"] == 1
    text = render_status(report)
    assert "kernel OOM kills since start: 1" in text and "limit 3.0GiB" in text
    assert "LAST UNEXPECTED EXIT: killed_externally" in text  # the latest one
    state.last_unexpected_exit = {**(state.last_unexpected_exit or {}), "cause": "oom_killed",
                                  "worker": "a-1"}
    explained = controller.explain("a")["result"]
    assert "a-1 killed by the kernel's OOM killer at the container's limit (3.0GiB, 1 OOM " \
        "kill(s) since start)" in render_explain(explained)


def test_memory_pressure_is_the_containers_and_recycles_the_most_grown() -> None:
    w = world(4 * GIB, 4 * GIB - 100 * MIB)  # 100 MiB of headroom: under the 5 % buffer
    w.memory["a-2"] = WARM + 100 * MIB  # grew the most: its recycle frees the most
    w.memory["a-1"] = WARM + 20 * MIB
    w.poll()
    assert w.core.pool.models["a"].recycles == {"container_pressure": 1}
    assert w.core.pool.workers["a-2"].reason is Reason.CONTAINER_PRESSURE
    assert w.core.pool.workers["a-2"].state is not State.READY  # drained first: no room


def test_pressure_recycles_a_worker_grown_during_the_policys_warm_up() -> None:
    """Before its baseline (warm-up not over), growth counts from its reading when ready:
    a leak fast enough to fill the container within the warm-up is recycled all the same."""
    text = CONTAINER.replace("warmup_jobs: 0, warmup_seconds: 0", "warmup_jobs: 1000, "
                             "warmup_seconds: 1h")
    w = world(4 * GIB, 4 * GIB - 100 * MIB, text)
    assert w.core.pool.workers["a-1"].assessment.baseline is None
    w.memory["a-1"] = WARM + 100 * MIB
    w.poll()
    assert w.core.pool.workers["a-1"].reason is Reason.CONTAINER_PRESSURE


def test_pressure_with_nothing_grown_recycles_nobody_and_says_the_limit_is_too_small(
        capsys: pytest.CaptureFixture[str]) -> None:
    w = world(4 * GIB, 4 * GIB - 100 * MIB)  # fresh workers: recycling frees nothing
    for _ in range(5):
        w.tick(1.0)
        w.poll()
    assert w.core.pool.models["a"].recycles == {}
    assert capsys.readouterr().out.count("memory_budget_too_small") == 1  # not every poll


def test_a_waiting_recycle_after_a_failed_start_still_gets_its_room() -> None:
    """A replacement that failed to boot, then a smaller limit: once the back-off is over the
    waiting worker drains first (it used to wait for good, holding the model's recycles)."""
    w = world(8 * GIB, 2 * GIB)
    w.core.recycle("a", "a-1")
    w.poll()
    w.tick()
    w.exit("a-3", 1)  # the replacement fails to boot: the model backs off
    assert w.core.pool.models["a"].failures == 1
    container(w, 3 * GIB, 2 * GIB)
    w.tick(2.0)  # the back-off (1 s) is over: drained ...
    w.tick()  # ... and, holding nothing, stopped
    assert w.core.pool.workers["a-1"].state is State.STOPPING
    w.exit("a-1", 0)
    w.tick()
    assert spawned(w) == ["a-4"]


def test_metrics_carry_the_budget() -> None:
    w = world(4 * GIB, GIB)
    metrics = Metrics()
    metrics.publish(w.core.pool, w.core.router, w.core.budget)
    names = {m.name: m.samples[0].value for m in metrics.collect() if m.samples
             and m.name.startswith(("tfsupervisor_memory", "tfsupervisor_oom"))}
    assert names == {"tfsupervisor_memory_budget_bytes": 4 * GIB,
                     "tfsupervisor_memory_working_set_bytes": GIB,
                     "tfsupervisor_memory_headroom_bytes": 3 * GIB,
                     "tfsupervisor_oom_kills": 0}


@pytest.mark.parametrize(("limit", "problem"), [
    (None, None), (64 * GIB, None),
    (6 * GIB, "the workers at their limits (4096MiB"),  # 2 x 2 GiB + 2 GiB + buffer > 6 GiB
    (4 * GIB, "even without a replacement, the workers at their limits (4096MiB"),
])
def test_check_warns_when_the_workers_cannot_fit(limit: int | None, problem: str | None) -> None:
    config = parse_config(CONTAINER, Path("/tmp/tfs-budget/config.yaml"))
    budget = Budget()
    budget.update(reading(limit, 0), None)
    found = sizing_problem(config.models, budget, None)
    assert (found is None) if problem is None else (found is not None and problem in found)
    unbounded = parse_config(CONTAINER.replace("max_memory: 1GiB, kill_memory: 2GiB,", ""),
                             Path("/tmp/tfs-budget/config.yaml"))
    if limit is not None:
        assert "set neither kill_memory nor max_memory" in str(
            sizing_problem(unbounded.models, budget, None))


def test_check_warns_of_a_host_sized_floor_in_a_container() -> None:
    config = parse_config(CONTAINER.replace("runtime_dir: /tmp/tfs-budget",
                                            "runtime_dir: /tmp/tfs-budget\n  "
                                            "min_available_memory: 2GiB"),
                          Path("/tmp/tfs-budget/config.yaml"))
    budget = Budget()
    budget.update(reading(8 * GIB, 0), None)
    found = sizing_problem(config.models, budget, config.supervisor.min_available_memory)
    assert found is not None and "a quarter or more of the container's limit" in found


# --- a model never goes dark for a planned recycle (issue 46, item 1) ----------------------

def ready_ids(w: World) -> list[str]:
    return [x.id for x in w.core.pool.ready("a")]


def test_a_recycle_counts_until_its_replacement_is_ready() -> None:
    """Drain-first (no room beside it): the second worker's recycle waits until the first
    one's replacement is *ready*, not only until the old worker is gone (it used to begin
    0.2-0.4 s after the exit, both workers out while the replacement loaded)."""
    w = world(3 * GIB, 2 * GIB)
    w.core.recycle("a", "a-1")
    w.poll()
    w.tick()
    w.exit("a-1", 0)
    w.tick()
    assert spawned(w) == ["a-3"]
    w.core.recycle("a", "a-2")
    for _ in range(3):
        w.tick(1.0)
        w.poll()
        a2 = w.core.pool.workers["a-2"]
        assert a2.state is State.READY and not a2.leaving  # still loading: a-1's recycle
        assert held_back(w.core.pool, a2) == (Reason.MANUAL, Hold.MAX_CONCURRENT_RECYCLES)
    w.memory["a-3"] = WARM
    w.ready("a-3")
    w.poll()
    assert w.core.pool.workers["a-2"].leaving  # a-3 is ready: its turn
    assert ready_ids(w)  # and the model serves throughout


def test_two_workers_over_max_memory_in_one_poll_leave_one_serving() -> None:
    """Both cross max_memory in the same poll: one drains at once, the other (the model's last
    ready worker) serves on until a replacement is ready (both used to drain together)."""
    w = world(8 * GIB, 2 * GIB)
    w.memory["a-1"] = w.memory["a-2"] = GIB + 100 * MIB
    w.poll()
    w.tick()
    pool = w.core.pool
    assert all(pool.workers[x].reason is Reason.MAX_MEMORY for x in ("a-1", "a-2"))
    assert len(ready_ids(w)) == 1
    (serving,) = ready_ids(w)
    assert sorted(spawned(w)) == ["a-3", "a-4"]  # room for both beside it
    w.poll()  # still over: it serves on, no early drain
    assert ready_ids(w) == [serving]
    w.memory["a-3"] = WARM
    w.ready("a-3")
    w.poll()
    assert ready_ids(w) == ["a-3"]  # no longer the last ready: over max_memory, it goes
    assert pool.workers[serving].state is not State.READY


def test_tight_container_a_soft_limit_waits_for_room_and_never_empties_the_model() -> None:
    """No room beside them: one drains first, the other serves on; its replacement waits
    for room (make_room does not drain the last ready worker), and it goes once one is
    ready."""
    w = world(3 * GIB, 2 * GIB)
    w.memory["a-1"] = w.memory["a-2"] = GIB + 100 * MIB
    w.poll()
    w.tick()
    (serving,) = ready_ids(w)
    gone = "a-2" if serving == "a-1" else "a-1"
    assert spawned(w) == []  # no room beside it
    w.tick(1.0)
    w.exit(gone, 0)
    container(w, 3 * GIB, GIB + 200 * MIB)  # what the gone worker held is freed
    w.tick()
    (first,) = spawned(w)
    for _ in range(3):  # no room for the second replacement: it waits, and so does serving
        w.tick(1.0)
        w.poll()
        assert ready_ids(w) == [serving]
        assert held_back(w.core.pool, w.core.pool.workers[serving]) == (Reason.MAX_MEMORY,
                                                                        Hold.NO_ROOM)
    report = Controller(w.core, lambda answer: None, lambda: True, lambda: True).status(w.now)
    assert "serving on: the model's last ready worker, its replacement (max_memory) waits " \
        "for room in the container's memory" in render_status(report)
    w.memory[first] = WARM
    w.ready(first)
    w.poll()
    assert ready_ids(w) == [first]  # now the over-limit worker goes
    assert w.core.pool.workers[serving].state is not State.READY


def test_kill_memory_may_still_take_the_last_ready_worker() -> None:
    w = world(8 * GIB, 2 * GIB)
    w.memory["a-1"] = w.memory["a-2"] = 2 * GIB
    w.poll()
    assert {("a-1", Reason.KILL_MEMORY), ("a-2", Reason.KILL_MEMORY)} <= set(w.killed)


def test_the_room_a_replacement_needs_is_its_private_memory(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A warm worker's reading counts the libraries' pages it shares with the others, which
    a replacement does not add to the container again: with a private reading, the room
    needed is the warm size less the shared pages, and the event says so (a 900 MiB RSS
    with 600 MiB shared fits where 900 MiB did not)."""
    w = world(3 * GIB, 2 * GIB)  # 2 GiB + 900 MiB + the buffer (154 MiB) > 3 GiB
    w.core.next_poll = 0.0
    targets = w.core.poll_due(w.now) or []
    w.core.samples(w.now, {x: Reading(WARM, private=300 * MIB) for x, _, _ in targets})
    w.run()
    room = w.core.recycler.room("a")
    assert room.fits and room.needed == 300 * MIB and room.estimate == PRIVATE
    w.core.recycle("a", "a-1")
    w.core.samples(w.now, {x: Reading(WARM, private=300 * MIB) for x, _, _ in targets})
    w.run()
    w.tick()
    assert spawned(w) == ["a-3"]  # replacement first: it fits
    assert w.core.pool.workers["a-1"].state is State.READY
    out = capsys.readouterr().out
    assert "replacement_estimate=private" in out and "replacement_first=True" in out
    assert "a worker's private memory 300MiB" in out


def test_without_a_private_reading_the_estimate_is_a_warm_worker() -> None:
    w = world(3 * GIB, 2 * GIB)
    room = w.core.recycler.room("a")
    assert not room.fits and room.needed == WARM and room.estimate == "warm_size"


# --- the container's pressure line: the rate, not a fixed floor ----------------------------

LEAKY = CONTAINER.replace("max_memory: 1GiB, kill_memory: 2GiB", "max_memory: 3GiB")


def leak(w: World, per_poll: int, polls: int, limit: int, usage: int,
         host: int | None = None) -> int:
    """``polls`` polls a second apart, every worker in rotation ``per_poll`` bigger at each
    and the container's usage with them; returns the usage."""
    for _ in range(polls):
        w.tick(1.0)
        for worker in w.core.pool.ready("a"):
            w.memory[worker.id] += per_poll
            usage += per_poll
        w.core.memory(CgroupMemory(1, "/cg", limit, usage, 0, None, 0), host, poll=True)
        w.poll()
    return usage


def test_growth_rate_reads_a_rise_over_polls_not_one_reading() -> None:
    def samples(memory: list[int]) -> list[Sample]:
        return [Sample(float(t), 0, m) for t, m in enumerate(memory)]

    assert growth_rate(samples([100] * 6), None) == 0.0
    assert growth_rate(samples([100, 90, 80, 70, 60]), None) == 0.0  # shrinking: no growth
    assert growth_rate(samples([0, 10, 20, 30, 40, 50]), None) == 10.0
    # One reading 40 high in the middle of a flat series is not a leak of 40 a second.
    assert growth_rate(samples([100, 100, 140, 100, 100]), None) == 0.0
    # A leak that speeds up: its new rate counts once it holds over most of the window...
    assert growth_rate(samples([0, 0, 10, 30, 50, 70]), None) == 20.0
    # ...not while it rose over two intervals of four (one large batch, a step, is not a
    # leak: tests/test_pressure_edges.py).
    assert growth_rate(samples([0, 0, 0, 10, 30]), None) == 0.0
    # Samples closer than half a poll are one (the ready sample, a poll 50 ms after it),
    # and none is read before samples span a poll and a half.
    ready = [Sample(0.0, 0, 0), Sample(0.05, 0, 20), Sample(1.05, 0, 20)]
    assert growth_rate(ready, 0.0) == 0.0
    # Its loading (before ready) is budgeted as loading, not as a leak.
    assert growth_rate(samples([0, 500, 900, 900, 900]), since=2.0) == 0.0


def test_the_recycle_lead_is_a_poll_then_the_measured_way_out() -> None:
    budget = Budget()
    assert budget.lead(0.5) == 0.5 + 1.5 * 0.5  # none measured: a poll
    for seconds in (0.2, 0.3, 0.4):
        budget.way_out(seconds)
    assert budget.lead(0.5) == 0.5 + 1.5 * 0.5  # never less than a poll
    budget.way_out(3.0)  # one stop that met a busy machine does not set the line...
    assert budget.lead(0.5) == 0.5 + 1.5 * 0.5
    budget.way_out(1.0)  # ...two do
    assert budget.lead(0.5) == 0.5 + 1.5 * 1.0
    for _ in range(20):
        budget.way_out(0.1)
    assert len(budget.ways_out) == WAYS_OUT_KEPT
    for _ in range(2):  # drains held by a long job: a way out counts at most MAX_WAY_OUT
        budget.way_out(50.0)
    assert budget.lead(0.5) == 0.5 + 1.5 * MAX_WAY_OUT
    # The line is never above its cap (half the limit), nor under the kill buffer.
    assert Pressure(GIB, 50 * MIB, 100 * MIB, 76.0, GIB // 2).line == GIB // 2
    assert Pressure(GIB, 50 * MIB, 0.0, 1.0, 10 * MIB).line == 50 * MIB


def test_container_pressure_is_judged_by_the_rate_not_the_kill_buffer() -> None:
    """Two workers leak 50 MiB a poll each (100 MiB/s together) in a 4 GiB limit whose kill
    buffer is 205 MiB: the pressure line is 205 MiB + 100 MiB/s x 2.5 s (a poll, then a way
    out of at least a poll, x 1.5) = 455 MiB. At 424 MiB of headroom, far above the kill
    buffer that alone judged it before, the most grown worker drains: at that rate the
    limit is 4 s away."""
    limit = 4 * GIB
    w = world(limit, limit - GIB, LEAKY)
    usage = leak(w, 50 * MIB, 5, limit, limit - GIB)
    assert w.core.pool.models["a"].recycles == {}  # 774 MiB of headroom: over the line
    leak(w, 50 * MIB, 1, limit, usage)
    pressure = w.core.budget.pressure
    assert pressure is not None and pressure.headroom == 424 * MIB
    assert pressure.buffer == w.core.budget.buffer(None) < pressure.headroom < pressure.line
    assert pressure.line == pressure.buffer + 250 * MIB  # 100 MiB/s x 2.5 s
    assert w.core.pool.models["a"].recycles == {"container_pressure": 1}  # one frees enough
    [gone] = [x for x in w.core.pool.workers.values() if x.leaving]
    assert gone.reason is Reason.CONTAINER_PRESSURE and gone.state is not State.READY
    status = Controller(w.core, lambda answer: None, lambda: True, lambda: True).status(w.now)
    assert status["memory_budget"]["pressure_line"] == pressure.line
    assert "pressure line 454.8MiB: kill buffer 204.8MiB + growth 100.0MiB/s x recycle " \
        "lead 2.5s" in render_status(status)


def test_pressure_drains_several_when_one_cannot_free_enough_in_time() -> None:
    """Three workers grown 300 MiB each and growing 100 MiB/s each: one drained frees 300 MiB,
    short of the gap; a second drains beside it (past max_concurrent_recycles: the
    container's line is a hard one), and the model keeps its last ready worker."""
    limit = 4 * GIB
    w = world(limit, 3 * GIB, LEAKY.replace("workers: 2", "workers: 3"))
    leak(w, 100 * MIB, 3, limit, limit - 1200 * MIB)  # headroom 300 MiB, line 955 MiB
    state = w.core.pool.models["a"]
    assert state.recycles == {"container_pressure": 2}
    assert len(w.core.pool.ready("a")) == 1 and not w.core.pool.ready("a")[0].leaving


def test_headroom_that_will_not_last_a_poll_kills_before_the_kernel() -> None:
    limit = 4 * GIB
    w = world(limit, GIB, LEAKY)
    leak(w, 100 * MIB, 4, limit, GIB)  # 200 MiB/s together, with gigabytes to spare
    assert w.core.pool.models["a"].recycles == {}
    # Then something else in the container takes all but 250 MiB: 50 MiB left after this
    # poll's growth, a quarter of what the workers grow by before the next one.
    leak(w, 100 * MIB, 1, limit, limit - 250 * MIB)
    killed = [x for x in w.core.pool.workers.values() if x.killed]
    assert [x.kill_reason for x in killed] == [Reason.CONTAINER_PRESSURE]
    w.exit(killed[0].id, -9)
    assert w.core.pool.models["a"].exits == {ExitCause.KILLED_OVER_LIMIT: 1}


def test_under_a_limit_the_hosts_memory_is_named_when_it_is_the_tighter() -> None:
    limit = 4 * GIB
    w = world(limit, 2 * GIB, LEAKY)
    leak(w, 50 * MIB, 5, limit, 2 * GIB, host=300 * MIB)  # the host has less than the cgroup
    assert w.core.pool.models["a"].recycles == {"host_pressure": 1}
