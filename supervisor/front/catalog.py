"""What the daemon serves, as a front last heard it: the models (specs, ready workers) and
the server's readiness, from the daemon's `models` reply, asked every REFRESH seconds.

Health and metadata requests are answered from this, never by asking the daemon per
request: a flood of probes costs the daemon nothing, and a probe never waits behind jobs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from supervisor.client.aclient import AsyncClient
from supervisor.client.errors import JobError
from supervisor.front.errors import HttpError

# How often the daemon is asked (seconds), and how old its last answer may be before the
# front stops trusting it (the daemon is stuck or gone: not ready).
REFRESH = 0.1
STALE = 3.0
# Every model is served as this version unless the daemon names one.
DEFAULT_VERSION = "1"
# What a model's source is, as the Open Inference Protocol's `platform` names it.
PLATFORMS = {"saved_model": "tensorflow_savedmodel", "keras": "tensorflow_keras",
             "handler": "python"}


class Catalog:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.models: dict[str, dict[str, Any]] = {}
        self.server: dict[str, Any] = {"ready": False, "reason": "starting: the supervisor "
                                       "has not answered this front yet", "stopping": False}
        self.heard_at: float | None = None

    async def run(self) -> None:
        """Ask the daemon, forever (cancelled when the front stops)."""
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH)

    async def refresh(self) -> None:
        try:
            reply = await self.client.call_models(timeout=max(1.0, STALE / 2))
        except JobError:
            return  # silence: the answer ages, and past STALE the front is not ready
        models, server = reply.get("models"), reply.get("server")
        if isinstance(models, dict):
            self.models = models
        if isinstance(server, dict):
            self.server = server
        self.heard_at = time.monotonic()

    def not_ready(self) -> str | None:
        """Why the server is not ready (the daemon's own rule), None when it is."""
        if self.heard_at is None or time.monotonic() - self.heard_at > STALE:
            return "the supervisor does not answer this front"
        if self.server.get("ready"):
            return None
        return str(self.server.get("reason") or "not ready")

    def model(self, name: str, version: str | None = None) -> dict[str, Any]:
        """A served model's entry, or 404 naming what is served."""
        entry = self.models.get(name)
        if entry is None:
            served = ", ".join(sorted(self.models)[:20]) or "no model"
            raise HttpError(404, f"unknown model {name[:64]!r} (served: {served})")
        if version is not None and version != version_of(entry):
            raise HttpError(404, f"model {name[:64]!r} has no version {version[:32]!r} "
                            f"(serving version {version_of(entry)})")
        return entry

    def model_ready(self, name: str) -> bool:
        entry = self.models.get(name)
        return bool(entry and entry.get("ready_workers")) and self.not_ready_alive()

    def not_ready_alive(self) -> bool:
        """The daemon answers and is not stopping."""
        return self.heard_at is not None and time.monotonic() - self.heard_at <= STALE \
            and not self.server.get("stopping")


def version_of(entry: dict[str, Any]) -> str:
    version = entry.get("version")
    return str(version) if version is not None else DEFAULT_VERSION


def platform_of(entry: dict[str, Any]) -> str:
    return PLATFORMS.get(str(entry.get("kind")), "tensorflow")


def not_loaded(name: str, entry: dict[str, Any]) -> str:
    """Why a model's inputs are not known yet."""
    if entry.get("failing_to_start"):
        return (f"unavailable: model {name!r} cannot start its workers (`tfsupervisor "
                "status` says why); its inputs are known once one is ready")
    return f"model {name!r} has not loaded yet: its inputs are known once a worker is ready"
