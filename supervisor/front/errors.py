"""Errors as HTTP answers: `{"error": "one line"}` with the status the ecosystem expects
(the shape both the Open Inference Protocol and TF Serving's REST API use)."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.client.errors import JobError
from supervisor.shared import protocol

# The daemon's error codes (docs/protocol.md) as HTTP statuses.
STATUS = {
    protocol.UNKNOWN_MODEL: 404,
    protocol.BAD_REQUEST: 400,
    protocol.OVERLOADED: 429,
    protocol.DEADLINE_EXCEEDED: 504,
    protocol.TIMEOUT: 504,
    protocol.SHUTTING_DOWN: 503,
    protocol.UNAVAILABLE: 503,
    protocol.WORKER_CRASHED: 500,
    protocol.INTERNAL: 500,
    "no_reply": 504,  # the daemon did not answer within the request's deadline
}
# Seconds a client should wait before trying again, sent as Retry-After with 429 and 503.
RETRY_AFTER = {429: "1", 503: "1"}
# An error line is cut at this many characters (a model's exception can be long).
MAX_MESSAGE = 1000


class HttpError(Exception):
    """An answer other than 200, with one line for the client."""

    def __init__(self, status: int, message: str,
                 headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message[:MAX_MESSAGE]
        self.headers = headers  # e.g. Allow with a 405


def from_job(error: JobError) -> HttpError:
    """The daemon's error for a job, as an HTTP error with its code kept in the text."""
    status = STATUS.get(error.code, 500)
    return HttpError(status, f"{error.code}: {error.message}" if error.message else error.code)
