"""File descriptors: a flood of client connections never takes the daemon down, and the
daemon's own work (workers' sockets and pipes, /proc reads, spawning) always has some.

libzmq accepts client connections in its I/O thread, out of the daemon's reach. When an
accept fails with EMFILE (no descriptor left under `nofile`), its ipc listener aborts the
whole process (libzmq 4.3 ipc_listener.cpp: `errno_assert` lets through EAGAIN, EINTR,
ECONNABORTED, EPROTO and ENFILE only: exit 134, no log event, no job answered); its tcp
listener ignores the error and tries again at once, a busy loop while the connection waits.
Neither can be caught, so the daemon never lets accepts get there: a thread of its own
counts connections as libzmq reports them (socket monitor events) and, before the open
descriptors reach the limit less a reserve, makes its client listeners stop taking new
connections while the ones already open serve on:

- ipc: the socket file is moved aside into a private directory (0700, beside it: a rename
  within one file system), so new clients find no file and retry (ZeroMQ clients reconnect
  on their own), and none can reach it where it went (a socket left beside its old name
  still listened: connections to it, not counted, reached libzmq's abort); it is moved back
  once connections have closed;
- tcp: a socket filter that drops every packet is attached to the listening socket, so new
  handshakes do not complete and clients retry; it is detached afterwards.

(Unbinding is no way out: libzmq closes every connection the listener accepted.) What
already waits in a listen backlog is still accepted: the reserve holds it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from supervisor.daemon.failures import Failures
from supervisor.shared import logs

log = logs.get(__name__)

# The soft limit is raised to the hard one, but not past this: children inherit it, and a
# program that closes every possible descriptor before exec loops up to the limit.
MOST = 1 << 20
# Below this limit (after raising it) the daemon warns at start: LimitNOFILE is too low.
LOW_LIMIT = 4096
# The reserve: descriptors kept for the daemon's own work, whatever clients do.
RESERVE_BASE = 64  # /proc reads, a reload's files, metrics scrapes, spawning
RESERVE_PER_WORKER = 8  # backend connection, output pipe, spawn pipes; twice (surge)
# libzmq's listen backlog: accepted even after a listener stops taking more, so kept short
# (a client finding it full retries after its reconnect interval, 100 ms by default).
BACKLOG = 32
# The monitor thread counts /proc/self/fd this often (seconds) to correct its estimate.
RECOUNT = 1.0

SO_ATTACH_FILTER, SO_DETACH_FILTER = 26, 27  # <asm-generic/socket.h>
# Where a paused ipc socket file goes: a directory of the daemon's own (0700) beside it.
ASIDE_DIR = ".tfs-paused"


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_DROP_ALL = (_SockFilter * 1)(_SockFilter(0x06, 0, 0, 0))  # BPF_RET|BPF_K 0: drop


@dataclass(frozen=True)
class Limit:
    soft: int  # in force now
    hard: int
    raised_from: int | None  # the soft limit the daemon was started with, when raised


def raise_limit() -> Limit:
    """The soft `nofile` limit raised to the hard one (up to MOST)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MOST if hard == resource.RLIM_INFINITY else min(hard, MOST)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return Limit(target, hard, soft)
    return Limit(soft, hard, None)


def count_open() -> int | None:
    """Descriptors open in this process now (None: not readable, e.g. none left)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return None


def reserve(limit: int, workers: int, listeners: int) -> int:
    """Descriptors kept for the daemon's own work and for what waits in the backlogs of
    ``listeners`` pausable endpoints; at least an eighth of the limit, never more than half
    (a limit that low is warned about at start)."""
    # Per listener, its backlog and as much again for what is accepted while the gate
    # reacts. What a flood gets past the mark grows with the clients reconnecting at once
    # when a pause ends (measured under nofile 300 with 1,500 clients on a loaded host: up to
    # 140 past it), so where descriptors are plenty an eighth of them is kept.
    wanted = RESERVE_BASE + RESERVE_PER_WORKER * 2 * workers + 2 * BACKLOG * listeners
    return min(max(wanted, limit // 8), limit // 2)


class _Listener:
    """One client endpoint that can stop and resume taking connections."""

    def __init__(self, endpoint: str, share: float) -> None:
        self.endpoint = endpoint
        self.share = share  # paused when the headroom is down to this share of the reserve
        self.path = Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None
        self.fd: int | None = None  # the listening socket's (tcp), from the LISTENING event
        self.open = True

    @property
    def aside(self) -> Path | None:
        return None if self.path is None else self.path.parent / ASIDE_DIR / self.path.name

    def prepare(self) -> None:
        """The private directory made (or checked: ours, a directory, 0700) and whatever a
        daemon killed while paused left removed, the name earlier versions used included."""
        if self.path is None or self.aside is None:
            return
        self.path.with_name(self.path.name + ".paused").unlink(missing_ok=True)
        _private_dir(self.aside.parent)
        self.aside.unlink(missing_ok=True)

    def forget(self) -> None:
        """At exit: nothing left aside, the private directory gone once empty."""
        if self.path is None or self.aside is None:
            return
        self.aside.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another daemon's socket still in it
            self.aside.parent.rmdir()

    def pause(self) -> None:
        if self.path is not None and self.aside is not None:
            _private_dir(self.aside.parent)  # removed while the daemon ran: made again
            os.rename(self.path, self.aside)
        elif self.fd is not None:
            with _borrowed(self.fd) as sock:
                sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                                bytes(_SockFprog(1, _DROP_ALL)))

    def resume(self) -> None:
        if self.path is not None and self.aside is not None:
            os.rename(self.aside, self.path)
        elif self.fd is not None:
            with _borrowed(self.fd) as sock:
                sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)


def _private_dir(path: Path) -> None:
    """``path`` a directory only this user can enter, or OSError: never one someone else
    made (or a link to one), where another user could reach the socket put in it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of this user's: a paused socket "
                              "cannot go there")
    os.chmod(path, 0o700)


@contextlib.contextmanager
def _borrowed(fd: int) -> Any:
    """A socket object over libzmq's descriptor that never closes it."""
    sock = socket.socket(fileno=fd)
    try:
        yield sock
    finally:
        sock.detach()


@dataclass(frozen=True)
class Counts:
    """What the gate's thread last published, replaced whole after each change, so that a
    reader on another thread (the loop's `status`, a scrape) sees one publication whole."""

    open: int  # descriptors open, estimated: the last exact count moved on by connections
    connections: int  # client connections open
    pauses: int  # times new connections were paused
    paused: tuple[str, ...]  # the endpoints not taking new connections now


class Gate:
    """Counts client connections and holds the open descriptors below limit - reserve.

    Its thread owns the monitor sockets, the listeners and every field but ``reserve``, and
    publishes ``counts``; the main loop reads ``facts`` (and the scrape ``counts``) and
    tells it the reserve (which grows with the workers configured)."""

    def __init__(self, context: zmq.Context[Any], limit: Limit) -> None:
        self.limit = limit
        self.reserve = RESERVE_BASE
        self.connections = 0
        self.pauses = 0
        self.open_at_count = count_open() or 0
        self.next_count = 0.0  # when the thread counts /proc/self/fd again
        self.next_near_count = 0.0  # the same, near a mark
        self.failures = Failures()
        self.connections_at_count = 0
        self.monitors: list[zmq.Socket[bytes]] = []
        self.listeners: dict[str, _Listener] = {}
        self._context = context
        self._stop = context.socket(zmq.PAIR)
        self._stop.bind(f"inproc://descriptor-gate-{id(self)}")
        self._thread: threading.Thread | None = None
        self.counts = Counts(self.open_at_count, 0, 0, ())

    def watch(self, sock: zmq.Socket[bytes]) -> None:
        """Before ``sock`` binds: its connections are counted and, when it binds a client
        endpoint, it can be paused."""
        self.monitors.append(sock.get_monitor_socket(
            zmq.EVENT_LISTENING | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED))

    def pausable(self, endpoint: str, share: float = 1.0) -> None:
        """``endpoint`` stops taking connections when the headroom is down to ``share`` of
        the reserve: the frontend's at all of it, the control endpoint's (probes,
        operators) later, so that a flood of jobs' connections does not fail the probes."""
        self.listeners[endpoint] = _Listener(endpoint, share)
        self.listeners[endpoint].prepare()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="descriptor-gate", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread; every listener takes connections again (so that _close finds
        its socket files where they belong), and the monitors go before the context."""
        if self._thread is not None:
            wake = self._context.socket(zmq.PAIR)
            wake.connect(f"inproc://descriptor-gate-{id(self)}")
            wake.send(b"")
            self._thread.join(5)
            wake.close(0)
        for listener in self.listeners.values():
            if not listener.open:
                self._resume(listener)
            with contextlib.suppress(OSError):
                listener.forget()
        self._publish()
        for monitor in self.monitors:
            monitor.close(0)
        self._stop.close(0)

    def facts(self) -> dict[str, Any]:
        """For `status`: no /proc listing on the loop (thousands of entries under a flood),
        the thread's count (at most RECOUNT old) moved on by the connections since."""
        counts = self.counts
        return {"open": counts.open, "limit": self.limit.soft, "hard_limit": self.limit.hard,
                "raised_from": self.limit.raised_from, "reserve": self.reserve,
                "headroom": self.limit.soft - counts.open,
                "client_connections": counts.connections, "accepting": not counts.paused,
                "paused": list(counts.paused), "pauses": counts.pauses}

    def _publish(self) -> None:
        self.counts = Counts(
            self.open_at_count + self.connections - self.connections_at_count,
            self.connections, self.pauses,
            tuple(x.endpoint for x in self.listeners.values() if not x.open))

    # --- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        # Ahead of busy neighbours where allowed (root, CAP_SYS_NICE): every millisecond
        # the thread waits for a CPU, libzmq accepts on (measured below).
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        poller = zmq.Poller()
        for monitor in self.monitors:
            poller.register(monitor, zmq.POLLIN)
        poller.register(self._stop, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(int(RECOUNT * 1000)))
            if self._stop in ready:
                return
            try:
                for monitor in self.monitors:
                    if monitor in ready:
                        self._events(monitor)
                self._decide(recount=time.monotonic() >= self.next_count)
                self._publish()
            except Exception as exc:  # never the end of the thread: the next turn tries
                self.failures.failed("descriptor_gate_failed", exc, time.monotonic())

    def _events(self, monitor: zmq.Socket[bytes]) -> None:
        """Every event waiting; a pause decided after each accept, not after the last: under
        a flood the events never run out, and libzmq accepts on while they are read."""
        while monitor.poll(0):
            event = parse_monitor_message(monitor.recv_multipart())
            kind = event["event"]
            if kind == zmq.EVENT_ACCEPTED:
                self.connections += 1
                self._decide(recount=False)
                self._publish()
            elif kind == zmq.EVENT_DISCONNECTED:
                self.connections = max(0, self.connections - 1)
            elif kind == zmq.EVENT_LISTENING:
                listener = self.listeners.get(event["endpoint"].decode())
                if listener is None and event["endpoint"].startswith(b"tcp://"):
                    listener = self._tcp_listener()
                if listener is not None:
                    listener.fd = int(event["value"])

    def _tcp_listener(self) -> _Listener | None:
        """A tcp endpoint's listener: zmq names it resolved (tcp://*:N as tcp://0.0.0.0:N),
        so the first configured tcp endpoint still without its descriptor."""
        return next((x for x in self.listeners.values()
                     if x.path is None and x.fd is None), None)

    def _decide(self, recount: bool) -> None:
        estimate = self.open_at_count + self.connections - self.connections_at_count
        if recount or self._near(estimate) or any(
                self._turn(x, estimate) for x in self.listeners.values()):
            began = time.monotonic()
            counted = count_open()  # exact, before anything changes
            ended = time.monotonic()
            self.next_count, self.next_near_count = ended + RECOUNT, 2 * ended - began
            estimate = self.limit.soft if counted is None else counted
            self.open_at_count, self.connections_at_count = estimate, self.connections
        paused, resumed = [], []
        for listener in self.listeners.values():
            if not self._turn(listener, estimate):
                continue
            if listener.open:
                try:
                    listener.pause()
                except OSError as exc:  # one listener's failure is not the others'
                    log.error("connections_pause_failed", endpoint=listener.endpoint,
                              error=str(exc))
                    continue
                listener.open = False
                paused.append(listener.endpoint)
            else:
                self._resume(listener)
                resumed.append(listener.endpoint)
        fields = {"open": estimate, "limit": self.limit.soft, "reserve": self.reserve,
                  "client_connections": self.connections}
        if paused:
            self.pauses += 1
            log.warning("connections_paused", endpoints=paused, **fields,
                        hint="descriptors run short: new client connections wait until "
                        "some close (raise LimitNOFILE if this is normal load)")
        if resumed:
            log.info("connections_resumed", endpoints=resumed, **fields)

    def _near(self, estimate: int) -> bool:
        """Whether an open listener is within half the reserve of its mark, where the
        estimate is not enough: libzmq accepts ahead of the events it sends (measured: 30
        connections behind on a quiet host, 90 on a loaded one), so the thread counts
        exactly, as often as counting leaves it half its time (a /proc listing of many
        thousands of descriptors takes milliseconds)."""
        return time.monotonic() >= self.next_near_count and any(
            self._turn(x, estimate + self.reserve // 2) for x in self.listeners.values()
            if x.open)

    def _turn(self, listener: _Listener, estimate: int) -> bool:
        """Whether ``listener`` should pause (open) or resume (paused) at ``estimate`` open
        descriptors: paused at its mark, resumed a quarter of the reserve below it."""
        mark = self.limit.soft - int(self.reserve * listener.share)
        if listener.open:
            return estimate >= mark
        return estimate <= mark - max(8, self.reserve // 4)

    def _resume(self, listener: _Listener) -> None:
        with contextlib.suppress(OSError):  # moved back, or left to the next start to clean
            listener.resume()
        listener.open = True
