"""Control commands (status, recycle) answered on the control socket."""

from __future__ import annotations

from typing import Any

from supervisor.frontend import specs_to_wire
from supervisor.monitor import Monitor
from supervisor.pool import Pool, WorkerHandle
from supervisor.router import Router


class Controller:
    def __init__(self, pool: Pool, router: Router, monitor: Monitor) -> None:
        self.pool, self.router, self.monitor = pool, router, monitor

    def handle(self, header: dict[str, Any], now: float) -> dict[str, Any]:
        command = header.get("command")
        if command == "status":
            return {"ok": True, "result": self.status(now)}
        return {"ok": False, "error": f"unknown command {command!r}; known: status"}

    def status(self, now: float) -> dict[str, Any]:
        models = {}
        for name, state in self.pool.models.items():
            models[name] = {
                "workers": [self._worker(w, now) for w in self.pool.of_model(name)],
                "configured_workers": state.config.workers,
                "queued": self.router.queued(name),
                "in_flight": sum(1 for j in self.router.inflight.values() if j.model == name),
                "recycles": dict(state.recycles),
                "available": not state.unavailable,
                "last_error": state.last_error,
                "inputs": specs_to_wire(state.inputs),
            }
        return {"models": models}

    def _worker(self, worker: WorkerHandle, now: float) -> dict[str, Any]:
        last = worker.history.last()
        return {"id": worker.id, "pid": worker.pid, "state": worker.state.value,
                "rss": last.memory if last else None,
                "jobs": worker.jobs, "age": round(now - worker.started_at, 3),
                "in_flight": len(self.router.held_by(worker.id)),
                "recycle_reason": worker.recycle_reason}
