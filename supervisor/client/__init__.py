"""The Python client: ``from supervisor.client import Client, JobError``.

Client (blocking, thread-safe), the error classes a reply maps to, and ``control`` for the
control endpoints. ``supervisor.aclient`` has AsyncClient and ``supervisor.testing`` starts
a supervisor for tests.

Rule: imports supervisor.shared only (and pyzmq, numpy, msgpack): ``import
supervisor.client`` loads neither yaml, nor the config stack, nor TensorFlow. The one
exception is testing.py, which writes a config file for the supervisor it starts (yaml),
and which nothing else in the package imports.
"""

from supervisor.client.client import (
    ERRORS,
    BadRequest,
    Client,
    DeadlineExceeded,
    InternalError,
    JobError,
    JobTimeout,
    NoReply,
    Overloaded,
    ShuttingDown,
    Unavailable,
    UnknownModel,
    WorkerCrashed,
    control,
    error_from,
)
from supervisor.client.discovery import resolve_endpoints

__all__ = ["ERRORS", "BadRequest", "Client", "DeadlineExceeded", "InternalError", "JobError",
           "JobTimeout", "NoReply", "Overloaded", "ShuttingDown", "Unavailable", "UnknownModel",
           "WorkerCrashed", "control", "error_from", "resolve_endpoints"]
