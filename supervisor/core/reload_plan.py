"""Configuration reload: what changed between two configs, and how to apply it in place.

- Policy and worker-count changes apply at once; nothing restarts for them.
- Added models start; removed models stop taking requests, finish their queue, drain, stop.
- Models whose source, options, environment, TF or probe settings changed get new workers,
  worker by worker, replacement first (the ordinary recycle path, reason "reload"); so do
  models whose code changed on disk beside an unchanged config (its fingerprint).
- The sockets (endpoints, control, runtime dir, message size) are kept: changing them takes
  a restart, and the reload says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.config.keys import Config, ModelConfig

# Model settings a running worker cannot take on: they need new workers.
WORKER_FIELDS = ("saved_model", "keras", "handler", "signature", "options", "env", "tf",
                 "probes", "padding", "warmup_batch_sizes")
# Supervisor settings bound into sockets at start.
RESTART_FIELDS = ("endpoints", "control", "runtime_dir", "max_message_size", "metrics",
                  "curve", "socket_group")


@dataclass
class ReloadPlan:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # new workers needed
    updated: list[str] = field(default_factory=list)  # policy / worker count, in place
    code_changed: list[str] = field(default_factory=list)  # same settings, new code on disk
    settings: list[str] = field(default_factory=list)  # supervisor settings now in effect
    restart_required: list[str] = field(default_factory=list)
    # Models whose workers were failing to start, started again at once: the operator may
    # have fixed what the config points at (a model file, a package) without changing it.
    retried: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}


def plan(old: Config, new: Config) -> ReloadPlan:
    result = ReloadPlan()
    for name, model in new.models.items():
        before = old.models.get(name)
        if before is None:
            result.added.append(name)
        elif _worker_fields(before) != _worker_fields(model):
            result.replaced.append(name)
        elif before != model:
            result.updated.append(name)
    result.removed = [name for name in old.models if name not in new.models]
    result.settings = [f"supervisor.{f.name}" for f in dataclasses.fields(old.supervisor)
                       if f.name not in RESTART_FIELDS and
                       getattr(old.supervisor, f.name) != getattr(new.supervisor, f.name)]
    result.restart_required = [f"supervisor.{key}" for key in RESTART_FIELDS
                               if getattr(old.supervisor, key) != getattr(new.supervisor, key)]
    if old.runtime_dir != new.runtime_dir and "supervisor.runtime_dir" not in \
            result.restart_required:
        result.restart_required.append("supervisor.runtime_dir")
    return result


def code_changed(changes: ReloadPlan, running: Mapping[str, str | None],
                 on_disk: Mapping[str, str | None]) -> list[str]:
    """Models kept with their settings whose code on disk is not what their workers were
    started from (a fingerprint unknown before or now, say a read that timed out or a
    handler module not found, is no change: `status` says unknown)."""
    renewed = {*changes.added, *changes.replaced, *changes.removed}
    return [name for name, code in on_disk.items() if name not in renewed and code is not None
            and running.get(name) is not None and running.get(name) != code]


def effective(old: Config, new: Config) -> Config:
    """The new config with the socket settings of the running one kept."""
    kept = {key: getattr(old.supervisor, key) for key in RESTART_FIELDS}
    return dataclasses.replace(new, supervisor=dataclasses.replace(new.supervisor, **kept),
                               runtime_dir=old.runtime_dir)


def _worker_fields(model: ModelConfig) -> tuple[Any, ...]:
    return tuple(getattr(model, key) for key in WORKER_FIELDS)
