"""AsyncClient: the calls of ``Client`` with ``await``, for one asyncio event loop, with the
same failover rules (see ``Client`` and docs/deployment.md).

    async with AsyncClient(["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]) as client:
        outputs = await client.infer("demo", {"features": batch})

One socket per supervisor carries every concurrent call to it; a reader task routes each
reply to its call by job id, and a watcher fails the calls still out when the connection
drops, so they can be retried elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq.asyncio

from supervisor.client.client import (
    curve_keys,
    endpoint_list,
    job_ids,
    outcome,
    refresh_deadline,
    reply_wait,
    request_message,
    watched_dealer,
)
from supervisor.client.errors import error_from
from supervisor.client.failover import CONNECT_WAIT, Attempt, Lost, NotSent, Rotation
from supervisor.shared.protocol import ERROR, MODELS, Message, ProtocolError, decode, encode
from supervisor.shared.transport import NOBLOCK, recv

# Replies read per wake-up of the reading task, beyond the one that woke it.
DRAIN = 256


def _expire(future: asyncio.Future[Message]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class _AsyncLink:
    """One socket to one supervisor, shared by every call of the event loop."""

    def __init__(self, context: zmq.asyncio.Context, endpoint: str,
                 curve: tuple[Any, ...] | None) -> None:
        self.endpoint = endpoint
        self.sock, self.monitor = watched_dealer(context, endpoint, curve)
        self.waiting: dict[bytes, asyncio.Future[Message]] = {}
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._read()), loop.create_task(self._watch())]

    async def exchange(self, msg: Message, deadline: float) -> Message:
        """The reply to ``msg``; NotSent, Lost or TimeoutError as for ``Client``.

        The common case costs no task: pyzmq queues the frames at once whenever the
        connection is up (its future is done on return; the socket's own send keeps its
        edge-triggered readiness in step, which a send behind its back would not), and one
        timer bounds the wait for the reply. asyncio.wait_for wraps each awaitable in a
        task; per call that was most of this client's own time."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Message] = loop.create_future()
        self.waiting[msg.job_id] = future
        try:
            sent = self.sock.send_multipart(encode(msg))
            if not sent.done():  # IMMEDIATE and no connection yet: wait for one, bounded
                wait = min(CONNECT_WAIT, max(0.001, deadline - time.monotonic()))
                try:
                    await asyncio.wait_for(sent, wait)
                except TimeoutError:
                    raise NotSent from None
            else:
                sent.result()  # raises what the send raised
            timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()),
                                 _expire, future)
            try:
                return await future
            finally:
                timer.cancel()
        finally:
            self.waiting.pop(msg.job_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # seen: a drop noticed after NotSent raises no warning

    async def _read(self) -> None:
        """Replies to their calls; every reply already waiting is read per wake-up."""
        while True:
            first = await self.sock.recv_multipart(copy=False)
            self._deliver(first)
            for _ in range(DRAIN):
                try:
                    frames = recv(self.sock, NOBLOCK)
                except zmq.Again:
                    break
                self._deliver(frames)

    def _deliver(self, frames: Sequence[Any]) -> None:
        try:
            reply = decode(frames)
        except ProtocolError:
            return
        future = self.waiting.get(reply.job_id)
        if future is not None and not future.done():
            future.set_result(reply)  # else: late, for a call that timed out

    async def _watch(self) -> None:
        while True:
            await self.monitor.recv_multipart()  # the connection dropped
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(Lost())

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
        self.timeout = timeout
        self.retry_unanswered = retry_unanswered
        self._curve = curve_keys(server_key, client_cert)
        self._context = zmq.asyncio.Context.instance()
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
        timeout = self.timeout if timeout is None else timeout
        return outcome(await self._call(request_message(model, inputs, timeout),
                                        reply_wait(timeout)))

    async def models(self, timeout: float | None = None) -> dict[str, Any]:
        """Served models: input/output specs, ready workers, availability."""
        reply = await self._call(Message(MODELS, job_ids.next()), timeout or self.timeout)
        if reply.kind == ERROR:
            raise error_from(reply.header)
        return dict(reply.header.get("models", {}))

    async def _call(self, msg: Message, timeout: float) -> Message:
        deadline = time.monotonic() + timeout
        attempt = Attempt(self._rotation, self.retry_unanswered, timeout, deadline)
        for endpoint in attempt.endpoints():
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
