"""The supervisor's main loop: it wires sockets, pool, router and monitor together.

Single-threaded: one zmq poller over the frontend, backend and control sockets plus a
signal wake-up pipe. Signal handlers only record the signal; the loop acts on it.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from supervisor import logs, security
from supervisor import reload as reloading
from supervisor.batching import job_rows, next_deadline
from supervisor.config import Config, SupervisorSection, load_config
from supervisor.control import Controller
from supervisor.exitcodes import describe_exit
from supervisor.frontend import Refusal, admit, specs_to_wire
from supervisor.monitor import Monitor
from supervisor.pool import Pool, State, WorkerHandle
from supervisor.protocol import (
    BAD_REQUEST,
    CONTROL,
    ERROR,
    HEARTBEAT,
    INFER,
    INTERNAL_HOP,
    JOB,
    MAX_JOB_ID,
    MODELS,
    READY,
    RESULTS,
    SHUTTING_DOWN,
    TIMEOUT,
    UNAVAILABLE,
    Frame,
    Limits,
    Message,
    ProtocolError,
    decode,
    encode,
    error_message,
    split_envelope,
    unpack_results,
)
from supervisor.reporting import Reporter
from supervisor.router import Job, Router
from supervisor.settings import ConfigErrors
from supervisor.transport import NOBLOCK, recv, send

log = logs.get("daemon")

# Messages read from one socket per loop turn, so no socket starves the others.
BATCH_READS = 256
# The loop wakes at least this often for housekeeping (messages, signals and deadlines wake
# it sooner): rarely enough to cost nothing when idle.
MAX_SLEEP = 0.5
# Housekeeping (reap, time limits, policy, reports) runs at most this often (seconds).
HOUSEKEEPING = 0.01


class SignalInbox:
    """Records signals; a wake-up fd makes the poller return at once."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    def install(self) -> None:
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)

    def fileno(self) -> int:
        return self._reader.fileno()

    def take(self) -> list[int]:
        try:
            while self._reader.recv(4096):
                pass
        except BlockingIOError:
            pass
        taken, self.pending = self.pending, []
        return taken


class Daemon:
    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.context = zmq.Context()
        self.frontend = self.context.socket(zmq.ROUTER)
        self.backend = self.context.socket(zmq.ROUTER)
        self.control = self.context.socket(zmq.ROUTER)
        self.pool = Pool(config, send=self._send_worker)
        self.router = Router(config.supervisor.max_queue, reply=self._reply,
                             send_job=self._send_job, observe=self._observe)
        self.monitor = Monitor(self.pool, self.router, config.supervisor)
        self.reporter = Reporter(self.pool, self.router, clock())
        self.controller = Controller(self.pool, self.router, self.monitor, self.reload,
                                     lambda: self.reporter.serving and
                                     self.shutdown_started is None)
        self.signals = SignalInbox()
        self.next_job_id = 1
        self.shutdown_started: float | None = None
        self.fast_exit = False
        self.zap: security.ZapHandler | None = None  # CURVE authentication, when configured
        self.next_housekeeping = 0.0

    # --- setup ---------------------------------------------------------------------------

    def bind(self) -> None:
        sup = self.config.supervisor
        gid = security.prepare_runtime_dir(Path(self.config.runtime_dir), sup.socket_group)
        self.frontend.setsockopt(zmq.MAXMSGSIZE, sup.max_message_size)
        self.frontend.setsockopt(zmq.ROUTER_MANDATORY, 0)
        for sock in (self.frontend, self.backend, self.control):
            sock.setsockopt(zmq.LINGER, 1000)
        if sup.curve.enabled:
            self.zap = security.start_zap(self.context, sup.curve)
            security.make_curve_server(self.frontend, sup.curve)
            if sup.control.startswith("tcp://"):
                security.make_curve_server(self.control, sup.curve)
        for endpoint in sup.endpoints:
            self._bind(self.frontend, endpoint, gid)
        self._bind(self.backend, self.config.backend, None)
        self._bind(self.control, sup.control, gid)
        if sup.metrics:
            self.reporter.metrics.serve(sup.metrics)

    @staticmethod
    def _bind(sock: zmq.Socket[bytes], endpoint: str, gid: int | None) -> None:
        if endpoint.startswith("ipc://"):
            path = Path(endpoint[len("ipc://"):])
            if path.is_socket():
                path.unlink()  # left by a previous run that died; ZeroMQ would fail to bind
        previous = os.umask(0o177)  # no moment when others could open the socket file
        try:
            sock.bind(endpoint)
        finally:
            os.umask(previous)
        security.restrict_socket(endpoint, gid)

    # --- main loop -----------------------------------------------------------------------

    def run(self) -> int:
        self.bind()
        self.signals.install()
        log.info("supervisor_started", pid=os.getpid(), endpoints=list(
            self.config.supervisor.endpoints), control=self.config.supervisor.control,
            models=sorted(self.config.models))
        poller = zmq.Poller()
        for sock in (self.frontend, self.backend, self.control):
            poller.register(sock, zmq.POLLIN)
        poller.register(self.signals.fileno(), zmq.POLLIN)
        if self.zap is not None:
            poller.register(self.zap.zap_socket, zmq.POLLIN)
        try:
            while not self._finished():
                ready = dict(poller.poll(self._sleep_ms()))
                self._handle_signals(self.signals.take())
                if self.backend in ready:
                    self._drain(self.backend, self._on_backend)
                if self.frontend in ready:
                    self._drain(self.frontend, self._on_frontend)
                if self.control in ready:
                    self._drain(self.control, self._on_control)
                if self.zap is not None and self.zap.zap_socket in ready:
                    self.zap.handle()
                self.tick(self.clock())
        finally:
            self._close()
        log.info("supervisor_stopped")
        return 0

    def _sleep_ms(self) -> int:
        """Until the next thing due: a memory poll, a watchdog ping, a partial batch that
        stops waiting, a queued job that expires; at most MAX_SLEEP."""
        now = self.clock()
        wake = min(now + MAX_SLEEP, max(self.monitor.next_poll, self.next_housekeeping))
        if self.reporter.notifier.watchdog_interval:
            wake = min(wake, max(self.reporter.next_watchdog, self.next_housekeeping))
        for model, state in self.pool.models.items():
            queue = self.router.queues.get(model)
            if not queue:
                continue
            # The head is the oldest job, so usually the first to expire; later ones are
            # answered by the next housekeeping pass. O(1): this runs on every wake-up.
            deadlines = [next_deadline(queue, state.config.batch_policy), queue[0].deadline]
            for deadline in deadlines:
                if deadline is not None and deadline > now:  # past ones wait for a free
                    wake = min(wake, deadline)  # worker, whose answer wakes the loop
        return max(0, int((wake - now) * 1000) + 1)

    def _drain(self, sock: zmq.Socket[bytes], handler: Callable[[list[Frame]], None]) -> None:
        for _ in range(BATCH_READS):
            try:
                frames = recv(sock, NOBLOCK)
            except zmq.Again:
                return
            try:
                handler(frames)
            except Exception:  # the daemon never dies of one message
                log.exception("message_handling_failed")

    def tick(self, now: float) -> None:
        """After every wake-up: dispatch. Housekeeping (reaping, time limits, policy, reports)
        at most every HOUSEKEEPING seconds, so a busy loop spends its time on jobs."""
        if now >= self.next_housekeeping:
            self.next_housekeeping = now + HOUSEKEEPING
            for worker, code in self.pool.reap(now):
                self._lost(worker, code)
            self.pool.maintain(now)
            self.monitor.tick(now)
            self._drain_progress(now)
            self._enforce_job_timeouts(now)
            self._fail_unavailable()
            self.router.expire(now)
            self.reporter.report(now, self.config.supervisor, self.shutdown_started is not None)
            if self.shutdown_started is not None:
                self._shutdown_progress(now)
        for model in self.pool.models:
            self._dispatch(model, now)

    def _dispatch(self, model: str, now: float) -> None:
        queue = self.router.queues.get(model)
        if queue:
            ready = [(w.id, w.jobs) for w in self.pool.ready(model)]
            self.router.dispatch(model, ready, now, self.pool.models[model].config.batch_policy)

    # --- sockets out ---------------------------------------------------------------------

    def _reply(self, job: Job, msg: Message) -> None:
        send(self.frontend, [*job.envelope, *encode(msg)])

    def _send_job(self, worker_id: str, batch: list[Job], pad_to: int) -> None:
        """One message per batch; the jobs' array frames pass through without a copy."""
        self.reporter.metrics.batch(batch[0].model, sum(job_rows(j) for j in batch),
                           [(j.dispatched_at or j.received_at) - j.received_at for j in batch])
        header = {"jobs": [{"id": str(j.id), "inputs": j.inputs} for j in batch],
                  "pad_to": pad_to}
        frames = [frame for job in batch for frame in job.arrays]
        send(self.backend, [worker_id.encode(), *encode(Message(JOB, b"", header, frames))])

    def _send_worker(self, worker_id: str, msg: Message) -> None:
        send(self.backend, [worker_id.encode(), *encode(msg)])

    # --- frontend ------------------------------------------------------------------------

    def _on_frontend(self, frames: list[Frame]) -> None:
        envelope, body = split_envelope(frames)
        try:
            msg = decode(body, _limits(self.config.supervisor))
        except ProtocolError as exc:
            # Answer when we can tell a job id apart; a reply to garbage is harmless.
            self._refuse(envelope, _job_id_of(body), exc.code, str(exc), None)
            return
        model = msg.header.get("model")
        if msg.kind == MODELS:
            self._send_client(envelope, Message(MODELS, msg.job_id, self._models_header()))
        elif msg.kind != INFER:
            self._refuse(envelope, msg.job_id, BAD_REQUEST,
                         f"clients may send infer or models, not {msg.kind!r}", None)
        elif self.shutdown_started is not None:
            self._refuse(envelope, msg.job_id, SHUTTING_DOWN,
                         "the supervisor is shutting down; retry elsewhere", model)
        else:
            self._admit(envelope, msg)

    def _admit(self, envelope: list[Frame], msg: Message) -> None:
        now = self.clock()
        try:
            job = admit(msg, envelope, self.pool.models, self.next_job_id, now,
                        self.config.supervisor.max_elements)
        except Refusal as refusal:
            self._refuse(envelope, msg.job_id, refusal.code, str(refusal), msg.header.get("model"))
            return
        self.next_job_id += 1
        state = self.pool.models[job.model]
        if state.unavailable and not self.pool.ready(job.model):
            self.router.fail(job, UNAVAILABLE, self._unavailable_message(job.model))
            return
        self.router.submit(job)
        self._dispatch(job.model, now)

    def _refuse(self, envelope: list[Frame], job_id: bytes, code: str, message: str,
                model: object) -> None:
        """An answer at the door, counted like any other (under a served model's name only:
        names clients make up never become metric labels)."""
        self._send_client(envelope, error_message(job_id, code, message))
        served = isinstance(model, str) and model in self.pool.models
        label = model if served and isinstance(model, str) else "-"
        self.reporter.refused(label, code, self.clock())

    def _send_client(self, envelope: list[Frame], msg: Message) -> None:
        send(self.frontend, [*envelope, *encode(msg)])

    def _models_header(self) -> dict[str, Any]:
        models = {}
        for name, state in self.pool.models.items():
            if state.removed:
                continue
            models[name] = {"inputs": specs_to_wire(state.inputs),
                            "outputs": specs_to_wire(state.outputs),
                            "ready_workers": len(self.pool.ready(name)),
                            "workers": state.config.workers,
                            "available": not state.unavailable}
        return {"models": models}

    # --- backend -------------------------------------------------------------------------

    def _on_backend(self, frames: list[Frame]) -> None:
        identity = frames[0].bytes if isinstance(frames[0], zmq.Frame) else bytes(frames[0])
        msg = decode(frames[1:], INTERNAL_HOP)
        now = self.clock()
        if msg.kind == HEARTBEAT:
            self.pool.heartbeat(str(msg.header.get("worker")), msg.header, now)
            return
        worker = self.pool.workers.get(identity.decode(errors="replace"))
        if worker is None:
            return  # a worker already reaped, or a stranger on the ipc socket
        if msg.kind == READY:
            self.pool.mark_ready(worker.id, msg.header, now)
            self.monitor.on_ready(worker, now)
            last = worker.history.last()
            log.info("worker_ready", model=worker.model, worker=worker.id, pid=worker.pid,
                     warmup_seconds=worker.warmup_seconds,
                     baseline_memory=last.memory if last else None)
        elif msg.kind == RESULTS:
            for answer in unpack_results(msg):
                self._on_answer(worker, answer)
        elif msg.kind == ERROR:
            self.pool.load_failed(worker.id, str(msg.header.get("message")))

    def _on_answer(self, worker: WorkerHandle, msg: Message) -> None:
        try:
            job = self.router.complete(int(msg.job_id), worker.id)
        except ValueError:
            return
        if job is None:
            return
        worker.jobs += 1
        self.router.answer(job, Message(msg.kind, job.client_job_id, msg.header, msg.arrays))

    # --- control -------------------------------------------------------------------------

    def _on_control(self, frames: list[Frame]) -> None:
        envelope, body = split_envelope(frames)
        try:
            msg = decode(body)
            if msg.kind != CONTROL:
                raise ProtocolError("the control socket takes control messages only")
            result = self.controller.handle(msg.header, self.clock())
        except ProtocolError as exc:
            result = {"ok": False, "error": str(exc)}
        send(self.control, [*envelope, *encode(Message(CONTROL, b"", result))])

    # --- workers lost, drained, unavailable ----------------------------------------------

    def _lost(self, worker: WorkerHandle, code: int) -> None:
        """A worker exited: whatever it held goes back to the queue (or fails as poison)."""
        if not self.router.held_by(worker.id):
            return
        policy = self.pool.models[worker.model].config.policy
        why = f"worker {worker.id} (pid {worker.pid}) exited with jobs in hand"
        # A worker we killed for its memory (or to stop it) says nothing about its jobs; one
        # that died on its own, or hung, may have been killed by one of them.
        blame = not worker.killed_by_us or worker.recycle_reason == "hung"
        requeued, failed = self.router.requeue(worker.id, policy.max_attempts, why, blame)
        log.warning("jobs_requeued", model=worker.model, worker=worker.id, pid=worker.pid,
                    exit=describe_exit(code), requeued=requeued, failed_as_poison=failed)

    def _drain_progress(self, now: float) -> None:
        for worker in list(self.pool.workers.values()):
            if worker.state is not State.DRAINING:
                continue
            held = self.router.held_by(worker.id)
            if held and worker.drain_deadline is not None and now > worker.drain_deadline:
                policy = self.pool.models[worker.model].config.policy
                self.router.requeue(worker.id, policy.max_attempts,
                                    f"worker {worker.id} did not drain in time", False)
                log.warning("drain_timeout", model=worker.model, worker=worker.id,
                            pid=worker.pid, requeued=len(held),
                            drain_timeout=policy.drain_timeout)
                self.pool.kill(worker, worker.recycle_reason or "drain_timeout")
            elif not held:
                self.pool.stop(worker, now, worker.recycle_reason or "drained")

    def _enforce_job_timeouts(self, now: float) -> None:
        """A job past policy.job_timeout: answered 'timeout', its worker killed (TF cannot be
        interrupted safely), the worker's other jobs requeued when it is reaped."""
        for job in self.router.overdue(now, self._job_timeouts()):
            worker = self.pool.workers.get(job.worker or "")
            timeout = self.pool.models[job.model].config.policy.job_timeout
            self.router.fail(job, TIMEOUT, f"the job ran longer than job_timeout "
                             f"({timeout:g}s); its worker was killed")
            if worker is not None:
                log.warning("job_timeout", model=job.model, worker=worker.id, pid=worker.pid,
                            seconds=round(now - (job.dispatched_at or now), 2))
                self.pool.kill(worker, "job_timeout")

    def _job_timeouts(self) -> dict[str, float]:
        return {name: state.config.policy.job_timeout for name, state in self.pool.models.items()
                if state.config.policy.job_timeout is not None}

    def _fail_unavailable(self) -> None:
        for name, state in self.pool.models.items():
            if state.unavailable and self.router.queued(name) and not self.pool.ready(name):
                self.router.fail_queued(name, UNAVAILABLE, self._unavailable_message(name))

    def _unavailable_message(self, model: str) -> str:
        state = self.pool.models[model]
        return (f"model '{model}' has no worker able to serve: {state.last_error} "
                f"({state.failures} failed start(s); retrying with back-off)")

    def _observe(self, job: Job, msg: Message) -> None:
        self.reporter.answered(job, msg, self.clock())

    # --- signals and shutdown ------------------------------------------------------------

    def _handle_signals(self, signums: list[int]) -> None:
        for signum in signums:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._begin_shutdown(signum)
            elif signum == signal.SIGHUP:
                self.reload()

    def reload(self) -> dict[str, Any]:
        """Re-read the config file and apply it in place; an invalid file changes nothing."""
        if self.config.path is None:
            return {"ok": False, "error": "this supervisor was not started from a file"}
        try:
            new = load_config(self.config.path)
        except ConfigErrors as errors:
            messages = [str(e) for e in errors.errors]
            log.error("config_rejected", path=str(self.config.path), errors=messages)
            return {"ok": False, "error": "config rejected, running config kept:\n" +
                    "\n".join(messages)}
        changes = reloading.plan(self.config, new)
        self.reporter.notifier.reloading(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)
        self._apply_config(reloading.effective(self.config, new), changes)
        if self.zap is not None:
            security.load_clients(self.zap, self.config.supervisor.curve)
        self.reporter.notifier.ready(self.reporter.summary(self.clock(), False))
        log.info("config_reloaded", path=str(self.config.path), **changes.summary())
        if changes.restart_required:
            log.warning("restart_required", settings=changes.restart_required,
                        hint="these settings bind sockets; they take effect on restart")
        return {"ok": True, "result": changes.summary()}

    def _apply_config(self, config: Config, changes: reloading.ReloadPlan) -> None:
        self.config = self.pool.config = config
        self.router.max_queue = config.supervisor.max_queue
        self.monitor.settings = config.supervisor
        for name in changes.added:
            if name in self.pool.models:  # removed earlier, still draining: renew it
                changes.replaced.append(name)
            else:
                self.pool.add_model(name, config.models[name])
        for name in changes.updated + changes.replaced:
            state = self.pool.models[name]
            state.config, state.removed = config.models[name], False
        for name in changes.replaced:
            self.monitor.request(name, None, "reload")
        for name in changes.removed:
            self.pool.models[name].removed = True

    def _begin_shutdown(self, signum: int) -> None:
        now = self.clock()
        if self.shutdown_started is not None:
            log.warning("shutdown_forced", signal=signal.Signals(signum).name)
            self.fast_exit = True
            return
        self.shutdown_started = now
        self.pool.spawning = False
        self.reporter.notifier.stopping()
        log.info("shutdown_started", signal=signal.Signals(signum).name,
                 pending_jobs=self.router.pending(),
                 timeout_seconds=self.config.supervisor.shutdown_timeout)

    def _shutdown_progress(self, now: float) -> None:
        assert self.shutdown_started is not None
        late = now - self.shutdown_started > self.config.supervisor.shutdown_timeout
        if self.router.pending() and not late and not self.fast_exit:
            return
        failed = self.router.fail_everything(
            SHUTTING_DOWN, "the supervisor stopped before this job could finish")
        if failed:
            log.warning("shutdown_jobs_abandoned", count=failed)
        for worker in self.pool.workers.values():
            if self.fast_exit:
                self.pool.kill(worker, "shutdown")
            else:
                self.pool.stop(worker, now, "shutdown")

    def _finished(self) -> bool:
        return (self.shutdown_started is not None and not self.pool.workers
                and not self.router.pending())

    def _close(self) -> None:
        for worker in self.pool.workers.values():
            self.pool.kill(worker, "shutdown")
        for worker in list(self.pool.workers.values()):
            worker.process.wait(timeout=5)
        if self.zap is not None:
            self.zap.close()
        for sock in (self.frontend, self.backend, self.control):
            sock.close(linger=1000)
        self.context.term()
        self.reporter.notifier.close()
        for endpoint in (*self.config.supervisor.endpoints, self.config.supervisor.control,
                         self.config.backend):
            if endpoint.startswith("ipc://"):
                Path(endpoint[len("ipc://"):]).unlink(missing_ok=True)


@functools.lru_cache(maxsize=4)
def _limits(sup: SupervisorSection) -> Limits:
    """The frontend's limits, built once per config (this runs on every message)."""
    return Limits(sup.max_header_size, sup.max_arrays, sup.max_elements)


def _job_id_of(body: list[Frame]) -> bytes:
    if len(body) >= 3:
        raw = body[2].bytes if isinstance(body[2], zmq.Frame) else bytes(body[2])
        if len(raw) <= MAX_JOB_ID:
            return raw
    return b""
