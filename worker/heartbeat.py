"""The worker's heartbeat thread: alive is not the same as done.

It runs beside inference (TF releases the GIL in its kernels), so a long job is not taken
for a hang, while a process wedged in native code holding the GIL, or stopped, goes silent.
It also watches the parent: a worker never outlives its supervisor. The parent watched is
the supervisor's pid from the spec (``parent_pid``), never one read in the worker: a worker
whose supervisor died before it started must not take init for its parent.
"""

from __future__ import annotations

import contextlib
import os
import threading

import zmq

from supervisor.shared.exitcodes import WorkerExit
from supervisor.shared.protocol import HEARTBEAT, Message, encode, signed
from worker import runtime
from worker.probes import ProbeRecorder


class Heartbeat(threading.Thread):
    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str, worker_id: str,
                 interval: float, parent_pid: int, secret: str,
                 probes: ProbeRecorder | None) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.context, self.endpoint, self.worker_id = context, endpoint, worker_id
        self.interval, self.parent_pid, self.secret = interval, parent_pid, secret
        self.jobs = 0  # written by the serving loop only; read here
        self.probes = probes  # None: probes off for this model
        self._halt = threading.Event()

    def run(self) -> None:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10)  # stale heartbeats are worthless: never pile up
        sock.connect(self.endpoint)
        try:
            while not self._halt.wait(self.interval):
                if os.getppid() != self.parent_pid:
                    os._exit(WorkerExit.ORPHANED)
                header = {"worker": self.worker_id, "jobs": self.jobs,
                          "tf_memory": runtime.tf_memory_info()}
                if self.probes is not None:
                    # The serving loop swaps in a new immutable snapshot, never changes one:
                    # reading the reference is all the synchronisation needed.
                    header["probes"] = self.probes.latest.to_wire()
                with contextlib.suppress(zmq.Again):
                    sock.send_multipart(encode(signed(Message(HEARTBEAT, b"", header),
                                                      self.secret)), zmq.NOBLOCK)
        finally:
            sock.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2 * self.interval + 1)
