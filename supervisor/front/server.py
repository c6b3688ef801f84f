"""HTTP/1.1 on asyncio with httptools' parser (the one uvicorn uses), without a framework:
the request path is a parse, one handler call and one write.

Bounds, so that no client can hold a front or grow it:
- a request head of MAX_HEAD bytes; a body of `max_body_size`, refused 413 from its
  Content-Length *before* it is read (and from its size so far when chunked);
- `request_timeout` from a request's first byte to its last; `keepalive_timeout` idle
  between requests; then the connection is closed (408 where a request was under way);
- `max_connections` per front: one more is answered 503 and closed;
- requests on one connection are answered in order, one at a time (pipelining is read
  ahead by at most PIPELINE requests, then reading pauses); a client that does not read its
  answers pauses its own connection, nobody else's.

Drain (SIGTERM): stop accepting, close idle connections, let each busy one finish its
request and close (`Connection: close`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus

import httptools

from supervisor.front import metrics
from supervisor.front.errors import HttpError
from supervisor.front.messages import Request, Response, error_response
from supervisor.front.routes import OPEN, Front, answer, authorized
from supervisor.shared.wire import frame_buffer

MAX_HEAD = 64 * 1024  # request line and headers together
PIPELINE = 16  # requests parsed ahead of the one being answered
# A response this small is joined into one buffer and written with one call (the event loop
# sends each buffer of writelines() on its own: two system calls where one does).
JOIN_UP_TO = 64 * 1024
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
# Headers that must not be given twice (which one would count is ambiguous).
SINGLE = frozenset({b"authorization", b"content-length", b"inference-header-content-length",
                    b"content-type", b"expect"})


class Final:
    """The last answer a connection gives: an error for bytes that could not be read as a
    request, after the answers to every request read before them."""

    __slots__ = ("error",)

    def __init__(self, error: HttpError) -> None:
        self.error = error


class Budget:
    """Body bytes one front handles at once: a JSON body is parsed into Python objects some
    16 times its size, so many large ones at once could take a front's memory. A request
    waits for its share; one larger than the whole budget goes alone."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used = capacity, 0
        self.changed = asyncio.Condition()

    async def acquire(self, size: int) -> int:
        size = min(size, self.capacity)
        async with self.changed:
            await self.changed.wait_for(lambda: self.used + size <= self.capacity)
            self.used += size
        return size

    async def release(self, size: int) -> None:
        async with self.changed:
            self.used -= size
            self.changed.notify_all()


class Limits:
    def __init__(self, max_body: int, request_timeout: float, keepalive_timeout: float,
                 max_connections: int, access_log: Callable[[str], None] | None) -> None:
        self.max_body, self.request_timeout = max_body, request_timeout
        self.keepalive_timeout, self.max_connections = keepalive_timeout, max_connections
        self.access_log = access_log


class Connections:
    """The open connections of one front process, and the body bytes they handle."""

    def __init__(self, body_budget: int = 2 * 64 * 1024**2) -> None:
        self.open: set[HttpConnection] = set()
        self.draining = False
        self.empty = asyncio.Event()
        self.budget = Budget(body_budget)

    def drain(self) -> None:
        self.draining = True
        for conn in list(self.open):
            conn.drain()
        if not self.open:
            self.empty.set()

    def closed(self, conn: HttpConnection) -> None:
        self.open.discard(conn)
        metrics.TALLIES.connections -= 1
        if self.draining and not self.open:
            self.empty.set()


class HttpConnection(asyncio.Protocol):
    def __init__(self, front: Front, limits: Limits, connections: Connections) -> None:
        self.front, self.limits, self.connections = front, limits, connections
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        # Requests read and not yet answered, in order; a Final ends the connection.
        self.pending: deque[tuple[Request, bool] | Final] = deque()
        self.pending_bytes = 0  # of their bodies: read-ahead is bounded in bytes too
        self.broken = False  # the bytes can no longer be read as requests
        self.busy = False
        self.closing = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.head_size = 0
        self.body: list[bytes] = []
        self.body_size = 0
        self.refused: HttpError | None = None
        self.reading = False  # a request has begun and not yet ended

    # --- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.open.add(self)
        metrics.TALLIES.connections += 1
        if len(self.connections.open) > self.limits.max_connections:
            self._fail(HttpError(503, "too many connections to this front; retry"))
            return
        self._arm(self.limits.keepalive_timeout, self._idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._disarm()
        self.writable.set()
        self.connections.closed(self)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(HttpError(400, "protocol upgrades are not served"))
        except httptools.HttpParserError as exc:
            self._fail(self.refused or HttpError(400, f"malformed HTTP request: {exc}"))

    def drain(self) -> None:
        """Stop after the requests already read are answered (or now, when idle)."""
        if not self.busy and not self.pending and not self.reading:
            self._close()

    # --- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset()
        self.reading = True
        self._arm(self.limits.request_timeout, self._slow)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        name = name.lower()
        if name in SINGLE and name in self.headers:
            self._refuse(HttpError(400, f"the {name.decode()} header is given twice"))
        self.headers[name] = value

    def on_headers_complete(self) -> None:
        if not self.parser.get_http_version().startswith("1."):
            self._refuse(HttpError(505, "only HTTP/1.0 and HTTP/1.1 are served"))
        length = self.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body:
            self._refuse(HttpError(413, f"the body is {int(length)} bytes, over this "
                                   f"server's limit of {self.limits.max_body}"))
        elif self.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport:
            self._check_token_early()
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _check_token_early(self) -> None:
        """A body the client waits to send (Expect: 100-continue) is never asked for when
        its token is wrong: refused before it is read."""
        if self.front.token is None:
            return
        path = httptools.parse_url(self.url).path.decode("latin-1")
        if path not in OPEN and not authorized(self.front.token, self.headers):
            self._refuse(HttpError(401, "missing or wrong bearer token (Authorization: "
                                   "Bearer TOKEN)"))

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.limits.max_body:
            self._refuse(HttpError(413, f"the body is over this server's limit of "
                                   f"{self.limits.max_body} bytes"))
        self.body.append(body)

    def on_message_complete(self) -> None:
        self._disarm()
        try:
            parsed = httptools.parse_url(self.url)
            path = parsed.path.decode("latin-1")  # segments are decoded by the routes
            query = (parsed.query or b"").decode("latin-1")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError, ValueError):
            self._fail(HttpError(400, "malformed request URL"))
            return
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = Request(self.parser.get_method(), path, query, self.headers, body)
        self.pending.append((request, self.parser.should_keep_alive()))
        self.pending_bytes += len(body)
        self.reading = False
        if (len(self.pending) > PIPELINE or self.pending_bytes > self.limits.max_body) \
                and self.transport is not None:
            self.transport.pause_reading()
        if not self.busy:
            self.busy = True
            self.loop.create_task(self._answer_all())

    # --- answering -----------------------------------------------------------------------

    async def _answer_all(self) -> None:
        while self.pending and not self.closing:
            item = self.pending.popleft()
            if isinstance(item, Final):
                self._write(error_response(item.error), keep_alive=False)
                self._close()
                return
            request, keep_alive = item
            self.pending_bytes -= len(request.body)
            if self.transport is not None and not self.broken and \
                    len(self.pending) <= PIPELINE // 2 and \
                    self.pending_bytes <= self.limits.max_body // 2:
                self.transport.resume_reading()
            response = await self._answer(request)
            # Draining: the requests already read are answered, the last one closes.
            keep = keep_alive and not (self.connections.draining and not self.pending)
            self._write(response, keep)
            if not keep:
                self._close()
                return
            if not self.writable.is_set() and not await self._written():
                return
        self.busy = False
        if not self.closing:
            if self.connections.draining and not self.reading:
                self._close()
            elif not self.reading:
                self._arm(self.limits.keepalive_timeout, self._idle)

    async def _answer(self, request: Request) -> Response:
        started = time.perf_counter()
        metrics.TALLIES.in_flight += 1
        share = await self.connections.budget.acquire(len(request.body))
        try:
            route, response = await answer(self.front, request)
        except Exception as exc:  # a bug: the client gets one line, the log the rest
            metrics.log_failure(exc)
            route, response = "-", error_response(HttpError(500, "internal error in the "
                                                            "HTTP front"))
        finally:
            await self.connections.budget.release(share)
            metrics.TALLIES.in_flight -= 1
        seconds = time.perf_counter() - started
        metrics.observe(route, response.status, seconds, len(request.body), response.length)
        if self.limits.access_log is not None:
            self.limits.access_log(f"{request.method.decode('latin-1')} {route} "
                                   f"{response.status} {seconds:.4f}s "
                                   f"{request.path[:100]}")
        return response

    async def _written(self) -> bool:
        """Wait for a client to take what was written; one that takes nothing for
        request_timeout is cut off (its answers would pile up in this process)."""
        try:
            await asyncio.wait_for(self.writable.wait(), self.limits.request_timeout)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()
            self.closing = True
            return False
        return True

    def _write(self, response: Response, keep_alive: bool) -> None:
        if self.transport is None or self.closing:
            return
        head = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            response.status, _REASONS.get(response.status, b""), response.content_type,
            response.length)]
        head.extend(b"%s: %s\r\n" % header for header in response.headers)
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if response.length <= JOIN_UP_TO:  # one send(2), not one per part
            self.transport.write(b"".join([*head, *map(frame_buffer, response.body)]))
        else:  # large tensors: written from where they are, not copied
            self.transport.writelines([b"".join(head), *map(frame_buffer, response.body)])

    # --- failures and time limits --------------------------------------------------------

    def _count_head(self, size: int) -> None:
        self.head_size += size
        if self.head_size > MAX_HEAD:
            self._refuse(HttpError(431, f"the request head is over {MAX_HEAD} bytes"))

    def _refuse(self, error: HttpError) -> None:
        """Stop parsing: the parser raises, data_received answers ``error`` and closes."""
        self.refused = error
        raise httptools.HttpParserCallbackError(error.message)

    def _fail(self, error: HttpError) -> None:
        """No more requests can be read: answer those read before, then ``error``, then
        close."""
        metrics.observe("-", error.status, 0.0, self.body_size, 0)
        self.broken = True
        self._disarm()
        if self.transport is not None:
            self.transport.pause_reading()
        if self.busy or self.pending:
            self.pending.append(Final(error))
            return
        self._write(error_response(error), keep_alive=False)
        self._close()

    def _slow(self) -> None:
        self._fail(HttpError(408, f"the request did not arrive within "
                             f"{self.limits.request_timeout:g}s"))

    def _idle(self) -> None:
        if not self.busy and not self.pending:
            self._close()

    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._disarm()
        self.timer = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _close(self) -> None:
        if not self.closing and self.transport is not None:
            self.closing = True
            self._disarm()
            self.transport.close()
