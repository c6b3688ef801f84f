"""An HTTP request as a handler sees it, and the answer it gives."""

from __future__ import annotations

import json
from collections.abc import Sequence

import orjson

from supervisor.front.errors import RETRY_AFTER, HttpError
from supervisor.shared.wire import Frame, frame_length

JSON = b"application/json"


class Request:
    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: bytes, path: str, query: str, headers: dict[bytes, bytes],
                 body: bytes) -> None:
        self.method, self.path, self.query = method, path, query
        self.headers = headers  # names in lower case
        self.body = body


class Response:
    """Status, headers and body; the body may be several buffers (a JSON header and binary
    tensors, written without joining them)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(self, status: int, body: Sequence[Frame], content_type: bytes = JSON,
                 headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.status, self.body, self.content_type = status, body, content_type
        self.headers = headers

    @property
    def length(self) -> int:
        return sum(frame_length(part) for part in self.body)


def json_bytes(value: object, finite: bool = True) -> bytes:
    """JSON; with ``finite`` False (a float tensor holds NaN or infinities) NaN, Infinity
    and -Infinity are written as tokens, as TF Serving and Python's json write and read
    them (standard JSON has none; orjson would write null and lose them)."""
    if finite:
        return orjson.dumps(value)
    return json.dumps(value, allow_nan=True, separators=(",", ":")).encode()


def json_shown(value: object) -> str:
    """A value as the request had it, short: "100" (a string) is not 100."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def json_response(value: object, status: int = 200) -> Response:
    return Response(status, [orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)])


def error_response(error: HttpError) -> Response:
    headers = list(error.headers)
    if error.status in RETRY_AFTER:
        headers.append((b"retry-after", RETRY_AFTER[error.status].encode()))
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return Response(error.status, [orjson.dumps({"error": error.message})], JSON, headers)
