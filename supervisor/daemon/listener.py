"""The HTTP listener on `supervisor.metrics`: /metrics for Prometheus, /livez and /readyz
for probes (their answers: daemon/health.py), nothing else.

It runs on threads of its own and never calls into the main loop: a scrape reads the
snapshot the loop published, a probe the times and report it published. It still shares
the process (its CPU and the GIL) with the loop, so what it may take is bounded:

- RATE requests a second (BURST at once): past that the listener stops accepting until its
  next turn, and the connections wait in the kernel's listen backlog (beyond it, the kernel
  drops them until there is room): a flood costs the daemon nothing more, and the probes
  caught in it are late or fail instead of the jobs slowing down. The kubelet probes a pod
  about once a second at most, Prometheus scrapes it every few seconds.
- MAX_CONNECTIONS at once, one thread each, so one slow client does not hold up the others;
  a connection over that bound is closed unanswered at once, and a client that sends
  nothing holds its thread REQUEST_TIMEOUT at most.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import TCPServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from supervisor.daemon.health import PATHS, Health

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

RATE = 20.0  # requests accepted a second, at most (a /readyz answer costs about 1 ms of CPU)
BURST = 20
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT = 5.0  # seconds a connection may take to send its request and read the answer


class Pace:
    """A token bucket: take() returns at once while there are tokens (BURST at most, RATE
    more a second) and otherwise sleeps until the next one. One thread calls it."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate, self.burst, self.clock, self.sleep = rate, burst, clock, sleep
        self.tokens = float(burst)
        self.at = clock()

    def take(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            wait = (1 - self.tokens) / self.rate
            self.sleep(wait)
            self.tokens, self.at = 1.0, now + wait
        self.tokens -= 1


class _Quiet(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request: probes come every few seconds, forever."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # none is joined at close, none is kept in a list

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.pace = Pace(RATE, BURST)
        super().__init__(address, _Quiet)

    def get_request(self) -> tuple[socket.socket, Any]:
        """The next connection, no sooner than the pace allows (serve_forever's thread only:
        asleep here, it holds no GIL and accepts nothing)."""
        self.pace.take()
        return super().get_request()

    def server_bind(self) -> None:
        """As HTTPServer's, without its reverse DNS lookup of the address (socket.getfqdn):
        a start never waits on a resolver that does not answer."""
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: closed, unanswered
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread was started: give its slot back
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def routes(metrics: App, health: Health) -> App:
    """/livez and /readyz answered by ``health``; every other path is the Prometheus app's
    (which serves /metrics on any path, as prometheus_client always has)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in PATHS:
            return metrics(environ, start_response)
        if environ.get("REQUEST_METHOD") != "GET":
            code, text = 405, f"{path} answers GET only"
        else:
            code, text = health.answer(path, environ.get("QUERY_STRING", ""))
        body = (text + "\n").encode()
        start_response(f"{code} {_REASONS[code]}", [
            ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")])
        return [body]

    return app


_REASONS = {200: "OK", 400: "Bad Request", 405: "Method Not Allowed",
            503: "Service Unavailable"}


def serve(address: str, app: App) -> WSGIServer:
    """Listen on ``address`` (host:port, [v6]:port, or :port for 127.0.0.1) and serve
    ``app`` from a thread of its own; the server's shutdown() and server_close() end it."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0][0]
    server = _Server((host, int(port)), family)
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name="http-listener", daemon=True).start()
    return server
