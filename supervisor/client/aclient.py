"""AsyncClient: the calls of ``Client`` with ``await``, for one asyncio event loop, with the
same failover rules (see ``Client`` and docs/deployment.md).

    async with AsyncClient(["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]) as client:
        outputs = await client.infer("demo", {"features": batch})

One socket per supervisor carries every concurrent call to it; the event loop itself watches
the socket (no task) and routes each reply to its call by job id, and watches the
connection, failing the calls still out when it drops, so they can be retried elsewhere.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from supervisor.client.client import (
    checked_timeout,
    curve_keys,
    endpoint_list,
    frames_message,
    job_ids,
    outcome,
    refresh_deadline,
    reply_wait,
    request_message,
    watched_dealer,
)
from supervisor.client.errors import InternalError, NoReply, error_from
from supervisor.client.failover import CONNECT_WAIT, Attempt, Lost, NotSent, Rotation
from supervisor.shared.protocol import (
    ERROR,
    MODELS,
    RESULT,
    Frame,
    Message,
    ProtocolError,
    decode,
    encode,
)
from supervisor.shared.transport import NOBLOCK, readable, send, waiting

# Replies read per turn of the event loop, at most (the rest on its next turn).
DRAIN = 256
# While a send finds no connection (IMMEDIATE), how often it is tried again, up to
# CONNECT_WAIT: rare (a supervisor still starting or restarting), so a short sleep, not a
# watcher.
SEND_RETRY = 0.005


# Calls' deadlines are kept in slots of this many seconds, one timer per slot expiring the
# calls still waiting in it, not a timer per call (whose heap work was an eighth of this
# client's CPU at 15,000 calls/s). A call expires at most one slot late.
SLOT = 0.01


class _Unsent(Exception):
    """A flushed message found no connection: its call sends it the patient way."""


class _AsyncLink:
    """One socket to one supervisor, shared by every call of the event loop, which reads it.

    A plain socket, not pyzmq's asyncio one: that one cost more per call than the rest of
    this client together (a Future and its generic multipart send for every send, then a
    query of the socket's events and a callback scheduled for its readers). Here a send is
    the plain non-blocking one, and the loop watches the socket's file descriptor, reading
    every reply waiting when it turns readable. ZeroMQ signals that descriptor on edges only,
    and any call on the socket, a send included, can take the edge of a reply that came
    meanwhile: so after each send, or each flush of sends, the socket's events are asked
    (one call) and a read is scheduled if a reply waits. A read goes on until nothing is
    left (or DRAIN replies, then it is scheduled again), which is what makes the descriptor
    signal the next one.

    Calls resumed by one read of several replies send their next jobs together: those sends
    wait in an outbox for a flush that runs after the calls did (_flush_after_calls), not
    each on its own. A send that finds ZeroMQ's I/O thread asleep wakes it, which cost the
    sender ~10 µs more than a send right after another (measured: 13 against 2.5 µs of CPU
    for a request), and the calls' own work between their sends gave the thread time to
    fall asleep each time. Any other send goes at once: a lone call has nothing to go with,
    and holding it for a flush of its own cost a turn of the loop (measured, one call in
    flight: +9 µs of CPU and +25 µs per call)."""

    def __init__(self, context: zmq.Context[Any], endpoint: str,
                 curve: tuple[Any, ...] | None) -> None:
        self.endpoint = endpoint
        self.sock, self.monitor = watched_dealer(context, endpoint, curve)
        self.waiting: dict[bytes, asyncio.Future[Message]] = {}  # sent, not yet answered
        self.outbox: list[tuple[bytes, list[Frame], asyncio.Future[Message]]] = []
        self.flush_due = False
        self.slots: dict[int, dict[bytes, asyncio.Future[Message]]] = {}  # see SLOT
        self.loop = asyncio.get_running_loop()
        self.read_due = False
        self.closed = False  # then the sockets are gone: a read or watch still due does nothing
        self.fds = (self.sock.getsockopt(zmq.FD), self.monitor.getsockopt(zmq.FD))
        self.loop.add_reader(self.fds[0], self._read)
        self.loop.add_reader(self.fds[1], self._watch)
        # Each descriptor signals only once its socket has been read empty: until then a
        # connection or an event could come unsignalled (measured: a drop went unseen).
        self._schedule_read()
        self.loop.call_soon(self._watch)

    async def exchange(self, msg: Message, deadline: float) -> Message:
        """The reply to ``msg``; NotSent, Lost or TimeoutError as for ``Client``. No task and
        no timer per call: one future, in the slot of its deadline."""
        if self.closed:
            raise self._closed()
        loop, job_id, frames = self.loop, msg.job_id, encode(msg)
        future: asyncio.Future[Message] = loop.create_future()
        self.outbox.append((job_id, frames, future))
        if not self.flush_due:  # no flush to go with: sent now
            self._flush()
        slot = self._expire_at(loop.time() + max(0.0, deadline - time.monotonic()), job_id,
                               future)
        try:
            return await future
        except _Unsent:  # no connection when it went: wait for one, as CONNECT_WAIT allows
            return await self._exchange_when_connected(job_id, frames, deadline)
        finally:
            self._unslot(slot, job_id)
            self.waiting.pop(job_id, None)

    def _flush_after_calls(self) -> None:
        """Hold sends for a flush that runs after the calls resumed so far (each resumes in
        a callback scheduled before this one)."""
        if not self.flush_due:
            self.flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """The outbox's messages, sent one after another: one wake-up of ZeroMQ's I/O thread
        for them all, and one look at the socket's events after them. A call that ended
        meanwhile (cancelled, past its deadline) is not sent; once one finds no connection,
        it and the rest go the patient way (_Unsent)."""
        self.flush_due = False
        outbox, self.outbox = self.outbox, []
        if self.closed or not outbox:  # close() ended every call in the outbox
            return
        for i, (job_id, frames, future) in enumerate(outbox):
            if future.done():
                continue
            try:
                send(self.sock, frames, NOBLOCK)
            except zmq.Again:
                for _, _, unsent in outbox[i:]:
                    if not unsent.done():
                        unsent.set_exception(_Unsent())
                break
            except Exception as exc:  # what the send raised, the call raises
                future.set_exception(exc)
                continue
            self.waiting[job_id] = future
        self._check_readable()

    async def _exchange_when_connected(self, job_id: bytes, frames: list[Frame],
                                       deadline: float) -> Message:
        """exchange for a message the flush found no connection for: sent once one comes,
        NotSent if none does within CONNECT_WAIT."""
        loop = self.loop
        future: asyncio.Future[Message] = loop.create_future()
        self.waiting[job_id] = future
        try:
            await self._send(frames, deadline)
            slot = self._expire_at(loop.time() + max(0.0, deadline - time.monotonic()),
                                   job_id, future)
            try:
                return await future
            finally:
                self._unslot(slot, job_id)
        finally:
            self.waiting.pop(job_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # seen: a drop noticed after NotSent raises no warning

    async def _send(self, frames: list[Frame], deadline: float) -> None:
        """Queued at once while connected; NotSent when no connection comes within
        CONNECT_WAIT (the socket queues only to a connected supervisor)."""
        give_up = time.monotonic() + min(CONNECT_WAIT, max(0.001, deadline - time.monotonic()))
        while True:
            if self.closed:
                raise self._closed()
            try:
                send(self.sock, frames, NOBLOCK)
                break
            except zmq.Again:
                self._check_readable()
                if time.monotonic() >= give_up:
                    raise NotSent from None
            await asyncio.sleep(SEND_RETRY)
        self._check_readable()

    def _check_readable(self) -> None:
        """After a call on the socket: it may have taken the edge of a reply that came
        meanwhile, which is then read on the loop's next turn."""
        if not self.read_due and readable(self.sock):
            self._schedule_read()

    def _expire_at(self, when: float, job_id: bytes, future: asyncio.Future[Message]) -> int:
        """Put the call in the slot ending at or after ``when`` (loop time); its slot."""
        slot = math.ceil(when / SLOT)
        calls = self.slots.get(slot)
        if calls is None:
            calls = self.slots[slot] = {}
            self.loop.call_at(slot * SLOT, self._expire_slot, slot)
        calls[job_id] = future
        return slot

    def _unslot(self, slot: int, job_id: bytes) -> None:
        """A call that ended leaves its slot (the slot's timer still fires, finding less)."""
        calls = self.slots.get(slot)
        if calls is not None:
            calls.pop(job_id, None)

    def _expire_slot(self, slot: int) -> None:
        for future in self.slots.pop(slot, {}).values():
            if not future.done():
                future.set_exception(TimeoutError())

    def _schedule_read(self) -> None:
        if not self.read_due:
            self.read_due = True
            self.loop.call_soon(self._read)

    def _read(self) -> None:
        """Replies to their calls: every one waiting, DRAIN at most per turn. Read as the
        daemon reads (transport.waiting): a lone reply is not followed by a receive that
        fails, whose zmq.Again cost more than asking the socket's events (measured: 3.7
        against 1.5 µs); either way the socket is read empty, so its descriptor signals the
        next reply."""
        self.read_due = False
        if self.closed:  # scheduled before close()
            return
        read = 0
        for frames in waiting(self.sock, DRAIN):
            self._deliver(frames)
            read += 1
        if read == DRAIN:  # perhaps more: on the next turn
            self._schedule_read()
        if read > 1:  # their calls' next sends go together
            self._flush_after_calls()

    def _deliver(self, frames: Sequence[Any]) -> None:
        try:
            reply = decode(frames)
        except ProtocolError:
            return
        future = self.waiting.get(reply.job_id)
        if future is not None and not future.done():
            future.set_result(reply)  # else: late, for a call that timed out

    def _watch(self) -> None:
        """The connection dropped (a monitor event): the calls still out fail with Lost."""
        while not self.closed:
            try:
                self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(Lost())

    def _closed(self) -> NoReply:
        return NoReply(f"the client was closed with the job out to {self.endpoint}")

    async def close(self) -> None:
        """The calls still out end at once (else each would wait out its timeout for a reply
        that can no longer come), and a read or watch already scheduled finds nothing to do
        (else it would raise on the closed socket, in the loop's exception handler)."""
        self.closed = True
        for future in [*self.waiting.values(), *(f for _, _, f in self.outbox)]:
            if not future.done():
                future.set_exception(self._closed())
        for fd in self.fds:
            self.loop.remove_reader(fd)
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


class AsyncClient:
    """Like ``Client``: round-robin over the supervisors, retrying elsewhere when the job
    surely did not run, and after a dropped connection only if ``retry_unanswered``."""

    def __init__(self, endpoint: str | Sequence[str], timeout: float = 30.0, *,
                 server_key: str | bytes | None = None, client_cert: str | None = None,
                 retry_unanswered: bool = True) -> None:
        self.endpoints = endpoint_list(endpoint)
        self.timeout = checked_timeout(timeout)
        self.retry_unanswered = retry_unanswered
        self._curve = curve_keys(server_key, client_cert)
        self._context: zmq.Context[Any] = zmq.Context.instance()
        self._links: dict[str, _AsyncLink] = {}
        self._rotation = Rotation(self.endpoints)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()

    async def infer(self, model: str, inputs: Mapping[str, Any],
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run one job; returns the model's outputs or raises a JobError subclass."""
        timeout = self.timeout if timeout is None else checked_timeout(timeout)
        return outcome(await self._call(request_message(model, inputs, timeout),
                                        reply_wait(timeout)))

    async def infer_frames(self, model: str, specs: list[dict[str, Any]],
                           frames: Sequence[Frame], timeout: float | None = None
                           ) -> tuple[list[dict[str, Any]], list[Frame]]:
        """Run one job whose arrays are already frames (docs/protocol.md): the output specs
        and frames as the supervisor sent them, or a JobError subclass."""
        timeout = self.timeout if timeout is None else checked_timeout(timeout)
        reply = await self._call(frames_message(model, specs, frames, timeout),
                                 reply_wait(timeout))
        if reply.kind == ERROR:
            raise error_from(reply.header)
        outputs = reply.header.get("outputs")
        if reply.kind != RESULT or not isinstance(outputs, list) or \
                len(outputs) != len(reply.arrays):
            raise InternalError(f"unexpected reply {reply.kind!r} from the supervisor")
        return outputs, list(reply.arrays)

    async def models(self, timeout: float | None = None) -> dict[str, Any]:
        """Served models: input/output specs, ready workers, availability."""
        return dict((await self.call_models(timeout)).get("models", {}))

    async def call_models(self, timeout: float | None = None) -> dict[str, Any]:
        """The whole `models` reply: the models, and the server's readiness."""
        timeout = self.timeout if timeout is None else checked_timeout(timeout)
        reply = await self._call(Message(MODELS, job_ids.next()), timeout)
        if reply.kind == ERROR:
            raise error_from(reply.header)
        return dict(reply.header)

    async def _call(self, msg: Message, timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        attempt = Attempt(self._rotation, self.retry_unanswered, timeout, deadline)
        for tries, endpoint in enumerate(attempt.endpoints()):
            if tries:  # the first goes as made: the same calls, the same header bytes
                refresh_deadline(msg, deadline)
            try:
                reply = await self._link(endpoint).exchange(msg, deadline)
            except NotSent:
                attempt.not_sent(endpoint)
                continue
            except Lost:  # the socket reconnects by itself: it is kept
                attempt.lost(endpoint)
                continue
            except TimeoutError:
                raise attempt.silent(endpoint) from None
            if attempt.answered(endpoint, reply):
                return reply
        return attempt.outcome()

    def _link(self, endpoint: str) -> _AsyncLink:
        link = self._links.get(endpoint)
        if link is None:
            link = self._links[endpoint] = _AsyncLink(self._context, endpoint, self._curve)
        return link
