"""The errors a job can end in, one class per protocol error code (docs/protocol.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.shared import protocol


class JobError(Exception):
    """A job answered with an error. ``code`` is one of the protocol's error codes."""

    code = "error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(f"{code or self.code}: {message}")
        self.message = message
        if code is not None:
            self.code = code


class UnknownModel(JobError):
    code = protocol.UNKNOWN_MODEL


class BadRequest(JobError):
    code = protocol.BAD_REQUEST


class Overloaded(JobError):
    code = protocol.OVERLOADED


class DeadlineExceeded(JobError):
    code = protocol.DEADLINE_EXCEEDED


class WorkerCrashed(JobError):
    code = protocol.WORKER_CRASHED


class JobTimeout(JobError):
    code = protocol.TIMEOUT


class ShuttingDown(JobError):
    code = protocol.SHUTTING_DOWN


class Unavailable(JobError):
    code = protocol.UNAVAILABLE


class InternalError(JobError):
    code = protocol.INTERNAL


class NoReply(JobError):
    """No answer within the client's timeout: the supervisor is down or unreachable, or the
    message was over its size limit (which ZeroMQ drops without a word)."""

    code = "no_reply"


ERRORS: dict[str, type[JobError]] = {cls.code: cls for cls in (
    UnknownModel, BadRequest, Overloaded, DeadlineExceeded, WorkerCrashed, JobTimeout,
    ShuttingDown, Unavailable, InternalError)}


def error_from(header: Mapping[str, Any]) -> JobError:
    code = str(header.get("code", protocol.INTERNAL))
    message = str(header.get("message", ""))
    return ERRORS.get(code, JobError)(message, code)
