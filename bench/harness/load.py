"""Client load: forked client processes (the bench process never imports TensorFlow, and one
process would be held back by its own GIL), each of client threads calling a transport.

- closed loop: ``clients`` callers back to back for a while; latency from each send;
- open loop: Poisson arrivals at a fixed rate, latency from each request's *scheduled* send
  time, so a stalled server cannot hide its queue (no coordinated omission); answers not
  back ``drain_s`` after the schedule ended count as failures.

Each client process also reads its own CPU time over the window (``Tally.cpu``).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from bench.harness.transport import Inputs, Transport

CLIENTS = 32  # concurrent closed-loop callers
PROCESSES = 4  # client processes they are spread over
OPEN_THREADS = 16  # per client process in the open loop: at most 64 requests in flight
DRAIN_S = 30.0
START_S = 0.2  # the open loop's schedule starts this long after its process does


@dataclass
class Tally:
    """What the clients saw: each answered request's latency (seconds) and the wall-clock
    time it came back, the failures, and the client processes' CPU seconds."""

    latencies: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    failures: int = 0
    cpu: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, seconds: float | None) -> None:
        with self.lock:
            if seconds is None:
                self.failures += 1
            else:
                self.latencies.append(seconds)
                self.ends.append(time.time())

    def parts(self) -> tuple[list[float], list[float], int, float]:
        return self.latencies, self.ends, self.failures, self.cpu

    def merge(self, latencies: list[float], ends: list[float], failures: int,
              cpu: float) -> None:
        self.latencies += latencies
        self.ends += ends
        self.failures += failures
        self.cpu += cpu


def schedule(rate: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson send times (seconds from the start) at ``rate`` per second, within
    ``seconds``."""
    offsets = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 2) + 10))
    return offsets[offsets < seconds]


@dataclass(frozen=True)
class Load:
    """A workload's requests sent over ``transport``: ``requests(seed)`` is an endless
    stream of one request's inputs, ``check`` raises unless an answer's values are right."""

    transport: Transport
    requests: Callable[[int], Iterator[Inputs]]
    check: Callable[[np.ndarray], None]
    clients: int = CLIENTS
    processes: int = PROCESSES

    @property
    def spread(self) -> tuple[int, int]:
        """(client processes, threads per process)."""
        processes = max(1, min(self.processes, self.clients))
        return processes, max(1, self.clients // processes)

    def closed(self, seconds: float, seed: int = 0) -> Tally:
        processes, threads = self.spread
        return gather(self._closed, lambda i: (seconds, threads, seed * 10 + i), processes,
                      seconds + 300)

    def open(self, seconds: float, rate: float, seed: int = 0, threads: int = OPEN_THREADS,
             drain_s: float = DRAIN_S) -> Tally:
        processes, _ = self.spread
        return gather(self._open, lambda i: (seconds, rate / processes, seed * 10 + i,
                                             threads, drain_s),
                      processes, seconds + drain_s + 300)

    def _closed(self, seconds: float, threads: int, seed: int, out: Any) -> None:
        call, check, tally = self.transport.connect(), self.check, Tally()
        deadline = time.monotonic() + seconds

        def loop(stream: Iterator[Inputs]) -> None:
            for inputs in stream:
                if time.monotonic() >= deadline:
                    return
                start = time.perf_counter()
                try:
                    check(call(inputs))
                    tally.add(time.perf_counter() - start)
                except Exception:
                    tally.add(None)

        measured(tally, [threading.Thread(target=loop, args=(self.requests(seed * 100 + i),))
                         for i in range(threads)])
        out.put(tally.parts())

    def _open(self, seconds: float, rate: float, seed: int, threads: int, drain_s: float,
              out: Any) -> None:
        """Poisson sends at ``rate``/s for ``seconds``; latency from each scheduled send."""
        call, check, tally = self.transport.connect(), self.check, Tally()
        stream = self.requests(seed)
        due = schedule(rate, seconds, np.random.default_rng(seed))
        planned = iter([(float(t), next(stream)) for t in due])
        lock = threading.Lock()
        start = time.perf_counter() + START_S
        drain_by = start + seconds + drain_s

        def sender() -> None:
            while True:
                with lock:
                    item = next(planned, None)
                if item is None:
                    return
                when, inputs = start + item[0], item[1]
                if (ahead := when - time.perf_counter()) > 0:
                    time.sleep(ahead)  # the schedule itself, not a wait for a condition
                if time.perf_counter() > drain_by:
                    tally.add(None)
                    continue
                try:
                    check(call(inputs))
                    done = time.perf_counter()
                    tally.add(done - when if done <= drain_by else None)
                except Exception:
                    tally.add(None)

        measured(tally, [threading.Thread(target=sender) for _ in range(threads)])
        out.put(tally.parts())


def measured(tally: Tally, threads: list[threading.Thread]) -> None:
    """Run ``threads`` to their end; their process's CPU seconds meanwhile go to ``tally``."""
    me = psutil.Process()
    before = me.cpu_times()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = me.cpu_times()
    tally.cpu = after.user + after.system - before.user - before.system


def gather(run: Callable[..., None], args: Callable[[int], tuple[Any, ...]], processes: int,
           timeout: float) -> Tally:
    """``processes`` forked processes, process i running ``run(*args(i), queue)``: what
    they put on the queue, added up."""
    tally = Tally()
    for parts in fork_clients(run, args, processes, timeout):
        tally.merge(*parts)
    return tally


def fork_clients(run: Callable[..., None], args: Callable[[int], tuple[Any, ...]],
                 processes: int, timeout: float) -> list[Any]:
    """What each of ``processes`` forked processes put on its queue (forked: the bench
    process never imports TensorFlow, and the transport is connected after the fork)."""
    context = mp.get_context("fork")
    out = context.Queue()
    procs = [context.Process(target=run, args=(*args(i), out)) for i in range(processes)]
    for proc in procs:
        proc.start()
    try:  # read before joining: a child blocks until its results are taken
        return [out.get(timeout=timeout) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
