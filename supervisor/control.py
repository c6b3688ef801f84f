"""Control commands (status, recycle, reload) answered on the control socket."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supervisor.core import Core
from supervisor.pool import WorkerHandle
from supervisor.protocol import TensorSpec
from supervisor.sampling import read_memory


class Controller:
    def __init__(self, core: Core, reload: Callable[[], dict[str, Any]],
                 serving: Callable[[], bool]) -> None:
        self.core = core
        self.reload = reload
        self.serving = serving

    def handle(self, header: dict[str, Any], now: float) -> dict[str, Any]:
        command = header.get("command")
        if command == "status":
            return {"ok": True, "result": self.status(now)}
        if command == "recycle":
            return self.recycle(header.get("model"), header.get("worker"))
        if command == "reload":
            return self.reload()
        return {"ok": False, "error": f"unknown command {str(command)[:64]!r}; known: status, "
                "recycle, reload"}

    def recycle(self, model: object, worker: object) -> dict[str, Any]:
        if not isinstance(model, str) or not (worker is None or isinstance(worker, str)):
            return {"ok": False, "error": "recycle needs a model name and optionally a worker id"}
        try:
            scheduled = self.core.recycle(model, worker)
        except KeyError as exc:
            return {"ok": False, "error": str(exc.args[0])}
        return {"ok": True, "result": {"scheduled": scheduled}}

    def status(self, now: float) -> dict[str, Any]:
        pool, router = self.core.pool, self.core.router
        models = {}
        for name, state in pool.models.items():
            models[name] = {
                "workers": [self._worker(w, now) for w in pool.of_model(name)],
                "configured_workers": state.config.workers,
                "queued": router.queued(name),
                "in_flight": sum(1 for j in router.in_flight() if j.model == name),
                "recycles": dict(state.recycles),
                "last_recycle": _last_recycle(state.last_recycle, now),
                "memory_metric": state.config.policy.memory_metric,
                "max_memory": state.config.policy.max_memory,
                "policy_too_tight": state.churn >= 2,
                "available": not state.unavailable,
                "last_error": state.last_error,
                "inputs": _wire(state.inputs),
                "batches": self._batches(name, state.config.batching.max_batch_size),
            }
        return {"serving": self.serving(), "models": models}

    def _batches(self, model: str, max_batch_size: int) -> dict[str, Any]:
        count, rows = self.core.router.batches.get(model, (0, 0))
        return {"max_batch_size": max_batch_size, "sent": count,
                "mean_rows": round(rows / count, 2) if count else None}

    def _worker(self, worker: WorkerHandle, now: float) -> dict[str, Any]:
        last = worker.history.last()
        a = worker.assessment
        return {"id": worker.id, "pid": worker.pid, "state": worker.state.value,
                "rss": read_memory(worker.pid, "rss") if worker.pid else None,
                "memory": last.memory if last else None,
                "vram": last.vram if last else None,
                "tf_memory": worker.tf_memory,
                "jobs": worker.jobs, "age": round(now - worker.started_at, 3),
                "in_flight": len(self.core.router.held_by(worker.id)),
                "warmed_up": a.warmed_up, "baseline": a.baseline,
                "growth_per_1k_jobs": a.growth_per_1k_jobs,
                "growth_per_hour": a.growth_per_hour,
                "seconds_to_limit": a.seconds_to_limit,
                "recycle_reason": str(worker.reason) if worker.reason else None}


def _wire(specs: list[TensorSpec] | None) -> list[dict[str, object]] | None:
    return None if specs is None else [s.to_wire() for s in specs]


def _last_recycle(last: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
    if last is None:
        return None
    return {"reason": last["reason"], "worker": last["worker"],
            "seconds_ago": round(now - last["at"], 1)}
