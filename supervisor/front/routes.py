"""Paths to handlers: the Open Inference Protocol v2 under /v2, TF Serving under /v1.

Each route has a label (its template) for metrics: a client's made-up path never becomes a
label. Model names in paths are percent-decoded.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

from supervisor.client.aclient import AsyncClient
from supervisor.front import oip, tfserving
from supervisor.front.catalog import Catalog
from supervisor.front.errors import HttpError
from supervisor.front.messages import Request, Response, error_response, json_response

Handler = Callable[[Request], Awaitable[Response]]
# Routes a load balancer or kubelet probes without a token.
OPEN = ("/v2/health/live", "/v2/health/ready")
GET, POST = b"GET", b"POST"


@dataclass
class Front:
    """What every request may use: the daemon (as a client), what it serves, the settings."""

    client: AsyncClient
    catalog: Catalog
    default_timeout: float
    token: bytes | None
    version: str
    draining: bool = False


async def answer(front: Front, request: Request) -> tuple[str, Response]:
    """(route label, response) for a request; errors become their response, under the
    route they were found on ("-": none was)."""
    route = "-"
    try:
        route, call = resolve(front, request)
        if front.token is not None and route not in OPEN and \
                not authorized(front.token, request.headers):
            raise HttpError(401, "missing or wrong bearer token (Authorization: Bearer "
                            "TOKEN)")
        return route, await call(request)
    except HttpError as error:
        return route, error_response(error)


def resolve(front: Front, request: Request) -> tuple[str, Handler]:
    """The route a request names and its handler, or an HttpError (404, 405)."""
    path, method = request.path, request.method
    parts = path.split("/")
    if path.startswith("/v2"):
        return _v2(front, parts, method)
    if path.startswith("/v1/models/"):
        return _v1(front, parts, method)
    raise HttpError(404, f"no such route: {path[:100]} (the Open Inference Protocol is under "
                    "/v2, TF Serving's REST API under /v1/models)")


def _v2(front: Front, parts: list[str], method: bytes) -> tuple[str, Handler]:
    catalog = front.catalog
    tail = parts[2:]
    if tail in ([], [""]):
        return _only(method, GET, "/v2", lambda r: _ready(oip.server_metadata(front.version)))
    if tail == ["health", "live"]:
        return _only(method, GET, "/v2/health/live", lambda r: _ready(json_response({"live":
                                                                                 True})))
    if tail == ["health", "ready"]:
        return _only(method, GET, "/v2/health/ready", lambda r: _ready(_server_ready(catalog)))
    if len(tail) < 2 or tail[0] != "models" or not tail[1]:
        raise HttpError(404, f"no such route: {'/'.join(parts)[:100]}")
    name, version, rest = _model_path(tail[1:])
    if rest == []:
        return _only(method, GET, "/v2/models/{model}", lambda r: _ready(
            oip.model_metadata(catalog, name, version)))
    if rest == ["ready"]:
        return _only(method, GET, "/v2/models/{model}/ready", lambda r: _ready(
            _model_ready(catalog, name, version)))
    if rest == ["infer"]:
        return _only(method, POST, "/v2/models/{model}/infer", lambda r: oip.infer(
            front.client, catalog, r, name, version, front.default_timeout))
    raise HttpError(404, f"no such route: {'/'.join(parts)[:100]}")


def _v1(front: Front, parts: list[str], method: bytes) -> tuple[str, Handler]:
    tail = parts[3:]  # after /v1/models/
    verb = ""
    if tail and ":" in tail[-1]:
        tail[-1], _, verb = tail[-1].partition(":")
    if not tail or not tail[0]:
        raise HttpError(404, "no such route: /v1/models/ needs a model name")
    name, version = unquote(tail[0]), None
    rest = tail[1:]
    if len(rest) >= 2 and rest[0] == "labels":
        raise HttpError(404, f"model {name[:64]!r}: version labels are not served (serve "
                        "/v1/models/NAME or /v1/models/NAME/versions/N)")
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = unquote(rest[1]), rest[2:]
    catalog = front.catalog
    if verb:
        if rest or verb != "predict":
            raise HttpError(404 if rest else 501, f"{verb!r} is not served: tfsupervisor "
                            "serves :predict" if not rest else "no such route")
        return _only(method, POST, "/v1/models/{model}:predict", lambda r: tfserving.predict(
            front.client, catalog, r, name, version, front.default_timeout))
    if rest == []:
        return _only(method, GET, "/v1/models/{model}", lambda r: _ready(
            tfserving.status(catalog, name, version)))
    if rest == ["metadata"]:
        return _only(method, GET, "/v1/models/{model}/metadata", lambda r: _ready(
            tfserving.metadata(catalog, name, version)))
    raise HttpError(404, f"no such route: {'/'.join(parts)[:100]}")


def _model_path(tail: list[str]) -> tuple[str, str | None, list[str]]:
    name, rest, version = unquote(tail[0]), tail[1:], None
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = unquote(rest[1]), rest[2:]
    return name, version, rest


def _only(method: bytes, allowed: bytes, route: str, handler: Handler) -> tuple[str, Handler]:
    if method != allowed:
        raise HttpError(405, f"{route} takes {allowed.decode()}", [(b"allow", allowed)])
    return route, handler


async def _ready(response: Response) -> Response:
    return response


def _server_ready(catalog: Catalog) -> Response:
    reason = catalog.not_ready()
    if reason is not None:
        raise HttpError(503, f"not ready: {reason}")
    return json_response({"ready": True})


def _model_ready(catalog: Catalog, name: str, version: str | None) -> Response:
    catalog.model(name, version)
    if not catalog.model_ready(name):
        raise HttpError(503, f"model {name!r} is not ready: no ready worker")
    return json_response({"name": name, "ready": True})


def authorized(token: bytes, headers: dict[bytes, bytes]) -> bool:
    """The request carries ``Authorization: Bearer TOKEN`` (compared in constant time)."""
    scheme, _, value = headers.get(b"authorization", b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), token)
