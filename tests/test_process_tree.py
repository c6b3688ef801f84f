"""A worker's child processes: measured at every poll, and never outliving the worker.

Real processes throughout: a live daemon whose handler shells out (tests/live_handlers.py,
Spawner), and the tree finder on process trees this test starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from supervisor.client.testing import start_supervisor
from supervisor.config.worker_spec import INSTANCE_VAR
from supervisor.daemon import leftovers
from supervisor.daemon.sampling import read_memory, read_memory_of
from supervisor.daemon.tree import Proc, Trees, kill, read_proc
from tests.conftest import Supervisor
from tests.live_handlers import SESSION_CHILD

CHILD_BYTES = 200 * 1024**2


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Alive and not a zombie: a zombie holds no memory, but one left unreaped is a leak
    of its own (checked separately)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pid: int) -> bool:
    """Neither running nor an unreaped zombie."""
    return not psutil.pid_exists(pid)


def pids_in(path: Path, kind: str) -> list[int]:
    if not path.exists():
        return []
    return [int(line.split()[1]) for line in path.read_text().splitlines()
            if line.startswith(kind + " ")]


def spawner_config(pids: Path) -> dict[str, Any]:
    return {"models": {"sp": {
        "handler": "tests.live_handlers:spawner", "workers": 1,
        "options": {"pids": str(pids), "child_bytes": CHILD_BYTES},
        "policy": {"warmup_jobs": 0, "warmup_seconds": "0s"}}}}


def mark(sup: Supervisor, value: float) -> None:
    with sup.client() as client:
        client.infer("sp", {"x": np.full((1, 4), value, np.float32)})


def spawn_child(sup: Supervisor, pids: Path, value: float, kind: str) -> int:
    """Have the handler start the child that ``value`` marks; its pid once it says it."""
    mark(sup, value)
    wait_until(lambda: len(pids_in(pids, kind)) == 1, f"the {kind} child")
    (pid,) = pids_in(pids, kind)
    return pid


# --- the tree finder, on trees this test starts -------------------------------------------

def test_a_tree_is_found_whole_and_counted() -> None:
    root = subprocess.Popen(["sh", "-c", "sleep 60 & (sleep 60 & wait) & wait"],
                            process_group=0)
    try:
        trees = Trees()
        wait_until(lambda: (trees.refresh({root.pid: "w"}), len(trees.of(root.pid)) == 3)[1],
                   "a child, a subshell and its child")
        alone = read_memory(root.pid, "rss")
        together = read_memory_of([root.pid, *trees.of(root.pid)], "rss")
        assert alone is not None and together is not None and together > alone
        members = trees.of(root.pid)
        root.kill()  # unreaped: the group's number is still the worker's
        os.waitid(os.P_PID, root.pid, os.WEXITED | os.WNOWAIT)
        assert trees.take_down(root.pid) >= 3
        wait_until(lambda: not any(running(p) for p in members), "the tree killed")
    finally:
        with_children_killed(root)
    assert trees.of(root.pid) == []  # forgotten with the worker


def test_take_down_reaches_a_descendant_that_left_the_group() -> None:
    """setsid leaves the process group, so killpg misses it: the last-seen tree does not."""
    root = subprocess.Popen(["sh", "-c", "setsid sleep 60 & wait"], process_group=0)
    try:
        trees = Trees()

        def left_group() -> bool:
            trees.refresh({root.pid: "w"})
            members = [read_proc(p) for p in trees.of(root.pid)]
            return any(m is not None and m.pgid != root.pid for m in members)

        wait_until(left_group, "the setsid child")
        escaped = [p for p in trees.of(root.pid) if os.getpgid(p) != root.pid]
        os.kill(root.pid, signal.SIGKILL)
        os.waitid(os.P_PID, root.pid, os.WEXITED | os.WNOWAIT)
        trees.take_down(root.pid)
        wait_until(lambda: not any(running(p) for p in escaped), "the setsid child killed")
    finally:
        with_children_killed(root)


def test_kill_never_hits_a_process_that_reused_the_pid() -> None:
    """A start time that differs means another process has the pid now: left alone."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        now = read_proc(proc.pid)
        assert now is not None
        assert not kill(Proc(now.pid, now.ppid, now.pgid, now.start + 1))
        assert proc.poll() is None
        assert kill(now)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        with_children_killed(proc)


def with_children_killed(root: subprocess.Popen[bytes]) -> None:
    with_tree = psutil.Process(root.pid).children(recursive=True) if running(root.pid) else []
    for child in with_tree:
        child.kill()
    root.kill()
    root.wait()


# --- a live daemon --------------------------------------------------------------------------

def test_a_childs_memory_counts_at_once_and_it_dies_with_its_worker(
        supervisor_factory: Any, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    sup = supervisor_factory(spawner_config(pids))
    child = spawn_child(sup, pids, 1.0, "held")
    # Measured at the next polls (0.2 s apart here), not after a 30 s rescan.
    sup.wait_for(lambda s: any(w["memory"] and w["rss"] and
                               w["memory"] - w["rss"] > CHILD_BYTES * 0.8
                               for w in s["models"]["sp"]["workers"]),
                 timeout=20, what="the child's memory in the worker's")
    (worker,) = sup.workers("sp")
    sup.admin("recycle", model="sp", worker=worker["id"])
    sup.wait_for(lambda s: worker["id"] not in [w["id"] for w in s["models"]["sp"]["workers"]],
                 what="the old worker gone")
    wait_until(lambda: gone(child), "the child killed and reaped with its worker")
    sup.wait_ready()


def test_an_escaped_descendant_is_killed_and_reported_and_stop_leaves_nothing(
        supervisor_factory: Any, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    sup = supervisor_factory(spawner_config(pids))
    escaped = spawn_child(sup, pids, 2.0, "escaped")
    wait_until(lambda: gone(escaped), "the escaped child killed and reaped")
    assert '"descendant_escaped"' in sup.log()
    held = spawn_child(sup, pids, 1.0, "held")  # one more, in the group, then stop
    assert sup.stop() == 0
    wait_until(lambda: not running(held), "the child killed when the daemon stops")


def test_a_descendant_seen_in_the_tree_that_escapes_without_its_mark_is_killed(
        supervisor_factory: Any, tmp_path: Path) -> None:
    """A child that cleared its environment carries no TFSUPERVISOR_TREE mark; once seen in
    a worker's tree it is known by pid and start time when it turns up orphaned outside
    the group."""
    pids = tmp_path / "pids"
    sup = supervisor_factory(spawner_config(pids))
    bare = spawn_child(sup, pids, 3.0, "bare")
    born = time.monotonic()

    def polled_since_born() -> bool:
        asked = time.monotonic()  # before the question: the sample is no later than this
        ago = sup.workers("sp")[0]["sampled_ago"]
        return ago is not None and asked - ago > born

    wait_until(polled_since_born, "a memory poll after the child was born", timeout=30)
    Path(f"{pids}.release").touch()  # its parent exits: an orphan outside the group
    wait_until(lambda: gone(bare), "the unmarked escaped child killed and reaped")
    assert '"descendant_escaped"' in sup.log()


def test_a_killed_supervisors_leftovers_are_reaped_by_the_next_one_on_its_runtime_dir(
        supervisor_factory: Any, tmp_path: Path) -> None:
    """``kill -9`` of the daemon outside systemd: its worker dies with it, but the worker's
    child in a session of its own lives on. The next daemon on the same runtime dir kills
    it, known by the mark the first one set (checked with its start time), and says so; a
    look-alike without the mark, or with another runtime dir's, is left alone."""
    pids, others = tmp_path / "pids", tmp_path / "others"
    config = spawner_config(pids)
    first = supervisor_factory(config)
    (worker,) = first.workers("sp")
    session = spawn_child(first, pids, 4.0, "session")
    record = json.loads((first.runtime_dir / leftovers.RECORD).read_text())
    lookalikes = [subprocess.Popen([sys.executable, "-c", SESSION_CHILD, str(others)],
                                   start_new_session=True, env=env)
                  for env in ({k: v for k, v in os.environ.items() if k != INSTANCE_VAR},
                              {**os.environ, INSTANCE_VAR: f"{record['id']}@/elsewhere"})]
    try:
        wait_until(lambda: len(pids_in(others, "session")) == 2, "the look-alikes")
        first.process.kill()  # kill -9: no shutdown, nothing taken down
        first.process.wait()
        wait_until(lambda: not running(worker["pid"]), "the worker dead with its supervisor")
        assert running(session)  # left behind
        second = start_supervisor(config, workdir=first.config_path.parent)
        try:
            second.wait_ready()
            wait_until(lambda: not running(session), "the leftover reaped")
            reaped = [json.loads(line) for line in second.log().splitlines()
                      if '"leftovers_reaped"' in line]
            assert len(reaped) == 1 and session in reaped[0]["pids"], reaped
            assert reaped[0]["previous_instance"] == record["id"]
            assert all(p.poll() is None for p in lookalikes)  # not ours: left alone
            assert second.stop() == 0
            assert not (second.runtime_dir / leftovers.RECORD).exists()  # a clean stop
        finally:
            second.stop()
    finally:
        for process in lookalikes:
            process.kill()
            process.wait()
