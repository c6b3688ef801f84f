"""Python client for tfsupervisor (no TensorFlow needed).

    from supervisor.client import Client, JobError
    with Client("ipc://run/frontend.sock", timeout=10) as client:
        outputs = client.infer("demo", {"features": batch})

``Client`` is safe to share across threads: each thread gets its own ZeroMQ socket.
``supervisor.aclient.AsyncClient`` offers the same calls, and failover, to one asyncio loop.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq
from zmq.backend import zmq_poll

from supervisor.client.curve import make_curve_client
from supervisor.client.errors import (
    ERRORS,
    BadRequest,
    DeadlineExceeded,
    InternalError,
    JobError,
    JobTimeout,
    NoReply,
    Overloaded,
    ShuttingDown,
    Unavailable,
    UnknownModel,
    WorkerCrashed,
    error_from,
)
from supervisor.client.failover import CONNECT_WAIT, Attempt, Lost, NotSent, Rotation
from supervisor.shared.protocol import (
    CONTROL,
    DEFAULT_LIMITS,
    ERROR,
    INFER,
    MODELS,
    RESULT,
    Frame,
    Limits,
    Message,
    decode,
    encode,
    pack_arrays,
    unpack_arrays,
)
from supervisor.shared.transport import ipv6_for, recv, send

POLLIN = int(zmq.POLLIN)

__all__ = ["ERRORS", "BadRequest", "Client", "DeadlineExceeded", "InternalError", "JobError",
           "JobTimeout", "NoReply", "Overloaded", "ShuttingDown", "Unavailable", "UnknownModel",
           "WorkerCrashed", "control", "error_from"]


def curve_keys(server_key: str | bytes | None,
               client_cert: str | None) -> tuple[str | bytes, str] | None:
    """The CURVE keys a client socket needs, or None for a plain connection."""
    return (server_key, client_cert) if server_key and client_cert else None


# The longest timeout a call may wait: ZeroMQ's poll takes milliseconds in a C int (~24
# days at most); a day is beyond any job's wait.
MAX_TIMEOUT = 86400.0


def checked_timeout(timeout: object) -> float:
    """``timeout`` if it is a number of seconds a job can carry; else a ValueError that says
    so (NaN, infinity or a negative number would fail deep in the client, or wait never)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be a number of seconds, more than 0 and at most "
                         f"{MAX_TIMEOUT:.0f}, got {timeout!r}")
    return float(timeout)


def missing_socket(endpoint: str) -> bool:
    """An ipc endpoint with no socket file has no daemon behind it: callers say so at once
    rather than after their whole timeout (ZeroMQ waits for the file to appear)."""
    path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
    return path is not None and not path.startswith("@") and not os.path.exists(path)


def reply_wait(timeout: float) -> float:
    """How long a call with ``timeout`` waits for its reply: the timeout, no longer (with
    5 s it gave up after 5.6 s once). The job itself carries less (job_budget), so that the
    supervisor's own verdict (deadline_exceeded, say) arrives within it rather than a bare
    NoReply."""
    return timeout


def job_budget(left: float) -> float:
    """The time a job gets at the supervisor when its caller has ``left`` seconds: about a
    tenth less, the rest for its verdict to travel back."""
    return left / 1.1


def endpoint_list(endpoint: str | Sequence[str]) -> list[str]:
    return [endpoint] if isinstance(endpoint, str) else list(endpoint)


class JobIds:
    """Job ids unique to this process: a random prefix and a count (16 bytes). uuid4 reads
    the OS's random source on every call; the ids only need to tell this process's jobs
    apart. A forked child draws a new prefix."""

    def __init__(self) -> None:
        self.renew()
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.prefix, self.count = os.urandom(8), itertools.count()

    def next(self) -> bytes:
        return self.prefix + next(self.count).to_bytes(8, "big")


job_ids = JobIds()


def request_message(model: str, inputs: Mapping[str, Any], timeout: float | None) -> Message:
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a mapping of input name to array, got "
                        f"{type(inputs).__name__}")
    specs, frames = pack_arrays(inputs)
    return frames_message(model, specs, frames, timeout)


def frames_message(model: str, specs: list[dict[str, Any]], frames: Sequence[Frame],
                   timeout: float | None) -> Message:
    """An infer message of arrays already in the protocol's frames (an HTTP front's binary
    tensor data goes through as it came)."""
    header: dict[str, Any] = {"model": model, "inputs": specs}
    if timeout is not None:
        header["timeout_ms"] = max(1, int(job_budget(timeout) * 1000))
    return Message(INFER, job_ids.next(), header, list(frames))


def outcome(msg: Message) -> dict[str, np.ndarray]:
    if msg.kind == ERROR:
        raise error_from(msg.header)
    if msg.kind != RESULT:
        raise InternalError(f"unexpected reply kind {msg.kind!r}")
    return unpack_arrays(msg.header.get("outputs"), msg.arrays, field="outputs")


def _dealer(context: zmq.Context[Any], endpoints: list[str], immediate: bool = True,
            curve: tuple[Any, ...] | None = None) -> Any:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if immediate:  # only queue to supervisors actually connected (must precede connect)
        sock.setsockopt(zmq.IMMEDIATE, 1)
    if curve is not None:
        make_curve_client(sock, *curve)
    for endpoint in endpoints:
        sock.setsockopt(zmq.IPV6, ipv6_for(endpoint))  # each connect takes the value it sees
        sock.connect(endpoint)
    return sock


def watched_dealer(context: zmq.Context[Any], endpoint: str,
                   curve: tuple[Any, ...] | None) -> tuple[Any, Any]:
    """A DEALER to one supervisor that queues only while connected, and a monitor socket
    that reports the connection dropping."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only to a connected supervisor
    # Replies are taken in whatever their number: they answer this client's own calls, so
    # its calls out bound them. A bound here (1000 by default) stopped the reading once
    # that many waited, the supervisor's queue to us filled, and its ROUTER dropped the rest
    # (measured: 1,200 of 5,000 calls sent at once on one AsyncClient ended no_reply).
    sock.setsockopt(zmq.RCVHWM, 0)
    if curve is not None:
        make_curve_client(sock, *curve)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.setsockopt(zmq.IPV6, ipv6_for(endpoint))  # tcp://[::1]:N needs it
    sock.connect(endpoint)
    return sock, monitor


class _Link:
    """One thread's socket to one supervisor, with a monitor to see the connection drop."""

    def __init__(self, context: zmq.Context[Any], endpoint: str, curve: tuple[Any, ...] | None):
        self.endpoint = endpoint
        self.sock, self.monitor = watched_dealer(context, endpoint, curve)
        # zmq_poll on a list built once: pyzmq's Poller and Socket.poll build their lists,
        # and Socket.poll a whole Poller, on every call.
        self.watch = [(self.sock, POLLIN), (self.monitor, POLLIN)]
        self.watch_monitor = self.watch[1:]
        self.send_wait = -1

    def exchange(self, msg: Message, deadline: float) -> Message:
        while zmq_poll(self.watch_monitor, 0):  # old news: only a drop after our send matters
            self.monitor.recv_multipart()
        wait = int(min(CONNECT_WAIT, max(0.001, deadline - time.monotonic())) * 1000) + 1
        if wait != self.send_wait:  # a socket option costs a system call: set on change
            self.sock.setsockopt(zmq.SNDTIMEO, wait)
            self.send_wait = wait
        try:
            send(self.sock, encode(msg))
        except zmq.Again:
            raise NotSent from None
        while (left := deadline - time.monotonic()) > 0:
            ready = zmq_poll(self.watch, int(left * 1000) + 1)
            if ready and ready[-1][0] is self.monitor:  # listed in the order of self.watch
                self.monitor.recv_multipart()
                raise Lost
            if ready:
                reply = decode(recv(self.sock), DEFAULT_LIMITS)
                if reply.job_id == msg.job_id:
                    return reply
                # else: a late reply to an earlier call that timed out; drop it
        raise TimeoutError

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


class Client:
    """Blocking client. With several endpoints it spreads jobs round-robin over the
    supervisors, passes over one that is down or shutting down, and retries elsewhere:

    - always, when the job surely did not run (no connection, or answered shutting_down,
      overloaded or unavailable);
    - when the connection dropped while the job was out, only if ``retry_unanswered``
      (default True: inference is free of side effects). Then the job may have run twice.

    A reply that never comes within the timeout is never retried: ``NoReply``.
    """

    def __init__(self, endpoint: str | Sequence[str], timeout: float = 30.0,
                 context: zmq.Context[Any] | None = None, *,
                 server_key: str | bytes | None = None, client_cert: str | None = None,
                 retry_unanswered: bool = True) -> None:
        self.endpoints = endpoint_list(endpoint)
        self.timeout = checked_timeout(timeout)
        self.retry_unanswered = retry_unanswered
        self._curve = curve_keys(server_key, client_cert)
        self._context = context or zmq.Context.instance()
        self._local = threading.local()
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._rotation = Rotation(self.endpoints)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for link in self._links:
                link.close()
            self._links.clear()
        self._local = threading.local()

    def infer(self, model: str, inputs: Mapping[str, Any],
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run one job; returns the model's outputs or raises a JobError subclass."""
        timeout = self.timeout if timeout is None else checked_timeout(timeout)
        return outcome(self._call(request_message(model, inputs, timeout), reply_wait(timeout)))

    def models(self, timeout: float | None = None) -> dict[str, Any]:
        """Served models: input/output specs, ready workers, availability."""
        timeout = self.timeout if timeout is None else checked_timeout(timeout)
        reply = self._call(Message(MODELS, job_ids.next()), timeout)
        if reply.kind == ERROR:
            raise error_from(reply.header)
        return dict(reply.header.get("models", {}))

    def _call(self, msg: Message, timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        attempt = Attempt(self._rotation, self.retry_unanswered, timeout, deadline)
        for tries, endpoint in enumerate(attempt.endpoints()):
            link = self._link(endpoint)
            if tries:  # the first goes as made: the same calls, the same header bytes
                refresh_deadline(msg, deadline)
            try:
                reply = link.exchange(msg, deadline)
            except NotSent:
                attempt.not_sent(endpoint)
                continue
            except Lost:
                self._forget(link)
                attempt.lost(endpoint)
                continue
            except TimeoutError:
                self._forget(link)  # a late reply must not confuse the next call
                raise attempt.silent(endpoint) from None
            if attempt.answered(endpoint, reply):
                return reply
        return attempt.outcome()

    def _link(self, endpoint: str) -> _Link:
        links: dict[str, _Link] = self._local.__dict__.setdefault("links", {})
        link = links.get(endpoint)
        if link is None:
            link = _Link(self._context, endpoint, self._curve)
            links[endpoint] = link
            with self._lock:
                self._links.append(link)
        return link

    def _forget(self, link: _Link) -> None:
        self._local.__dict__.get("links", {}).pop(link.endpoint, None)
        with self._lock:
            if link in self._links:
                self._links.remove(link)
        link.close()


def refresh_deadline(msg: Message, deadline: float) -> None:
    """A retried job carries the time it has left, not its original timeout. The first try
    carries the timeout as given: refreshed, it varied with the microseconds spent before
    the send (10089 or 10090 ms), and the supervisor, which knows a request's header by
    its bytes, parsed again every one that varied."""
    if msg.kind == INFER and "timeout_ms" in msg.header:
        left = deadline - time.monotonic()
        msg.header["timeout_ms"] = max(1, int(job_budget(left) * 1000))


def control(endpoint: str, command: str, timeout: float = 10.0, *,
            server_key: str | bytes | None = None, client_cert: str | None = None,
            limits: Limits = DEFAULT_LIMITS, **args: Any) -> Any:
    """Send one control command (status, recycle, reload) and return its result; raises
    JobError. A TCP control endpoint needs the CURVE keys. ``limits``: what the reply may
    hold (`tune`'s answer, a model's recorded history, is larger than a status)."""
    if missing_socket(endpoint):
        raise NoReply(f"no socket at {endpoint} (is the supervisor running, with this "
                      "config?)")
    context: zmq.Context[Any] = zmq.Context.instance()
    curve = curve_keys(server_key, client_cert)
    sock = _dealer(context, [endpoint], immediate=False, curve=curve)
    try:
        sock.send_multipart(encode(Message(CONTROL, b"", {"command": command, **args})))
        if not sock.poll(int(timeout * 1000)):
            raise NoReply(f"no reply from {endpoint} within {timeout:g}s (is the supervisor "
                          "running?)")
        reply = decode(sock.recv_multipart(), limits)
    finally:
        sock.close(linger=0)
    if not reply.header.get("ok"):
        raise JobError(str(reply.header.get("error")), "control_error")
    return reply.header.get("result")
