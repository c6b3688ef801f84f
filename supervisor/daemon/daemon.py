"""The supervisor's main loop: sockets, worker processes, signals and memory readings
around the socket-free core (supervisor/core/core.py), which makes every decision.

One loop thread makes every decision and owns every socket and the core: one zmq poller
over the frontend, backend, control and admin sockets, the ZAP socket, the workers' output
pipes and a wake-up pipe. Signal handlers only record the signal and write to that pipe;
the loop acts on it. Every other thread is listed here with exactly what it may touch:

- descriptor-gate (daemon/descriptors.py, ``Gate``), from the loop's start to its end:
  owns the socket monitors, the client listeners (pauses and resumes them) and the gate's
  fields, and publishes ``Gate.counts`` replaced whole, which `status` (on the loop) and
  the scrape read; it reads ``Gate.reserve``, which the loop alone writes. It never calls
  into the loop; ``Gate.close`` stops it.
- http-listener (daemon/listener.py), when supervisor.metrics is set, until ``_close``:
  owns its HTTP connections; reads only what the loop publishes whole (the metrics
  snapshot, ``Health``'s fields, the tallies it copies, ``Pacer``'s two counts),
  prometheus_client's own thread-safe metrics and ``Gate.counts``. It never calls into the
  loop.
- off-loop tasks (daemon/offloop.py, ``self.offloop``): one thread per blocking read, each
  with a deadline: a reload's config and key reads (config-read, keys-read:
  daemon/reloader.py) and the code fingerprints (code-check: daemon/codewatch.py). Each
  reads files and writes only its own task (and its reload's ``Read``); its result or
  exception comes back in the task, then ``signals.wake`` makes the poller return. The loop
  reads a task once it is done, or gives up on it at its deadline: a stuck task is never
  joined, and ``OffLoop.facts`` counts it (the first fingerprints are waited for, up to
  their deadline, before the loop starts). The fingerprint walks also add to
  config/fingerprint.py's PARTLY_COMPARED (behind its lock), which `status` reads.

Any thread may log: the log sink takes a lock and writes each line whole (or drops it).

Processes beside the workers: the HTTP fronts (daemon/fronts.py, supervisor/front/), when
supervisor.http.listen is set. The loop starts, polls, restarts and drains them; they share
nothing with it but the listening socket (inherited) and a private frontend endpoint, on
which they are clients like any other, and their metrics files, which the scrape reads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import zmq

from supervisor.config import worker_spec
from supervisor.config.keys import Config, CurveConfig, SupervisorSection
from supervisor.config.settings import ConfigErrors
from supervisor.config.worker_spec import INSTANCE_VAR
from supervisor.core.actions import Action, Kill, Reply, SampleNow, SendBatch, Spawn, Stop
from supervisor.core.budget import sizing_problem
from supervisor.core.core import Core
from supervisor.daemon import leftovers, security, startup
from supervisor.daemon.cgroup import CgroupReader
from supervisor.daemon.codewatch import CHECK, CodeWatch, fingerprints_within
from supervisor.daemon.control import Controller
from supervisor.daemon.cpu_pressure import CpuPressureReader
from supervisor.daemon.descriptors import BACKLOG, LOW_LIMIT, Gate, raise_limit, reserve
from supervisor.daemon.failures import Failures
from supervisor.daemon.fronts import EXIT_GRACE, Fronts
from supervisor.daemon.instance_lock import AlreadyRunning, InstanceLock
from supervisor.daemon.monitor import Monitor
from supervisor.daemon.offloop import OffLoop
from supervisor.daemon.pacing import Pacer
from supervisor.daemon.reloader import Answer, Outcome, Read, Reloader
from supervisor.daemon.reporting import Reporter
from supervisor.daemon.resources import Resources
from supervisor.daemon.signals import SignalInbox
from supervisor.daemon.tree import Trees
from supervisor.daemon.worker_output import WorkerOutput
from supervisor.shared import linux, logs
from supervisor.shared.certificates import load_certificate
from supervisor.shared.exitcodes import DaemonExit, WorkerExit
from supervisor.shared.protocol import (
    CONTROL,
    ERROR,
    STOP,
    Frame,
    JobEntry,
    Message,
    ProtocolError,
    decode,
    encode,
    frame_bytes,
    pack_job,
    split_envelope,
)
from supervisor.shared.transport import ipv6_for, send, waiting

log = logs.get(__name__)

# Messages read from one socket per loop turn, so no socket starves the others.
BATCH_READS = 256
# The loop wakes at least this often for housekeeping (messages, signals and deadlines wake
# it sooner): rarely enough to cost nothing when idle.
MAX_SLEEP = 0.5
# Fewest messages ZeroMQ may buffer per client connection before admission (see _receive_hwm).
RECEIVE_HWM_FLOOR = 64
# Housekeeping (reap, time limits, policy, reports) runs at most this often (seconds).
HOUSEKEEPING = 0.01
# A reload's files must be read within this (seconds), or the reload is refused: a config
# on a hung mount (daemon/reloader.py). Well under `reload`'s own 30 s default timeout.
CONFIG_READ_TIMEOUT = 10.0
# A loop turn (or a poll's oversleep) longer than this is a stall (seconds): see _stalled.
STALL = 1.0





class Daemon:
    """Sockets, processes, signals and /proc: the I/O around the core, and nothing else.

    Every decision is the core's; the daemon turns what happens into core events (with the
    time) and performs the actions the core returns, in order.
    """

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.core = Core(config)
        self.context = zmq.Context()
        self.frontend = self.context.socket(zmq.ROUTER)
        self.backend = self.context.socket(zmq.ROUTER)
        self.control = self.context.socket(zmq.ROUTER)  # status: read-only
        self.admin = self.context.socket(zmq.ROUTER)  # recycle, reload: its own access
        self.bound: list[Path] = []  # ipc socket files this daemon created
        self.made: list[Path] = []  # directories it made for them, deepest last
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.monitor = Monitor()
        self.cgroup = CgroupReader()  # the container's memory budget, read every poll
        self.cpu_pressure = CpuPressureReader()  # whether the cores are contended, too
        self.oom_score_failed = False  # logged once
        self.trees = Trees()  # each worker's descendants, found at every memory poll
        self.output = WorkerOutput()  # workers' stdout/stderr, when the logs are JSON
        self.reporter = Reporter(self.core.pool, self.core.router, clock(), self.core.budget,
                                 clock)
        # Raised before any socket or worker: libzmq and the workers see the new limit.
        self.gate = Gate(self.context, raise_limit())  # descriptors for the daemon's own work
        self.resources = Resources(self.gate)
        self.reporter.metrics.registry.register(self.resources)
        self.fronts: Fronts | None = None  # the HTTP front processes, when http.listen is set
        self.fronts_deadline: float | None = None  # after the drain: fronts get until then
        self.front_key: tuple[bytes, Path] | None = None  # their CURVE pair, under curve
        self.pacer = Pacer(clock)  # what one connection may ask of the status endpoint
        self.reporter.metrics.registry.register(self.pacer)
        self.controller = Controller(
            self.core, self.reload,
            serving=lambda: self.reporter.serving and self.core.shutdown_started is None,
            ready=lambda: self.reporter.ready_now(self.core.shutdown_started is not None),
            resources=self.resources.facts,
            fronts=lambda: self.fronts.facts(self.clock()) if self.fronts else None,
            turn=lambda: self.turn_started, paced=self.pacer.facts,
            busy=self.pacer.saturated)
        self.status_frames: tuple[dict[str, Any], list[Frame]] | None = None  # encoded once
        self.signals = SignalInbox()
        self.failures = Failures()  # what the loop survives, logged without flooding
        self.offloop = OffLoop(self.signals.wake, clock)  # blocking reads, with deadlines
        self.code = CodeWatch(self.offloop)  # the models' code on disk, against what workers run
        self.reloader = Reloader(CONFIG_READ_TIMEOUT, self.offloop)
        self.zap: security.ZapHandler | None = None  # CURVE authentication, when configured
        self.next_housekeeping = 0.0
        self.turn_started = 0.0  # when the poller last returned
        self.log_format = "auto"  # workers log the way the supervisor does
        self.instance = InstanceLock(Path(config.runtime_dir))
        self.incarnation = leftovers.Instance.this(Path(config.runtime_dir))

    # --- setup ---------------------------------------------------------------------------

    def bind(self) -> None:
        """Everything the start needs, in order; raises StartError (one cause, one exit
        status) and leaves behind only what _close removes."""
        sup = self.config.supervisor
        runtime = Path(self.config.runtime_dir)
        with startup.step("socket_group"):
            gid = security.group_id("socket_group", sup.socket_group)
        with startup.step("admin_group"):
            admin_gid = security.group_id("admin_group", sup.admin_group)
        with startup.step(f"runtime dir {runtime}", runtime_dir=True):
            # systemd's RuntimeDirectory=, made for this service: socket_group still applies
            service_dir = str(runtime) == os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
            self.made += security.prepare_runtime_dir(runtime, gid, service_dir)
            self.instance.acquire()  # before any socket: never take over a live daemon's
            self._reap_leftovers(runtime)
            private = Path(self.config.backend[len("ipc://"):]).parent
            if not private.exists():
                private.mkdir(mode=0o700)
                self.made.append(private)
            os.chmod(private, 0o700)  # workers only: clients share the runtime dir's group
        self.frontend.setsockopt(zmq.MAXMSGSIZE, sup.max_message_size)
        # What ZeroMQ buffers before admission counts against memory too: a few messages per
        # client pipe (see docs/protocol.md for the bound this gives).
        self.frontend.setsockopt(zmq.RCVHWM, _receive_hwm(sup))
        self.frontend.setsockopt(zmq.ROUTER_MANDATORY, 0)
        for sock in self._sockets():
            sock.setsockopt(zmq.LINGER, 1000)
        for sock in (self.frontend, self.control):  # what clients reach: paused when
            sock.setsockopt(zmq.BACKLOG, BACKLOG)  # descriptors run short (descriptors.py)
            self.gate.watch(sock)
        for endpoint in sup.endpoints:
            with startup.step(f"endpoint {endpoint}", runtime_dir=True):
                self.gate.pausable(endpoint)
        with startup.step(f"endpoint {sup.control}", runtime_dir=True):
            self.gate.pausable(sup.control, share=0.5)  # later: probes reach it
        if sup.curve.enabled:
            if sup.http.listen or sup.grpc.listen:
                with startup.step("the HTTP fronts' key pair", runtime_dir=True):
                    self.front_key = security.front_certificate(private)
            self._curve(sup)
        for endpoint in sup.endpoints:
            self._bind(self.frontend, endpoint, gid)
        self._bind(self.backend, self.config.backend, None)
        if sup.http.listen or sup.grpc.listen:
            self._http(sup)
        self._bind(self.control, sup.control, gid)
        self._bind(self.admin, sup.admin, admin_gid, shared=admin_gid is not None)
        if sup.metrics:
            with startup.step(f"metrics address {sup.metrics}"):
                self.reporter.serve(sup.metrics)

    def _http(self, sup: SupervisorSection) -> None:
        """The fronts' private endpoint on the frontend socket (they are clients like any
        other), their listening socket, and their metrics on the daemon's /metrics."""
        private = Path(self.config.backend[len("ipc://"):]).parent
        endpoint = f"ipc://{private}/fronts.sock"
        self._bind(self.frontend, endpoint, None, shared=False)
        curve = None
        if self.front_key is not None and sup.curve.server_secret_key is not None:
            server = load_certificate(sup.curve.server_secret_key)[0]
            curve = (server.decode(), str(self.front_key[1]))
        self.fronts = Fronts(sup.http, endpoint, private / "front-metrics", sup.log_level,
                             self.log_format, curve, sup.grpc, sup.max_message_size)
        with startup.step("the fronts' files"):
            self.fronts.bind()
        with startup.step(f"the fronts' address (http {sup.http.listen}, grpc "
                          f"{sup.grpc.listen})"):
            self.fronts.listen()
        self.reporter.metrics.registry.register(self.fronts.collector())
        self.reporter.fronts = self.fronts.facts  # readiness: no front running, not ready

    def _front_public(self) -> bytes | None:
        return self.front_key[0] if self.front_key is not None else None

    def _curve(self, sup: SupervisorSection) -> None:
        with startup.step("supervisor.curve"):
            self.zap = security.start_zap(self.context, security.with_front(
                security.read_clients(sup.curve), self._front_public()))
            security.make_curve_server(self.frontend, sup.curve)
            if sup.control.startswith("tcp://"):
                security.make_curve_server(self.control, sup.curve)
            if sup.admin.startswith("tcp://"):
                security.make_curve_server(self.admin, sup.curve, security.ADMIN_DOMAIN)

    def _bind(self, sock: zmq.Socket[bytes], endpoint: str, gid: int | None,
              shared: bool = True) -> None:
        path = Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None
        with startup.step(f"endpoint {endpoint}", runtime_dir=path is not None):
            if path is not None and path.is_socket():
                if _listening(path):  # ZeroMQ would silently take it over
                    raise AlreadyRunning(f"{endpoint} is served by another live process; "
                                         "stop it first, or choose another endpoint")
                path.unlink()  # left by a previous run that died
            previous = os.umask(0o177)  # no moment when others could open the socket file
            try:
                sock.setsockopt(zmq.IPV6, ipv6_for(endpoint))  # tcp://[::1]:N, tcp://*:N
                sock.bind(endpoint)
            finally:
                os.umask(previous)
            if path is not None:
                self.bound.append(path)  # ours to remove at exit, and only those
            security.restrict_socket(endpoint, gid, shared)

    def _sockets(self) -> tuple[zmq.Socket[bytes], ...]:
        return (self.frontend, self.backend, self.control, self.admin)

    # --- main loop -----------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.bind()
        except startup.StartError as exc:
            return self._failed_start(exc.code, exc.message)
        except Exception as exc:  # a bug, not an operator's condition: keep the traceback
            log.exception("supervisor_start_failed", exit_code=int(DaemonExit.START_FAILED))
            return self._failed_start(DaemonExit.START_FAILED, str(exc), logged=True)
        self.signals.install()
        self._code_at_start()
        self._keep_reserve()
        self.gate.start()
        # Orphans of a worker's tree come to us, not to init: found, killed, reaped.
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
        sup = self.config.supervisor
        log.info("supervisor_started", pid=os.getpid(), endpoints=list(sup.endpoints),
                 control=sup.control, admin=sup.admin, models=sorted(self.config.models))
        self._check_budget()
        poller = zmq.Poller()
        for sock in self._sockets():
            poller.register(sock, zmq.POLLIN)
        poller.register(self.signals.fileno(), zmq.POLLIN)
        if self.zap is not None:
            poller.register(self.zap.zap_socket, zmq.POLLIN)
        self.output.attach(poller)
        try:
            while not self.core.finished or self._fronts_draining():
                before, sleep_ms = self.clock(), self._sleep_ms()
                ready = dict(poller.poll(sleep_ms))
                self.turn_started = self.clock()
                self._stalled(self.turn_started - before - sleep_ms / 1000)
                woken = self.signals.fileno() in ready
                if woken or self.signals.pending:  # nothing to do on most turns
                    self._guarded("signal_handling_failed", partial(self._handle_signals, woken))
                if self.backend in ready:
                    self._drain(self.backend, self._on_backend)
                if self.frontend in ready:
                    self._guarded("requests_failed", self._read_requests)
                if self.control in ready:
                    self._drain(self.control, self._on_control)
                if self.pacer.held:  # requests that waited for their connection's turn
                    for frames in self.pacer.due():
                        self._guarded("control_failed", partial(
                            self._command, self.control, frames, False))
                if self.admin in ready:
                    self._drain(self.admin, self._on_admin)
                if self.zap is not None and self.zap.zap_socket in ready:
                    self._guarded("zap_failed", self.zap.handle)
                if self.output.readable(ready):  # nothing per wake-up without output
                    self._guarded("worker_output_failed",
                                  partial(self.output.read, ready, self.clock()))
                self._guarded("housekeeping_failed", self.housekeeping)
                end = self.clock()
                self._stalled(end - self.turn_started)  # housekeeping's own share
                self.reporter.health.turned(end)  # what /livez reads
        finally:
            # Done: a late SIGTERM (the kubelet's, after the preStop hook's drain) must not
            # kill the exit. Python resets handlers to the default at exit, but not SIG_IGN.
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_IGN)
            self._close()
        log.info("supervisor_stopped")
        return DaemonExit.OK

    def _fronts_draining(self) -> bool:
        """After the workers' drain: fronts still finishing their answers, for EXIT_GRACE at
        most (they are killed at exit after that)."""
        if self.fronts is None or not self.fronts.pids():
            return False
        now = self.clock()
        if self.fronts_deadline is None:
            self.fronts_deadline = now + EXIT_GRACE
        return now < self.fronts_deadline

    def _check_budget(self) -> None:
        """At start (and after a reload): warn when the configured workers cannot fit the
        container's memory limit with one replacement beside them."""
        reading = self.cgroup.read()
        self.core.memory(reading, self.monitor.available(), poll=False)
        if reading is not None:
            log.info("memory_budget", cgroup=reading.path, version=reading.version,
                     limit=reading.limit, high=reading.high, working_set=reading.working_set,
                     kill_buffer=self.core.budget.buffer(
                         self.core.config.supervisor.min_available_memory))
        problem = sizing_problem(self.core.config.models, self.core.budget,
                                 self.core.config.supervisor.min_available_memory)
        if problem:
            log.warning("memory_budget_too_small", problem=problem,
                        limit=self.core.budget.limit,
                        hint="raise the container's limit or lower workers/kill_memory "
                        "(docs/deployment.md, sizing)")

    def _failed_start(self, code: DaemonExit, message: str, logged: bool = False) -> int:
        """One error event and a documented status; nothing left behind that this daemon
        created (sockets, lock), and nothing touched that another one owns."""
        if not logged:
            log.error("supervisor_start_failed", error=message, exit_code=int(code))
        with contextlib.suppress(Exception):
            self._close()
        for path in reversed(self.made):  # what this start made, if nothing else is in it
            with contextlib.suppress(OSError):
                path.rmdir()
        return code

    def _guarded(self, event: str, step: Callable[[], None]) -> None:
        """The daemon never dies of its own housekeeping: the error is logged, the loop goes
        on, and the next turn tries again."""
        try:
            step()
        except Exception as exc:
            self.failures.failed(event, exc, self.clock())
        self._perform()

    def _sleep_ms(self) -> int:
        """Until the next thing due: a memory poll, a watchdog ping, a partial batch that
        stops waiting, a queued job that expires; at most MAX_SLEEP."""
        now = self.clock()
        wake = min(now + MAX_SLEEP, max(self.core.next_poll, self.next_housekeeping))
        if self.reporter.notifier.watchdog_interval:
            wake = min(wake, max(self.reporter.next_watchdog, self.next_housekeeping))
        wake = min(wake, self.core.queue_wake(now, self.next_housekeeping))
        if (read_deadline := self.reloader.next_deadline()) is not None:
            wake = min(wake, max(read_deadline, self.next_housekeeping))
        if (paced := self.pacer.next_due()) is not None:
            wake = min(wake, paced)
        return max(0, int((wake - now) * 1000) + 1)

    def _drain(self, sock: zmq.Socket[bytes], handler: Callable[[list[Frame]], None]) -> None:
        for frames in waiting(sock, BATCH_READS):
            try:
                handler(frames)
            except Exception as exc:  # the daemon never dies of one message
                self.failures.failed("message_handling_failed", exc, self.clock())
            self._perform()

    def housekeeping(self) -> None:
        """At most every HOUSEKEEPING seconds, so a busy loop spends its time on jobs:
        reap exited workers, read memory when a poll is due, let the core tick, report."""
        now = self.clock()
        if now < self.next_housekeeping:
            self.core.waits_over(now)  # a batch whose wait ended is not held for the rest
            self._perform()
            return
        self.next_housekeeping = now + HOUSEKEEPING
        self._stalled(now - self.turn_started)  # this turn's handlers took that long
        self.turn_started = now
        self._reap(now)
        if self.fronts is not None:
            if self.core.shutdown_started is not None:
                self.fronts.drain()
            self.fronts.tick(now)
        self._reload_done(now)
        self.output.tick(now)
        self._watch_code(now)
        targets = self.core.poll_due(now)
        if targets is not None:
            self._find_trees()
            readings = self.monitor.read(targets, self.trees)
            self.core.memory(self.cgroup.read(), self.monitor.available(), poll=True)
            self.core.cpu_pressure(self.cpu_pressure.read(), now)
            self.core.samples(now, readings, poll=True)
        self.core.tick(now)
        self._perform()
        self.reporter.report(now, self.config.supervisor, self.core.shutdown_started is not None,
                             self.core.shutdown_deadline())
        self.core.published = self.reporter.health.report  # the `models` reply's readiness

    def _stalled(self, seconds: float) -> None:
        """Time the loop was not running, beyond a normal turn: told to the core, so a
        worker is never judged hung for a silence the supervisor itself caused."""
        if seconds > STALL:
            log.warning("supervisor_stalled", seconds=round(seconds, 1))
            self.core.stalled(seconds, self.clock())

    def _reap(self, now: float) -> None:
        """Exited workers, each after its process tree is taken down, then any other child
        that exited: orphans re-parented to us (a subreaper, or PID 1 in a container)."""
        for worker_id, process in list(self.processes.items()):
            exited = _exited(process.pid)  # one waitid a worker a turn, nothing reaped
            if exited is None:
                continue
            if exited:  # its zombie holds its group's number: safe to kill the group
                killed = self.trees.take_down(process.pid)
                if killed:
                    log.warning("worker_descendants_killed", worker=worker_id, count=killed)
            code = process.poll()  # reaps it (or, no longer our child, reads as gone)
            if code is not None:
                del self.processes[worker_id]
                self.output.finish(worker_id, now)  # its last lines before its exit event
                if code == -signal.SIGKILL:  # the kernel's OOM killer? its counter says
                    self.core.memory(self.cgroup.read(), None, poll=False)
                self.core.exited(worker_id, code, now)
        fronts = self.fronts.pids() if self.fronts is not None else set()
        while (pid := _exited_child()) is not None:
            if pid in fronts or any(p.pid == pid for p in self.processes.values()):
                break  # a worker or front that exited just now: the next turn reaps it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    def _find_trees(self) -> None:
        try:
            found = self.trees.refresh({p.pid: w for w, p in self.processes.items()})
        except OSError as exc:  # /proc unreadable now (EMFILE): the trees as last found,
            # and the memory poll, the kills and the timers after it go on regardless
            self.failures.failed("process_scan_failed", exc, self.clock())
            return
        for escaped in found:
            log.warning("descendant_escaped", worker=escaped.worker_id, pid=escaped.proc.pid,
                        killed=escaped.killed,
                        hint="it left the worker's process group; killed with what it started")

    # --- actions -------------------------------------------------------------------------

    def _perform(self) -> None:
        """Carry out what the core decided; some actions report back (a spawn that failed,
        memory read now), which may decide more."""
        while self.core.outbox:  # most calls find nothing: no copy, no call
            for action in self.core.take():
                try:
                    self._perform_one(action)
                except Exception:
                    log.exception("action_failed", action=type(action).__name__)

    def _perform_one(self, action: Action) -> None:
        if isinstance(action, Reply):
            send(self.frontend, [*action.envelope, *encode(action.msg)])
            self._count(action)
        elif isinstance(action, SendBatch):
            self._send_batch(action)
        elif isinstance(action, Spawn):
            self._spawn(action)
        elif isinstance(action, Stop):
            send(self.backend, [action.worker_id.encode(), *encode(Message(STOP))])
            self._signal(action.worker_id, signal.SIGTERM)
        elif isinstance(action, Kill):
            self._signal(action.worker_id, signal.SIGKILL)
        elif isinstance(action, SampleNow):
            now = self.clock()
            targets = [(w, self.processes[w].pid, self._metric(w)) for w in action.worker_ids
                       if w in self.processes]
            self._find_trees()
            self.core.samples(now, self.monitor.read(targets, self.trees), poll=False)

    def _count(self, reply: Reply) -> None:
        now = self.clock()
        if reply.job is not None:
            self.reporter.answered(reply.job, reply.msg, now)
        elif reply.msg.kind == ERROR:
            self.reporter.refused(reply.model, str(reply.msg.header.get("code")), now)

    def _send_batch(self, action: SendBatch) -> None:
        """One message per batch; the jobs' array frames pass through without a copy."""
        jobs = action.jobs
        entries = [JobEntry(str(j.id).encode(), j.inputs, j.arrays) for j in jobs]
        send(self.backend, [action.worker_id.encode(), *encode(pack_job(entries, action.pad_to))])
        # Counted after the send: with one job in flight, the worker is waiting for it.
        self.reporter.metrics.batch(jobs[0].model, action.rows,
                                    [action.now - j.received_at for j in jobs])

    def _spawn(self, action: Spawn) -> None:
        capture: int | None = None
        try:
            secret = secrets.token_hex(16)
            spec = worker_spec.build_spec(self.core.config, action.model, action.worker_id,
                                    os.getpid(), self.log_format, secret)
            # Under JSON logs every line must be JSON, so the worker's output comes through
            # us (daemon/worker_output.py); it then logs JSON too ("auto" on a pipe). On a
            # console a person reads it: the terminal is inherited and the TF lines, colours
            # and progress bars show as they are, unwrapped and unthrottled.
            if not logs.renders_console(self.log_format):
                capture = self.output.open(action.worker_id, action.model, self.clock())
            process = subprocess.Popen(
                worker_spec.worker_command(spec),
                env=worker_spec.worker_env(self.core.config, spec, os.environ),
                stdin=subprocess.DEVNULL,
                stdout=capture,
                stderr=subprocess.STDOUT if capture is not None else None,
                # Own process group: a Ctrl-C on the terminal reaches the supervisor only,
                # which then drains its workers instead of having them die mid-job.
                process_group=0,
            )
        except (OSError, worker_spec.SpawnError) as exc:  # EAGAIN, ENOMEM, a spec that cannot
            # travel: a boot failure, reported with its reason and retried with back-off
            error = f"worker {action.worker_id} could not be started: {type(exc).__name__}: " \
                    f"{exc}"
            log.error("worker_spawn_failed", model=action.model, worker=action.worker_id,
                      error=error)
            self.output.finish(action.worker_id, self.clock())
            self.core.exited(action.worker_id, WorkerExit.SPAWN_FAILED, self.clock(), error)
            return
        finally:
            if capture is not None:
                os.close(capture)  # the worker has its copy: its exit ends the stream
        self.processes[action.worker_id] = process
        # Right after fork: the worker is still starting Python, long before TensorFlow
        # allocates; what it starts inherits the score.
        adj = self.core.config.supervisor.worker_oom_score_adj
        if linux.raise_oom_score(process.pid, adj) is None and not self.oom_score_failed:
            self.oom_score_failed = True
            log.warning("oom_score_adj_failed", worker=action.worker_id, value=adj,
                        hint="the kernel may pick the supervisor as its OOM victim")
        self.core.spawned(action.worker_id, process.pid, secret)

    def _signal(self, worker_id: str, signum: int) -> None:
        process = self.processes.get(worker_id)
        if process is not None:
            with contextlib.suppress(ProcessLookupError):  # already gone; reaping will tell
                process.send_signal(signum)

    def _metric(self, worker_id: str) -> str:
        worker = self.core.pool.workers.get(worker_id)
        if worker is None:
            return "rss"
        return self.core.pool.models[worker.model].config.policy.memory_metric

    # --- sockets in ----------------------------------------------------------------------

    def _read_requests(self) -> None:
        """Every request waiting on the frontend (up to BATCH_READS), handed to the core as
        one arrival: jobs already here batch together (see Core.requests)."""
        burst = list(waiting(self.frontend, BATCH_READS))
        if burst:
            self.core.requests(burst, self.clock())

    def _on_backend(self, frames: list[Frame]) -> None:
        identity = frames[0].bytes if isinstance(frames[0], zmq.Frame) else bytes(frames[0])
        self.core.worker_message(identity, frames[1:], self.clock())

    def _on_control(self, frames: list[Frame]) -> None:
        """Paced per connection (pacing.py): now, later, or refused in so many words."""
        outcome = self.pacer.admit(frame_bytes(frames[0]) if frames else b"", frames)
        if outcome == "now":
            self._command(self.control, frames, admin=False)
        elif outcome == "refused":
            envelope, _ = split_envelope(frames)
            send(self.control, [*envelope, *encode(Message(CONTROL, b"", {
                "ok": False, "error": "too many requests waiting on this connection to the "
                f"status endpoint (at most {self.pacer.facts()['limit']}): wait for the "
                "answers before asking again"}))])

    def _on_admin(self, frames: list[Frame]) -> None:
        self._command(self.admin, frames, admin=True)

    def _command(self, sock: zmq.Socket[bytes], frames: list[Frame], admin: bool) -> None:
        envelope, body = split_envelope(frames)

        def answer(result: dict[str, Any]) -> None:  # now, or when a reload is done
            if self.status_frames is not None and self.status_frames[0] is result:
                out = self.status_frames[1]  # a published status: encoded once
            else:
                out = encode(Message(CONTROL, b"", result))
                if result is (self.controller.published or (0, 0, None))[2]:
                    self.status_frames = (result, out)
            send(sock, [*envelope, *out])

        try:
            msg = decode(body)
            if msg.kind != CONTROL:
                raise ProtocolError("the control socket takes control messages only")
            now_result = self.controller.handle(msg.header, self.clock(), admin, answer)
        except ProtocolError as exc:
            now_result = {"ok": False, "error": str(exc)}
        if now_result is not None:
            answer(now_result)

    # --- signals, reload and shutdown ----------------------------------------------------

    def _handle_signals(self, woken: bool = True) -> None:
        for signum in self.signals.take(woken):
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.core.shutdown(self.clock(), signal.Signals(signum).name)
                self.reporter.stopping()
            elif signum == signal.SIGHUP:
                self.reload()

    def reload(self, answer: Answer | None = None) -> None:
        """SIGHUP (``answer`` None) or the reload command: the files are read off the loop
        (daemon/reloader.py) and applied by housekeeping; ``answer`` gets the outcome."""
        path = self.config.path
        error: dict[str, Any] | None
        if path is None:
            error = {"ok": False, "error": "this supervisor was not started from a file"}
        else:
            error = self.reloader.request(path, self._key_dirs(), answer, self.clock())
        if error is not None:
            log.error("config_rejected", path=str(path), errors=[error["error"]])
            self._answer_reload(error, [answer] if answer else [])

    def _key_dirs(self) -> CurveConfig | None:
        """The key directories to re-read: the running config's (socket settings, key
        paths among them, change only on restart: reload.effective)."""
        return self.config.supervisor.curve if self.zap is not None else None

    def _reload_done(self, now: float) -> None:
        if self.config.path is None:
            return
        if (keys := self.reloader.keys_read()) is not None:
            self._install_keys(keys)
        outcome = self.reloader.outcome(self.config.path, self._key_dirs(), now)
        if outcome is not None:
            self._answer_reload(self._apply(outcome), outcome.answers)

    def _answer_reload(self, result: dict[str, Any], answers: list[Answer]) -> None:
        self.reporter.reloaded(result)
        for answer in answers:
            answer(result)

    def _apply(self, outcome: Outcome) -> dict[str, Any]:
        """What a finished read found, applied in place: the keys whatever the config file
        holds (a removal always applies), then the config if it validated."""
        read = outcome.read
        note, keys_changed = self._install_keys(read)  # read before the config, even if
        # that then hung
        if outcome.timed_out:
            what = f"reading {read.path}" if read.reading is None else \
                f"the code fingerprint (reading {read.reading}, named by the config)"
            error = (f"{what} took longer than {self.reloader.timeout:g}s (a file system "
                     "that does not answer, a hung mount, a file that never ends, or a file "
                     "too large to parse); the config was not changed" + _keys_told(outcome))
            log.error("config_rejected", path=read.reading or str(read.path), errors=[error])
            return {"ok": False, "error": f"config rejected, running config kept: {error}"}
        if read.error is not None or read.config is None:
            messages = [str(e) for e in read.error.errors] \
                if isinstance(read.error, ConfigErrors) else \
                [f"{type(read.error).__name__}: {read.error}"]
            log.error("config_rejected", path=str(read.path), errors=messages)
            return {"ok": False, "error": "config rejected, running config kept:\n" +
                    "\n".join(messages) + note}
        self.reporter.notifier.reloading(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)
        changes = self.core.reload(read.config, self.clock(), read.code)
        self.config = self.core.config
        self._keep_reserve()
        self.reporter.notifier.ready(self.reporter.summary(self.clock(), False))
        summary = changes.summary()
        if keys_changed:  # keys alone changed: a reload that did something all the same
            summary["client_keys"] = keys_changed
        log.info("config_reloaded", path=str(read.path), **summary)
        self._check_budget()
        if changes.restart_required:
            log.warning("restart_required", settings=changes.restart_required,
                        hint="these settings bind sockets; they take effect on restart")
        if read.keys is not None and read.keys[1]:
            summary["key_problems"] = read.keys[1]
        return {"ok": True, "result": summary}

    def _install_keys(self, read: Read) -> tuple[str, list[str]]:
        """The client keys the read found, installed; a note for a rejected reload's
        answer when some were skipped, and what changed in the admitted keys."""
        if self.zap is None or read.keys is None:
            return "", []
        keys, problems = read.keys
        changed = security.install_clients(self.zap, security.with_front(
            keys, self._front_public()))
        if not problems:
            return "", changed
        log.error("curve_keys_skipped", problems=problems,
                  hint="the keys that could be read apply; fix or remove the others")
        return ("\nclient keys re-read all the same (a removed key is never kept); skipped:\n"
                + "\n".join(problems)), changed

    def _code_at_start(self) -> None:
        """What the first workers start from: the fingerprints of the models' code, read
        with the config's deadline (a model on a hung mount: unknown until a reload)."""
        found = fingerprints_within(self.offloop, self.config, CONFIG_READ_TIMEOUT)
        if found is None:
            log.warning("code_fingerprint_timed_out", seconds=CONFIG_READ_TIMEOUT,
                        hint="a model's files did not answer: a reload will not see their "
                        "code change until they do")
        for name, state in self.core.pool.models.items():
            state.code = state.code_on_disk = (found or {}).get(name)
        self.code.next_check = self.clock() + CHECK  # just read

    def _watch_code(self, now: float) -> None:
        """Fingerprints of the models on disk, for `status`; a model served from a TF
        Serving layout (version directories) is rolled when its directory changes, as TF
        Serving loads a new version by itself."""
        found = self.code.due(self.config, now)
        for name, fingerprint in (found or {}).items():
            state = self.core.pool.models.get(name)
            if state is None:
                continue
            changed = state.code_on_disk is not None and fingerprint != state.code_on_disk
            state.code_on_disk = fingerprint
            if changed and state.version is not None and fingerprint is not None and \
                    self.core.shutdown_started is None:
                log.info("model_version_changed", model=name, serving=state.version,
                         hint="rolling the workers onto the highest version directory")
                self.core.roll(name)

    def _keep_reserve(self) -> None:
        """The descriptors kept from clients: more workers configured need more."""
        sup, limit = self.config.supervisor, self.gate.limit
        workers = sum(m.workers for m in self.config.models.values())
        self.gate.reserve = reserve(limit.soft, workers, len(sup.endpoints) + 1)
        if limit.soft < max(LOW_LIMIT, 4 * self.gate.reserve):
            log.warning("nofile_low", limit=limit.soft, hard_limit=limit.hard,
                        reserve=self.gate.reserve,
                        hint="few descriptors for client connections: raise LimitNOFILE "
                        "(systemd) or the container runtime's nofile limit")

    def _close(self) -> None:
        self._refuse_latecomers()
        with contextlib.suppress(Exception):  # its socket files back where _close finds them
            self.gate.close()
        if self.fronts is not None:
            with contextlib.suppress(Exception):  # the workers must still go down
                self.fronts.close(grace=0.0 if self.core.shutdown_started is None
                                  else EXIT_GRACE)
        for process in self.processes.values():  # alive or an unreaped zombie: its group
            self.trees.take_down(process.pid)     # is its own, the worker included
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        with contextlib.suppress(Exception):  # what escaped a group since the last poll
            self._find_trees()
        try:
            self.output.finish_all(self.clock())
        except Exception:  # the sockets and the instance lock must still be released
            log.exception("worker_output_failed")
        if self.zap is not None:
            self.zap.close()
        for sock in self._sockets():
            sock.close(linger=1000)
        self.context.term()
        self.reporter.close()
        for path in self.bound:
            path.unlink(missing_ok=True)
        if self.instance.held:  # every tree taken down: nothing left for a next start to reap
            leftovers.remove_record(Path(self.config.runtime_dir), self.incarnation)
        self.instance.release()  # last: the sockets are gone, another daemon may start

    def _reap_leftovers(self, runtime: Path) -> None:
        """What a previous daemon on this runtime dir, killed outright, left running (its
        workers' descendants in sessions of their own): reaped before anything starts, and
        everything this one starts marked the same way (daemon/leftovers.py)."""
        reaped = leftovers.reap(runtime, self.incarnation)
        if reaped is not None:
            log.warning("leftovers_reaped", **reaped,
                        detail="processes a previous supervisor on this runtime dir left "
                        "running when it was killed, known by the mark it set on them")
        # Inherited by every worker and front, and by their descendants.
        os.environ[INSTANCE_VAR] = self.incarnation.mark

    def _refuse_latecomers(self) -> None:
        """Requests that arrived while the last workers stopped are answered
        'shutting_down', not left to the client's timeout."""
        if self.core.shutdown_started is None:
            return
        with contextlib.suppress(Exception):
            self._read_requests()
            self._perform()


def _keys_told(outcome: Outcome) -> str:
    if outcome.keys_again:
        return ", the client keys are being re-read and apply when read"
    return ", the client keys read before it apply" if outcome.read.keys else ""


def _exited(pid: int) -> bool | None:
    """True: the child has exited (not reaped yet); None: it runs; False: it is no longer
    our child to wait for (then Popen.poll says it is gone)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return None if info is None else True


def _exited_child() -> int | None:
    """Some child that has exited, not reaped yet (None: none has)."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    return None if info is None else info.si_pid


def _listening(path: Path) -> bool:
    """Whether a live process accepts connections on this unix socket path."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _receive_hwm(sup: SupervisorSection) -> int:
    """Messages ZeroMQ may buffer per client connection before admission: max_queue_bytes
    worth of the largest messages, but at least RECEIVE_HWM_FLOOR (fewer throttles clients
    that keep a window of small jobs in flight: 4 cost a third of the tiny-job throughput)
    and at most ZeroMQ's default 1000."""
    return max(RECEIVE_HWM_FLOOR, min(1000, sup.max_queue_bytes // max(1, sup.max_message_size)))
