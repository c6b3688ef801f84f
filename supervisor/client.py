"""Python client for tfsupervisor (no TensorFlow needed).

    from supervisor.client import Client, JobError
    with Client("ipc://run/frontend.sock", timeout=10) as client:
        outputs = client.infer("demo", {"features": batch})

``Client`` is safe to share across threads: each thread gets its own ZeroMQ socket.
``AsyncClient`` is for one asyncio event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from supervisor import protocol
from supervisor.protocol import (
    CONTROL,
    ERROR,
    INFER,
    MODELS,
    RESULT,
    Message,
    ProtocolError,
    decode,
    encode,
    pack_arrays,
    unpack_arrays,
)


class JobError(Exception):
    """A job answered with an error. ``code`` is one of the protocol's error codes."""

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(f"{code or self.code}: {message}")
        self.message = message
        if code is not None:
            self.code = code


class UnknownModel(JobError):
    code = protocol.UNKNOWN_MODEL


class BadRequest(JobError):
    code = protocol.BAD_REQUEST


class Overloaded(JobError):
    code = protocol.OVERLOADED


class DeadlineExceeded(JobError):
    code = protocol.DEADLINE_EXCEEDED


class WorkerCrashed(JobError):
    code = protocol.WORKER_CRASHED


class JobTimeout(JobError):
    code = protocol.TIMEOUT


class ShuttingDown(JobError):
    code = protocol.SHUTTING_DOWN


class Unavailable(JobError):
    code = protocol.UNAVAILABLE


class InternalError(JobError):
    code = protocol.INTERNAL


class NoReply(JobError):
    """No answer within the client's timeout: the supervisor is down or unreachable, or the
    message was over its size limit (which ZeroMQ drops without a word)."""

    code = "no_reply"


ERRORS: dict[str, type[JobError]] = {cls.code: cls for cls in (
    UnknownModel, BadRequest, Overloaded, DeadlineExceeded, WorkerCrashed, JobTimeout,
    ShuttingDown, Unavailable, InternalError)}


def error_from(header: Mapping[str, Any]) -> JobError:
    code = str(header.get("code", protocol.INTERNAL))
    message = str(header.get("message", ""))
    return ERRORS.get(code, JobError)(message, code)


def _reply_wait(timeout: float) -> float:
    """How long to wait for a reply to a job sent with ``timeout``: a little longer, so the
    supervisor's own verdict (deadline_exceeded, say) arrives rather than a bare NoReply."""
    return timeout + 0.1 + 0.1 * timeout


def _endpoints(endpoint: str | Sequence[str]) -> list[str]:
    return [endpoint] if isinstance(endpoint, str) else list(endpoint)


def _request(model: str, inputs: Mapping[str, Any], timeout: float | None) -> Message:
    specs, frames = pack_arrays({k: np.asarray(v) for k, v in inputs.items()})
    header: dict[str, Any] = {"model": model, "inputs": specs}
    if timeout is not None:
        header["timeout_ms"] = max(1, int(timeout * 1000))
    return Message(INFER, uuid.uuid4().bytes, header, frames)


def _outcome(msg: Message) -> dict[str, np.ndarray]:
    if msg.kind == ERROR:
        raise error_from(msg.header)
    if msg.kind != RESULT:
        raise InternalError(f"unexpected reply kind {msg.kind!r}")
    return unpack_arrays(msg.header.get("outputs"), msg.arrays)


def _dealer(context: zmq.Context[Any], endpoints: list[str], immediate: bool = True) -> Any:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if immediate:  # only queue to supervisors actually connected (must precede connect)
        sock.setsockopt(zmq.IMMEDIATE, 1)
    for endpoint in endpoints:
        sock.connect(endpoint)
    return sock


class Client:
    def __init__(self, endpoint: str | Sequence[str], timeout: float = 30.0,
                 context: zmq.Context[Any] | None = None) -> None:
        self.endpoints = _endpoints(endpoint)
        self.timeout = timeout
        self._context = context or zmq.Context.instance()
        self._local = threading.local()
        self._sockets: list[zmq.Socket[Any]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets:
                sock.close(linger=0)
            self._sockets.clear()
        self._local = threading.local()

    def _socket(self) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] | None = getattr(self._local, "sock", None)
        if sock is None or sock.closed:
            sock = _dealer(self._context, self.endpoints)
            self._local.sock = sock
            with self._lock:
                self._sockets.append(sock)
        return sock

    def infer(self, model: str, inputs: Mapping[str, Any],
              timeout: float | None = None) -> dict[str, np.ndarray]:
        """Run one job; returns the model's outputs or raises a JobError subclass."""
        timeout = self.timeout if timeout is None else timeout
        return _outcome(self._call(_request(model, inputs, timeout), _reply_wait(timeout)))

    def models(self, timeout: float | None = None) -> dict[str, Any]:
        """Served models: input/output specs, ready workers, availability."""
        reply = self._call(Message(MODELS, uuid.uuid4().bytes), timeout or self.timeout)
        if reply.kind == ERROR:
            raise error_from(reply.header)
        return dict(reply.header.get("models", {}))

    def _call(self, msg: Message, timeout: float) -> Message:
        sock = self._socket()
        deadline = time.monotonic() + timeout
        # With IMMEDIATE set, a send blocks while no supervisor is connected: bound it too.
        sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
        try:
            sock.send_multipart(encode(msg), copy=False)
        except zmq.Again:
            raise NoReply(f"no supervisor connected at {', '.join(self.endpoints)} within "
                          f"{timeout:g}s") from None
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1):
                break
            reply = decode(sock.recv_multipart(copy=False))
            if reply.job_id == msg.job_id:
                return reply
            # else: a late reply to an earlier call that timed out; drop it
        # The socket may still get the late reply; a fresh one keeps the next call clean.
        self._discard(sock)
        raise NoReply(f"no reply from {', '.join(self.endpoints)} within {timeout:g}s")

    def _discard(self, sock: zmq.Socket[Any]) -> None:
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)
        sock.close(linger=0)
        self._local.sock = None


class AsyncClient:
    """The same calls with ``await``; use it from one event loop."""

    def __init__(self, endpoint: str | Sequence[str], timeout: float = 30.0) -> None:
        self.endpoints = _endpoints(endpoint)
        self.timeout = timeout
        self._context = zmq.asyncio.Context.instance()
        self._sock: Any = None  # zmq.asyncio.Socket, created on first use
        self._waiting: dict[bytes, asyncio.Future[Message]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def infer(self, model: str, inputs: Mapping[str, Any],
                    timeout: float | None = None) -> dict[str, np.ndarray]:
        timeout = self.timeout if timeout is None else timeout
        return _outcome(await self._call(_request(model, inputs, timeout),
                                         _reply_wait(timeout)))

    async def models(self, timeout: float | None = None) -> dict[str, Any]:
        reply = await self._call(Message(MODELS, uuid.uuid4().bytes), timeout or self.timeout)
        if reply.kind == ERROR:
            raise error_from(reply.header)
        return dict(reply.header.get("models", {}))

    async def _call(self, msg: Message, timeout: float) -> Message:
        if self._sock is None:
            self._sock = _dealer(self._context, self.endpoints)
            self._reader = asyncio.get_running_loop().create_task(self._read())
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[msg.job_id] = future
        sock = self._sock

        async def exchange() -> Message:
            await sock.send_multipart(encode(msg))
            return await future

        try:
            return await asyncio.wait_for(exchange(), timeout)
        except TimeoutError:
            raise NoReply(f"no reply from {', '.join(self.endpoints)} within "
                          f"{timeout:g}s") from None
        finally:
            self._waiting.pop(msg.job_id, None)

    async def _read(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                reply = decode(frames)
            except ProtocolError:
                continue
            future = self._waiting.get(reply.job_id)
            if future is not None and not future.done():
                future.set_result(reply)


def control(endpoint: str, command: str, timeout: float = 10.0, **args: Any) -> Any:
    """Send one control command (status, recycle) and return its result; raises JobError."""
    context: zmq.Context[Any] = zmq.Context.instance()
    sock = _dealer(context, [endpoint], immediate=False)
    try:
        sock.send_multipart(encode(Message(CONTROL, b"", {"command": command, **args})))
        if not sock.poll(int(timeout * 1000)):
            raise NoReply(f"no reply from the control endpoint {endpoint} within {timeout:g}s "
                          "(is the supervisor running?)")
        reply = decode(sock.recv_multipart())
    finally:
        sock.close(linger=0)
    if not reply.header.get("ok"):
        raise JobError(str(reply.header.get("error")), "control_error")
    return reply.header.get("result")
