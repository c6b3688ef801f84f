"""Work off the main loop: a blocking call (a file read that may hang on a network mount)
run in a thread of its own, with a deadline, its result or exception handed back whole.

The one way the daemon (and the CLI) runs such a call. ``OffLoop.submit`` starts it and
returns a ``Task`` at once. The thread writes only its task's outcome, then sets the task's
event and calls the runner's ``wake`` (the daemon's: the poller returns, so what was read is
applied on the next turn rather than at the next housekeeping). The caller reads the
outcome only once ``done()`` is true: the event orders the thread's writes before it.

A thread blocked in the kernel cannot be stopped, so a task still running past its deadline
is *stuck*: never joined on the loop, left to return when it does, and counted
(``facts``). Callers decide what a stuck task means to them (a reload refuses to stack
another read on one; a code check waits for it before starting the next).

Only a caller that is not the loop may block on a task (``wait``): the CLI, and the daemon
before its loop starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _nothing() -> None:
    pass


class Task(Generic[T]):
    """One call running (or run) off the loop. Its fields are the thread's until
    ``done()``; the caller's after."""

    def __init__(self, name: str, started: float, deadline: float | None) -> None:
        self.name = name
        self.started = started
        self.deadline = deadline  # None: none (never stuck)
        self.value: T | None = None
        self.error: BaseException | None = None
        self.returned_at: float | None = None
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()

    def stuck(self, now: float) -> bool:
        """Still running past its deadline."""
        return self.deadline is not None and now >= self.deadline and not self.done()

    def wait(self, timeout: float | None) -> bool:
        """Block until done or ``timeout`` seconds passed; whether it is done. Never on the
        loop."""
        return self._done.wait(timeout)

    def result(self) -> T:
        """What the call returned, or its exception raised; only once done."""
        if not self.done():
            raise RuntimeError(f"{self.name} has not returned")
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set by a call that returned


class OffLoop:
    """Starts tasks and keeps the ones running, for ``facts``."""

    def __init__(self, wake: Callable[[], None] = _nothing,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.wake = wake  # called from the task's thread once its outcome is set
        self.clock = clock
        self._lock = threading.Lock()  # guards _running and _late: both threads touch them
        self._running: set[Task[Any]] = set()
        self._late = 0  # tasks that returned after their deadline

    def submit(self, name: str, call: Callable[[], T], timeout: float | None) -> Task[T]:
        """``call`` started in a thread named ``name``; stuck once ``timeout`` seconds
        passed without its return (None: never)."""
        now = self.clock()
        task: Task[T] = Task(name, now, None if timeout is None else now + timeout)
        with self._lock:
            self._running.add(task)
        threading.Thread(target=self._run, args=(task, call), name=name, daemon=True).start()
        return task

    def _run(self, task: Task[T], call: Callable[[], T]) -> None:
        try:
            task.value = call()
        except BaseException as exc:  # handed to the caller, never raised in this thread
            task.error = exc
        task.returned_at = returned = self.clock()
        with self._lock:
            self._running.discard(task)
            if task.deadline is not None and returned >= task.deadline:
                self._late += 1
        task._done.set()
        self.wake()

    def stuck(self, now: float) -> list[Task[Any]]:
        """The tasks running past their deadline now, oldest first."""
        with self._lock:
            running = list(self._running)
        return sorted((t for t in running if t.stuck(now)), key=lambda t: t.started)

    def facts(self, now: float) -> dict[str, int]:
        """Tasks running, stuck among them, and those that returned past their deadline."""
        with self._lock:
            running, late = list(self._running), self._late
        return {"running": len(running), "stuck": sum(t.stuck(now) for t in running),
                "returned_late": late}
