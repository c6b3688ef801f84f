"""The socket-free core: every decision the supervisor makes, driven by events.

Events in — a client request, a worker message, a worker started or exited, memory
readings, a tick with the time, shutdown, reload, a control command — and actions out
(``supervisor.core.actions``: reply, send a batch, spawn, stop, kill, sample). The core never
reads a clock, a socket or /proc: the daemon does the I/O and passes the time in. That is
what lets a model-based test (tests/test_core_model.py) drive every interleaving and check
the two promises after each step:

- every admitted request gets exactly one reply (``Router.answer`` is the only exit);
- a worker over its memory limits leaves rotation at the poll that sees it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.config.keys import Config
from supervisor.core import reload_plan as reloading
from supervisor.core.actions import Action, Reply, SampleNow
from supervisor.core.admission import Admission, Refusal, job_id_of
from supervisor.core.batching import next_deadline
from supervisor.core.budget import Budget, CgroupMemory
from supervisor.core.history import Reading, Sample
from supervisor.core.jobs import Job
from supervisor.core.lifecycle import STOP_GRACE, Lifecycle
from supervisor.core.pool import Pool, State, WorkerHandle
from supervisor.core.readiness import STARTING, Report, not_ready_reason
from supervisor.core.reasons import Reason
from supervisor.core.recycling import Recycler
from supervisor.core.router import Router
from supervisor.shared import logs
from supervisor.shared.protocol import (
    BAD_REQUEST,
    ERROR,
    HEARTBEAT,
    INFER,
    INTERNAL_HOP,
    MODELS,
    READY,
    RESULT,
    RESULTS,
    SHUTTING_DOWN,
    TIMEOUT,
    UNAVAILABLE,
    Frame,
    Message,
    ProtocolError,
    TensorSpec,
    decode,
    error_message,
    parse_specs,
    signed_by,
    split_envelope,
    unpack_results,
)

log = logs.get(__name__)

# What a worker may say about itself (its load error, say) that reaches logs and clients.
MAX_WORKER_TEXT = 4096
# After its last worker is stopped or killed, what the daemon's own exit may take: workers
# reaped after SIGKILL (the daemon waits up to 5 s for each straggler), sockets closed.
EXIT_MARGIN = 5.0


class Core:
    def __init__(self, config: Config, rng: random.Random | None = None) -> None:
        self.config = config
        self.outbox: list[Action] = []
        sup = config.supervisor
        self.pool = Pool(config, self.outbox, rng)
        self.router = Router(self.outbox, sup.max_queue, sup.max_queue_bytes)
        self.budget = Budget()  # the container's memory: read by the daemon every poll
        self.lifecycle = Lifecycle(self.pool, self.router, self.outbox, self.budget)
        self.recycler = Recycler(self.pool, self.router, self.lifecycle, self.budget)
        self.admission = Admission(sup)
        self.next_poll = 0.0
        self.shutdown_started: float | None = None
        self.fast_exit = False
        self.strangers = 0  # backend messages dropped since the last backend_stranger event
        self.next_stranger_log = 0.0
        # The readiness report the daemon last published (core/readiness.py): the `models`
        # reply carries its verdict, so an HTTP front answers /v2/health/ready from it.
        self.published: Report = STARTING

    def take(self) -> list[Action]:
        """The actions decided so far, in order; the daemon performs them."""
        actions = self.outbox[:]
        self.outbox.clear()
        return actions

    # --- clients -------------------------------------------------------------------------

    def request(self, frames: Sequence[Frame], now: float) -> None:
        """A message from a client (routing envelope first). Whatever it holds, it gets one
        answer: a job is admitted (and answered later) or refused here."""
        self.requests([frames], now)

    def requests(self, messages: Sequence[Sequence[Frame]], now: float) -> None:
        """Client messages that arrived together (read in one pass over the socket): each
        admitted or refused in order, then one dispatch per model they named. Dispatching
        after each one sent the first job of a burst alone to an idle worker while its
        mates, already read, waited for the next free worker: under load nearly half the
        batches were single jobs, each paying the model's whole per-call cost."""
        models: dict[str, None] = {}  # in order of arrival
        for frames in messages:
            model = self._request(frames, now)
            if model is not None:
                models[model] = None
        for model in models:
            self.dispatch(model, now)

    def _request(self, frames: Sequence[Frame], now: float) -> str | None:
        """One message admitted (its model returned) or answered at once (None)."""
        envelope, body = split_envelope(frames)
        try:
            job = self._admit(envelope, body, now)
        except Refusal as refusal:
            self._refuse(envelope, body, refusal.code, str(refusal), refusal.label)
            return None
        except Exception as exc:  # a field nobody foresaw: still the client's problem
            log.exception("request_not_understood")
            self._refuse(envelope, body, BAD_REQUEST, f"malformed request "
                         f"({type(exc).__name__})")
            return None
        if job is not None and self.router.submit(job):
            state = self.pool.models[job.model]
            state.traffic.admitted(job.inputs, state.inputs)  # for `tfsupervisor tune`
            return job.model
        return None

    def _admit(self, envelope: list[Frame], body: list[Frame], now: float) -> Job | None:
        msg = self.admission.decode(body)
        if msg.kind == MODELS:
            self.outbox.append(Reply(envelope, Message(MODELS, msg.job_id, self.models())))
            return None
        if msg.kind != INFER:
            raise Refusal(BAD_REQUEST, f"clients may send infer or models, not {msg.kind!r}")
        model = msg.header.get("model")
        label = model if isinstance(model, str) and model in self.pool.models else "-"
        try:
            if self.shutdown_started is not None:
                raise Refusal(SHUTTING_DOWN, "the supervisor is shutting down; retry elsewhere")
            job = self.admission.job(msg, envelope, self.pool.models, now, body[3])
            state = self.pool.models[job.model]
            if state.unavailable and not self.pool.ready(job.model):
                raise Refusal(UNAVAILABLE, self._unavailable(job.model))
        except Refusal as refusal:
            refusal.label = label
            raise
        return job

    def _refuse(self, envelope: list[Frame], body: list[Frame], code: str, message: str,
                label: str = "-") -> None:
        """An answer at admission, under a served model's name when it names one (names
        clients make up never become metric labels)."""
        self.outbox.append(Reply(envelope, error_message(job_id_of(body), code, message),
                                 None, label))

    def models(self) -> dict[str, Any]:
        models = {}
        for name, state in self.pool.models.items():
            if state.removed:
                continue
            models[name] = {"inputs": _wire(state.inputs), "outputs": _wire(state.outputs),
                            "ready_workers": len(self.pool.ready(name)),
                            "workers": state.config.workers,
                            "available": self.pool.available(name),
                            "failing_to_start": state.unavailable,
                            "kind": state.config.source[0], "version": state.version}
        stopping = self.shutdown_started is not None
        reason = not_ready_reason({**self.published, "stopping": stopping}, None, errors=False)
        return {"models": models,
                "server": {"ready": reason is None, "reason": reason, "stopping": stopping}}

    def queue_wake(self, now: float, next_housekeeping: float) -> float:
        """When the queues next need the loop (math.inf: never): a partial batch that stops
        waiting, or a queued job's deadline, the earliest of any queued job's (Expiries:
        this runs on every wake-up, so no queue is scanned).

        A batch wait already over is left to the next free worker, whose answer wakes the
        loop (waking for it would spin while every worker is busy). A deadline already
        passed is not: it wakes the loop at the next housekeeping, which answers it. That
        wake is kept even when it lands just before the housekeeping is due: skipping it
        would leave the expired job waiting for the next memory poll, up to a poll interval
        late."""
        wake = math.inf
        for model, state in self.pool.models.items():
            queue = self.router.queues.get(model)
            if not queue:
                continue
            batch_ends = next_deadline(queue, self.router.batch_policy(
                model, state.config.batch_policy))
            if batch_ends is not None and (batch_ends > now or self._idle(model)):
                # over, with a worker idle: waits_over sends it on this very wake
                wake = min(wake, max(batch_ends, now))
            expires = self.router.expiries.earliest(model)
            if expires is not None:
                wake = min(wake, max(expires, next_housekeeping))
        return wake

    def waits_over(self, now: float) -> None:
        """Partial batches whose wait is over, sent to idle workers: on every wake-up of the
        loop, not only at housekeeping. The loop wakes when a wait ends (queue_wake); one
        that ended between two housekeepings was left until the next job or memory poll,
        while the clients whose jobs it held waited (measured: 3 clients on one worker fell
        from ~1,000 to ~50 jobs/s under the adaptive wait)."""
        for model, state in self.pool.models.items():
            queue = self.router.queues.get(model)
            if not queue or not self._idle(model):  # busy workers: their answers dispatch
                continue
            ends = next_deadline(queue, self.router.batch_policy(model,
                                                                 state.config.batch_policy))
            if ends is not None and ends <= now:
                self.dispatch(model, now)

    def _idle(self, model: str) -> bool:
        """A ready worker of the model holds no job (the router's rule for an idle one)."""
        return any(w.id not in self.router.held for w in self.pool.ready(model))

    def dispatch(self, model: str, now: float) -> None:
        state = self.pool.models.get(model)
        if state is not None and self.router.queues.get(model):
            ready = [(w.id, w.jobs) for w in self.pool.ready(model)]
            self.router.dispatch(model, ready, now, state.config.batch_policy)

    # --- workers -------------------------------------------------------------------------

    def spawned(self, worker_id: str, pid: int, secret: str) -> None:
        worker = self.pool.workers.get(worker_id)
        if worker is not None:
            worker.pid, worker.secret = pid, secret
            log.info("worker_started", model=worker.model, worker=worker_id, pid=pid)

    def exited(self, worker_id: str, code: int, now: float, error: str | None = None) -> None:
        """A worker process is gone (``error``: why it could not even be started)."""
        worker = self.pool.workers.get(worker_id)
        if worker is not None:
            if error is not None and self.pool.of_current_settings(worker):
                state = self.pool.models[worker.model]
                state.last_error, state.last_error_of = error[:MAX_WORKER_TEXT], worker.id
            self.lifecycle.exited(worker, code, now)
            self.dispatch(worker.model, now)

    def stalled(self, seconds: float, now: float) -> None:
        """The daemon's loop did not run for ``seconds`` (a call that blocked, the process
        stopped, the host suspended). Heartbeats sent meanwhile may still be unread in the
        socket, so the hung-worker clock does not count that time: silence is judged on
        time the supervisor was there to hear."""
        if not (seconds > 0):  # NaN too
            return
        for worker in self.pool.workers.values():
            worker.last_heartbeat = min(now, worker.last_heartbeat + seconds)

    def worker_message(self, identity: bytes, frames: Sequence[Frame], now: float) -> None:
        """A message on the backend. Heartbeats come from the worker's second socket and
        name the worker; everything else is known by the socket identity it was spawned
        with."""
        sender = self.pool.workers.get(identity.decode("utf-8", "replace"))
        try:
            msg = decode(frames, INTERNAL_HOP)
        except ProtocolError as exc:
            if sender is not None:
                self._broke(sender, f"undecodable message: {exc}", now)
            return
        if msg.kind == HEARTBEAT:
            named = self.pool.workers.get(str(msg.header.get("worker")))
            if named is not None and signed_by(msg, named.secret):
                self.pool.heartbeat(named, msg.header, now)
            else:
                self._stranger(identity, msg, now)
            return
        if sender is None or not signed_by(msg, sender.secret):
            self._stranger(identity, msg, now)  # gone, or never spawned as what it says
            return
        if msg.kind == READY:
            self._ready(sender, msg.header, now)
        elif msg.kind == RESULTS:
            self._results(sender, msg, now)
        elif msg.kind == ERROR and self.pool.of_current_settings(sender):
            state = self.pool.models[sender.model]
            state.last_error = str(msg.header.get("message"))[:MAX_WORKER_TEXT]
            state.last_error_of = sender.id

    def _stranger(self, identity: bytes, msg: Message, now: float) -> None:
        """A backend message without its worker's spawn secret: dropped, and logged at most
        once a minute (a stranger must not flood the log either)."""
        self.strangers += 1
        if now >= self.next_stranger_log:
            self.next_stranger_log = now + 60.0
            log.warning("backend_stranger", identity=identity[:64].decode("utf-8", "replace"),
                        kind=msg.kind.decode("ascii", "replace"), dropped=self.strangers)
            self.strangers = 0

    def _ready(self, worker: WorkerHandle, header: dict[str, Any], now: float) -> None:
        if worker.state is not State.STARTING:
            return  # told to stop meanwhile, or said twice: it never turns ready again
        try:
            inputs = _specs(header.get("inputs"), "inputs")
            outputs = _specs(header.get("outputs"), "outputs")
        except ProtocolError as exc:
            self._broke(worker, f"bad ready message: {exc}", now)
            return
        self.pool.mark_ready(worker, header, now)
        state = self.pool.models[worker.model]
        state.inputs = inputs if inputs is not None else state.inputs
        state.outputs = outputs if outputs is not None else state.outputs
        state.serving_dims = worker.pad_dims
        version = header.get("version")
        state.version = version if type(version) is int and 0 <= version < 2**63 else None
        log.info("worker_ready", model=worker.model, worker=worker.id, pid=worker.pid,
                 warmup_seconds=worker.warmup_seconds, **padding_checked(worker, inputs))
        # Judged before its first job: a fresh worker over max_memory never takes one.
        self.outbox.append(SampleNow((worker.id,)))

    def _results(self, worker: WorkerHandle, msg: Message, now: float) -> None:
        try:
            replies, leaving = unpack_results(msg)
        except ProtocolError as exc:
            self._broke(worker, f"bad results message: {exc}", now)
            return
        for reply in replies:
            try:
                job = self.router.complete(int(reply.job_id), worker.id)
            except ValueError:
                continue
            if job is not None:
                worker.jobs += 1
                self.router.answer(job, Message(reply.kind, job.client_job_id, reply.header,
                                                reply.arrays, reply.packed))
        if self.router.held_by(worker.id):  # one batch at a time: all of it is answered
            self._broke(worker, "results left jobs of its batch unanswered", now)
        elif leaving:
            self.lifecycle.leaving_by_itself(worker, now)
        # Its call's time, for the adaptive wait; a worker that served none stays cold.
        self.router.batch_done(worker.id, now, any(r.kind == RESULT for r in replies))
        self.dispatch(worker.model, now)

    def _broke(self, worker: WorkerHandle, why: str, now: float) -> None:
        """A worker that speaks garbage cannot be trusted with jobs: killed, jobs requeued."""
        log.error("worker_protocol_error", model=worker.model, worker=worker.id,
                  pid=worker.pid, error=why[:MAX_WORKER_TEXT])
        self.lifecycle.kill(worker, Reason.PROTOCOL_ERROR, now)

    # --- memory --------------------------------------------------------------------------

    def poll_due(self, now: float) -> list[tuple[str, int, str]] | None:
        """(worker id, pid, memory metric) of the workers to read, when a poll is due."""
        if now < self.next_poll:
            return None
        self.next_poll = now + self.config.supervisor.poll_interval
        return [(w.id, w.pid, self.pool.models[w.model].config.policy.memory_metric)
                for w in self.pool.workers.values()
                if w.pid is not None and w.state is not State.GONE]

    def memory(self, cgroup: CgroupMemory | None, host_available: int | None,
               poll: bool = True) -> None:
        """The container's memory (its cgroup, None outside one or when unreadable) and the
        host's available memory, read by the daemon at every poll (``poll``) and when a
        worker died of a SIGKILL it did not send (its OOM-kill counter may name the kernel)."""
        self.budget.update(cgroup, host_available, poll)

    def cpu_pressure(self, some_us: int | None, now: float) -> None:
        """The kernel's CPU pressure (PSI ``some`` total, microseconds; None where it cannot
        be read), read by the daemon at every poll: the adaptive batch wait asks whether
        the cores are contended."""
        self.router.cpu.read(some_us, now)

    def samples(self, now: float, readings: Mapping[str, Reading], poll: bool = True) -> None:
        """Memory readings: recorded, then judged (every worker on a poll, only these
        otherwise, so a trend's confirmations count polls); on a poll, memory pressure
        (``Core.memory`` gave the headroom before)."""
        sampled = []
        for worker_id, reading in readings.items():
            worker = self.pool.workers.get(worker_id)
            if worker is not None:
                worker.history.add(Sample(now, worker.jobs, reading.memory, reading.vram,
                                          worker.probes, reading.children))
                if reading.private is not None:
                    worker.private = reading.private
                    worker.shared = max(0, reading.memory - reading.private)
                sampled.append(worker)
        self.recycler.judge(list(self.pool.workers.values()) if poll else sampled, now)
        if poll:
            self.budget.polled_at(now)
            self.recycler.memory_pressure(now)

    # --- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Housekeeping: ways out, time limits, unavailable models, shutdown, spawning."""
        self.lifecycle.progress(now)
        self._job_timeouts(now)
        self._fail_unavailable()
        self.router.expire(now)
        if self.shutdown_started is not None:
            self._shutdown_progress(now)
        self.recycler.make_room(now)
        self.pool.replenish(now, self.recycler.fits)
        for model in list(self.pool.models):
            self.dispatch(model, now)

    def _job_timeouts(self, now: float) -> None:
        """A job past policy.job_timeout: answered 'timeout', its worker killed (TF cannot be
        interrupted safely), the worker's other jobs requeued."""
        timeouts = {name: s.config.policy.job_timeout for name, s in self.pool.models.items()
                    if s.config.policy.job_timeout is not None}
        for job in self.router.overdue(now, timeouts):
            if job.worker is None or not self.router.holds(job.worker, job):
                # A batch mate was answered 'timeout' and their worker killed: the kill
                # requeued this job (or failed it for its tries), as documented; it must not
                # be answered 'timeout' too (the list was taken before the kill).
                continue
            worker = self.pool.workers.get(job.worker)
            self.router.fail(job, TIMEOUT, f"the job ran longer than job_timeout "
                             f"({timeouts[job.model]:g}s); its worker was killed")
            if worker is not None:
                log.warning("job_timeout", model=job.model, worker=worker.id, pid=worker.pid,
                            seconds=round(now - (job.dispatched_at or now), 2))
                self.lifecycle.kill(worker, Reason.JOB_TIMEOUT, now)

    def _fail_unavailable(self) -> None:
        for name, state in self.pool.models.items():
            if state.unavailable and self.router.queued(name) and not self.pool.ready(name):
                self.router.fail_queued(name, UNAVAILABLE, self._unavailable(name))

    def _unavailable(self, model: str) -> str:
        state = self.pool.models[model]
        return (f"model '{model}' has no worker able to serve: {state.last_error} "
                f"({state.failures} failed start(s); retrying with back-off)")

    # --- operator ------------------------------------------------------------------------

    def recycle(self, model: str, worker_id: str | None) -> list[str]:
        return self.recycler.request(model, worker_id, Reason.MANUAL)

    def roll(self, model: str) -> list[str]:
        """Replace a model's workers, one at a time, because what they load changed on
        disk (a new version directory): a reload's recycle, for that model alone."""
        return self.recycler.request(model, None, Reason.RELOAD)

    def shutdown(self, now: float, signal_name: str) -> None:
        """Drain and stop. A second SIGINT (Ctrl-C again: a person who will not wait) forces
        a fast exit; a second SIGTERM does not: the kubelet sends one after the preStop hook
        that already began the drain, and a service manager may repeat its own."""
        if self.shutdown_started is not None:
            if signal_name == "SIGINT":
                log.warning("shutdown_forced", signal=signal_name)
                self.fast_exit = True
            else:
                log.info("shutdown_under_way", signal=signal_name,
                         pending_jobs=self.router.pending())
            return
        self.shutdown_started = now
        self.pool.spawning = False
        log.info("shutdown_started", signal=signal_name, pending_jobs=self.router.pending(),
                 timeout_seconds=self.config.supervisor.shutdown_timeout)

    def _shutdown_progress(self, now: float) -> None:
        assert self.shutdown_started is not None  # only called while shutting down
        late = now - self.shutdown_started > self.config.supervisor.shutdown_timeout
        if self.router.pending() and not late and not self.fast_exit:
            return
        # Queued jobs never ran: a client may safely send them elsewhere. Running ones may
        # have had effects: 'timeout', which clients do not retry on their own.
        queued = sum(self.router.fail_queued(model, SHUTTING_DOWN, "the supervisor stopped "
                                             "before this job could run")
                     for model in list(self.router.queues))
        running = 0
        for job in list(self.router.in_flight()):
            self.router.fail(job, TIMEOUT, "the supervisor stopped (shutdown_timeout) before "
                             "this running job finished; it may have run in part")
            running += 1
        if queued or running:
            log.warning("shutdown_jobs_abandoned", queued=queued, running=running)
        for worker in list(self.pool.workers.values()):
            if self.fast_exit:
                self.lifecycle.kill(worker, Reason.SHUTDOWN, now)
            else:
                self.lifecycle.stop(worker, Reason.SHUTDOWN, now)

    def shutdown_deadline(self) -> float | None:
        """When this shutdown is over at the latest (None while not shutting down): jobs get
        shutdown_timeout, then every worker is stopped and SIGKILLed after STOP_GRACE, then
        the daemon exits within EXIT_MARGIN. systemd is told to wait this long, no longer."""
        if self.shutdown_started is None:
            return None
        return (self.shutdown_started + self.config.supervisor.shutdown_timeout + STOP_GRACE
                + EXIT_MARGIN)

    @property
    def finished(self) -> bool:
        return (self.shutdown_started is not None and not self.pool.workers
                and not self.router.pending())

    def reload(self, new: Config, now: float,
               code: Mapping[str, str | None] | None = None) -> reloading.ReloadPlan:
        """Apply a validated config in place (the daemon read and validated the file);
        ``code``: each model's code fingerprint on disk, read with it."""
        changes = reloading.plan(self.config, new)
        if code is not None:
            changes.code_changed = reloading.code_changed(
                changes, {n: s.code for n, s in self.pool.models.items()}, code)
        config = reloading.effective(self.config, new)
        self.config = self.pool.config = config
        sup = config.supervisor
        self.router.max_queue, self.router.max_queue_bytes = sup.max_queue, sup.max_queue_bytes
        self.admission.configure(sup)
        for name in changes.added:
            if name in self.pool.models:  # removed earlier, still draining: renew it
                changes.replaced.append(name)
            else:
                self.pool.add_model(name, config.models[name])
        for name in changes.updated + changes.replaced:
            state = self.pool.models[name]
            state.config, state.removed = config.models[name], False
        for name, fingerprint in (code or {}).items():
            if name in self.pool.models:  # what new workers start from, from now on
                self.pool.models[name].code = fingerprint
        for name in changes.replaced + changes.code_changed:
            self.pool.models[name].generation += 1
            self._retry_at_once(name)
            self.recycler.request(name, None, Reason.RELOAD)
        # A reload is also how an operator says "fixed it": a model still failing to start
        # is tried again now, not at the end of its back-off.
        changes.retried = [name for name, state in self.pool.models.items()
                           if state.failures and not state.removed
                           and name not in changes.replaced + changes.code_changed
                           and name in config.models]
        for name in changes.retried:  # files it points at may be fixed: a new generation
            self.pool.models[name].generation += 1
            self._retry_at_once(name)
        for name in changes.removed:
            if name in self.pool.models:
                self.pool.models[name].removed = True
        return changes

    def _retry_at_once(self, name: str) -> None:
        """New settings (or fixed files) deserve a try at once: the last failures say nothing
        of them, and a stale error would read as this reload's."""
        state = self.pool.models[name]
        state.failures, state.last_error, state.backoff_until = 0, None, 0.0


def _specs(raw: object, field: str) -> list[TensorSpec] | None:
    return None if raw is None else parse_specs(raw, allow_none=True, field=field)


def _wire(specs: list[TensorSpec] | None) -> list[dict[str, object]] | None:
    return None if specs is None else [s.to_wire() for s in specs]


def padding_checked(worker: WorkerHandle, inputs: object) -> dict[str, list[str]]:
    """The padded dimensions this ready worker proved harmless at load (a worker whose
    check fails never turns ready; one without declared inputs cannot run it), for its
    worker_ready event: a check that passed leaves a trace in the log."""
    if inputs is None:
        return {}
    checked = [d.name for d in worker.pad_dims if d.pads and d.verify
               and len(d.sizes) < d.sizes[-1]]  # else every length is a size: never padded
    return {"padding_checked": checked} if checked else {}
