"""The HTTP listener on `supervisor.metrics`: /metrics (and /) for Prometheus, /livez and
/readyz for probes (their answers: daemon/health.py); any other path is 404.

It runs on one thread of its own and never calls into the main loop: a scrape reads the
snapshot the loop published, a probe the times and report it published. That thread reads
every connection without blocking (a selector), so no client, however slow, holds up
another, and what it may cost is bounded whatever the clients do:

- MAX_CONNECTIONS open at once, each with a request head of MAX_HEAD bytes at most; a new
  connection over the bound closes the oldest one (a probe that has just connected is never
  the one shut out by clients that hold theirs open).
- DEADLINE seconds per connection from its accept to the end of its answer, however it
  trickles its bytes: then it is closed.
- A probe is answered as soon as its request has arrived (tens of microseconds of CPU): the
  kubelet's come about once a second. /metrics costs milliseconds, so scrapes are paced:
  METRICS_RATE a second (a burst of METRICS_BURST); one past that waits for its turn,
  without holding up anyone, until the DEADLINE closes it. A flood of probes costs
  the daemon one thread's share of the CPU at most, never the loop's own turns.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from supervisor.daemon.health import PATHS, Health

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

MAX_CONNECTIONS = 256
MAX_HEAD = 8192  # bytes of request line and headers (a probe's are under 200)
DEADLINE = 2.0  # seconds from accept to the last byte of the answer
BACKLOG = 512  # the kernel's queue of connections not yet accepted (capped by somaxconn)
METRICS_RATE = 20.0  # scrapes a second (Prometheus scrapes every few seconds)
METRICS_BURST = 20
METRICS_PATHS = ("/metrics", "/")  # prometheus_client served any path; these two stay


class Pace:
    """A token bucket: allow() is True while there are tokens (BURST at most, RATE more a
    second). One thread calls it."""

    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.at = clock()

    def wait(self) -> float:
        """Seconds until allow() is True."""
        tokens = self.tokens + (self.clock() - self.at) * self.rate
        return max(0.0, (1 - tokens) / self.rate)

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _Connection:
    __slots__ = ("deadline", "head", "out", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.head = b""
        self.out: memoryview | None = None  # the answer, while it is being sent


def routes(metrics: App, health: Health) -> App:
    """/livez and /readyz answered by ``health``, /metrics and / by the Prometheus app,
    every other path 404. HEAD is answered as GET, without the body."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD")
        if path in METRICS_PATHS and method == "GET":
            return metrics(environ, start_response)
        if path not in PATHS + METRICS_PATHS:
            code, text = 404, f"no {path[:64]!r} here: /metrics, /livez, /readyz"
        elif method not in ("GET", "HEAD"):
            code, text = 405, f"{path} answers GET and HEAD only"
        elif path in METRICS_PATHS:  # HEAD: what GET would answer, the body dropped later
            return metrics({**environ, "REQUEST_METHOD": "GET"}, start_response)
        else:
            code, text = health.answer(path, environ.get("QUERY_STRING", ""))
        return _plain(start_response, code, text)

    return app


def _plain(start_response: Callable[..., Any], code: int, text: str) -> list[bytes]:
    body = (text + "\n").encode()
    headers = [("Content-Type", "text/plain; charset=utf-8"),
               ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")]
    if code == 405:
        headers.append(("Allow", "GET, HEAD"))
    start_response(f"{code} {_REASONS[code]}", headers)
    return [body]


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


class Listener:
    """One thread: accepts, reads each request head without blocking, answers, closes."""

    def __init__(self, sock: socket.socket, app: App,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sock, self.app, self.clock = sock, app, clock
        self.pace = Pace(METRICS_RATE, METRICS_BURST, clock)
        self.open: dict[socket.socket, _Connection] = {}  # in accept order: oldest first
        self.parked: deque[tuple[_Connection, int]] = deque()  # scrapes waiting for the pace
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        for s in (sock, self.wake_r, self.wake_w):
            s.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="http-listener", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop the thread, then close the listening socket and every connection."""
        self.stopping = True
        with contextlib.suppress(OSError):
            self.wake_w.send(b"x")
        self.thread.join(10)
        for conn in list(self.open.values()):
            self._drop(conn)
        self.selector.close()
        for s in (self.sock, self.wake_r, self.wake_w):
            s.close()

    def _run(self) -> None:
        while not self.stopping:
            timeout = None
            if self.open:
                timeout = max(0.0, next(iter(self.open.values())).deadline - self.clock())
            if self.parked:
                wait = self.pace.wait()
                timeout = wait if timeout is None else min(timeout, wait)
            for key, _ in self.selector.select(timeout):
                if key.fileobj is self.sock:
                    self._accept()
                elif key.fileobj is not self.wake_r and key.fileobj in self.open:
                    self._serve(self.open[key.fileobj])
            while self.parked and self.pace.wait() == 0:
                conn, end = self.parked.popleft()
                if self.open.get(conn.sock) is conn and self.pace.allow():  # not timed out
                    conn.out = self._respond(conn, end)
                    self._serve(conn)
            now = self.clock()
            while self.open:  # the oldest first: their deadlines are in the same order
                oldest = next(iter(self.open.values()))
                if oldest.deadline > now:
                    break
                self._drop(oldest)

    def _accept(self) -> None:
        """Every connection waiting (up to the bound's worth), each read at once: a probe's
        request is usually there already, and answered before anything can shut it out."""
        for _ in range(MAX_CONNECTIONS):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNABORTED, EMFILE...: the next turn tries again
                return
            if len(self.open) >= MAX_CONNECTIONS:
                self._drop(next(iter(self.open.values())))
            sock.setblocking(False)
            conn = _Connection(sock, self.clock() + DEADLINE)
            self.open[sock] = conn
            self.selector.register(sock, selectors.EVENT_READ)
            self._serve(conn)

    def _serve(self, conn: _Connection) -> None:
        try:
            if conn.out is None:
                data = conn.sock.recv(MAX_HEAD + 1 - len(conn.head))
                if not data:
                    self._drop(conn)
                    return
                conn.head += data
                end = conn.head.find(b"\r\n\r\n")
                if end < 0:
                    end = conn.head.find(b"\n\n")
                if end < 0 and len(conn.head) <= MAX_HEAD:
                    return  # more to come (before the deadline)
                if end >= 0 and _path(conn.head) in METRICS_PATHS and not self.pace.allow():
                    self.selector.unregister(conn.sock)  # its turn comes in _run
                    self.parked.append((conn, end))
                    return
                conn.out = self._respond(conn, end)
            sent = conn.sock.send(conn.out)
            conn.out = conn.out[sent:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the peer, or the like
            self._drop(conn)
            return
        if not conn.out:
            self._drop(conn)

    def _respond(self, conn: _Connection, end: int) -> memoryview:
        """The answer to send, the connection now waiting to write it."""
        try:
            self.selector.modify(conn.sock, selectors.EVENT_WRITE)
        except KeyError:  # a scrape that was parked
            self.selector.register(conn.sock, selectors.EVENT_WRITE)
        return memoryview(self._answer(conn.head, end))

    def _answer(self, head: bytes, end: int) -> bytes:
        """The whole response to a request head (``end`` < 0: it was over MAX_HEAD)."""
        lines = head[:end].decode("latin-1").splitlines() if end >= 0 else []
        parts = lines[0].split(" ") if lines else []
        status, headers, chunks = "400 Bad Request", [("Content-Type", "text/plain")], [b""]
        method = ""
        if end < 0:
            status, chunks = "431 Request Header Fields Too Large", [b"request head too long\n"]
        elif len(parts) == 3 and parts[2].startswith("HTTP/"):
            method, target = parts[0], parts[1]
            path, _, query = target.partition("?")
            environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
                       "SERVER_PROTOCOL": parts[2]}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                key = name.strip().upper().replace("-", "_")
                if key in ("ACCEPT", "ACCEPT_ENCODING"):
                    environ["HTTP_" + key] = value.strip()
            found: dict[str, Any] = {}
            chunks = list(self.app(environ, _keep(found)))
            status, headers = found["status"], found["headers"]
        else:
            chunks = [b"not an HTTP request\n"]
        body = b"".join(chunks)
        lines_out = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers
                                           if k.lower() not in ("content-length",
                                                                 "connection")),
                     f"Content-Length: {len(body)}", "Connection: close", "", ""]
        return "\r\n".join(lines_out).encode("latin-1") + (b"" if method == "HEAD" else body)

    def _drop(self, conn: _Connection) -> None:
        self.open.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn.sock)
        conn.sock.close()


def _path(head: bytes) -> str:
    """The path of a request head's request line ("" if it has none)."""
    parts = head.split(b" ", 2)
    return parts[1].partition(b"?")[0].decode("latin-1") if len(parts) == 3 else ""


def _keep(into: dict[str, Any]) -> Callable[..., None]:
    """A WSGI start_response that keeps the status and headers in ``into``."""

    def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
        into["status"], into["headers"] = status, list(headers)

    return start_response


def serve(address: str, app: App) -> Listener:
    """Listen on ``address`` (host:port, [v6]:port, or :port for 127.0.0.1) and serve
    ``app`` from a thread of its own; its close() ends it. Binding fails here (OSError)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family, kind, proto, _, where = socket.getaddrinfo(host, int(port),
                                                      type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return Listener(sock, app)
