"""Work off the loop (supervisor/daemon/offloop.py): a task's result or exception comes back
whole with a wake, and one running past its deadline is stuck and counted. The clock is a
fake one moved by hand and every wait is for a condition, bounded: nothing here is timed."""

from __future__ import annotations

import threading

import pytest

from supervisor.daemon.offloop import OffLoop, Task

BOUND = 10.0  # seconds a condition may take on a loaded machine before the test fails


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def runner() -> tuple[OffLoop, Clock, threading.Semaphore]:
    clock, woken = Clock(), threading.Semaphore(0)
    return OffLoop(woken.release, clock), clock, woken


def test_a_result_comes_back_with_a_wake() -> None:
    offloop, _, woken = runner()
    task = offloop.submit("answer", lambda: 42, timeout=5.0)
    assert woken.acquire(timeout=BOUND), "the loop is woken once the result is set"
    assert task.done() and task.result() == 42 and task.error is None
    assert task.name == "answer" and task.deadline == task.started + 5.0
    assert offloop.facts(offloop.clock()) == {"running": 0, "stuck": 0, "returned_late": 0}


def test_an_exception_comes_back_raised_by_result_never_in_the_thread() -> None:
    offloop, _, woken = runner()

    def fails() -> int:
        raise OSError("no such mount")

    task = offloop.submit("fails", fails, timeout=None)
    assert woken.acquire(timeout=BOUND)
    assert isinstance(task.error, OSError)
    with pytest.raises(OSError, match="no such mount"):
        task.result()


def test_a_task_past_its_deadline_is_stuck_and_counted_until_it_returns() -> None:
    offloop, clock, woken = runner()
    release = threading.Event()
    task: Task[str] = offloop.submit("hung", lambda: "late" if release.wait(BOUND) else "",
                                     timeout=2.0)
    assert not task.done() and not task.stuck(clock.now)
    with pytest.raises(RuntimeError):
        task.result()  # nothing to read before it returns
    assert offloop.facts(clock.now) == {"running": 1, "stuck": 0, "returned_late": 0}
    clock.now += 2.0  # its deadline passes: the caller gives up on it, never joins it
    assert task.stuck(clock.now) and offloop.stuck(clock.now) == [task]
    assert offloop.facts(clock.now) == {"running": 1, "stuck": 1, "returned_late": 0}
    release.set()  # the file system answers at last
    assert woken.acquire(timeout=BOUND)
    assert task.wait(BOUND)
    assert task.result() == "late" and not task.stuck(clock.now)
    assert offloop.stuck(clock.now) == []
    assert offloop.facts(clock.now) == {"running": 0, "stuck": 0, "returned_late": 1}


def test_wait_gives_up_at_its_timeout_and_the_task_runs_on() -> None:
    offloop, _, woken = runner()
    release = threading.Event()
    task = offloop.submit("hung", lambda: release.wait(BOUND), timeout=1.0)
    assert not task.wait(0)  # what the CLI does with its --timeout
    release.set()
    assert task.wait(BOUND) and task.result() is True
    assert woken.acquire(timeout=BOUND)


def test_without_a_deadline_a_task_is_never_stuck() -> None:
    offloop, clock, _ = runner()
    release = threading.Event()
    task = offloop.submit("slow", lambda: release.wait(BOUND), timeout=None)
    clock.now += 1e9
    assert not task.stuck(clock.now) and offloop.facts(clock.now)["stuck"] == 0
    release.set()
    assert task.wait(BOUND)
