"""A front process: `python -m supervisor.front`, started by the daemon (daemon/fronts.py)
with the listening socket it bound, never by hand.

It serves HTTP on that socket and forwards jobs to the daemon's private frontend endpoint
as a client. SIGTERM drains it (stop accepting, finish what is under way, close); it dies
with the daemon (PR_SET_PDEATHSIG), so an orphan never keeps the port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import ssl
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from supervisor.client.aclient import AsyncClient
from supervisor.front import metrics
from supervisor.front.catalog import Catalog
from supervisor.front.routes import Front
from supervisor.front.server import Connections, HttpConnection, Limits
from supervisor.shared import linux, logs
from supervisor.shared.exitcodes import WorkerExit

log = logs.get(__name__)

SETTINGS_ENV = "TFS_HTTP_SETTINGS"  # the http section, as JSON
TOKEN_ENV = "TFS_HTTP_TOKEN"  # the bearer token, when token_file is set (never on argv)
SPARE_DESCRIPTORS = 64  # kept for the front's own files and sockets
CURVE_ENV = "TFS_FRONT_CURVE"  # under supervisor.curve: the daemon's key, the fronts' cert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m supervisor.front")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket")
    parser.add_argument("--endpoint", required=True, help="the daemon's frontend endpoint")
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--parent", type=int, default=0, help="the daemon's pid")
    args = parser.parse_args(argv)
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if args.parent and os.getppid() != args.parent:
        return int(WorkerExit.ORPHANED)  # the daemon died before the line above
    settings: dict[str, Any] = json.loads(os.environ.get(SETTINGS_ENV, "{}"))
    logs.configure(settings.get("log_level", "info"), settings.get("log_format", "auto"),
                   front=args.slot)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the daemon's
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # the plain asyncio loop serves too, slower
        pass
    try:
        return asyncio.run(serve(args, settings))
    except Exception as exc:
        log.error("front_failed", error=f"{type(exc).__name__}: {exc}")
        return int(WorkerExit.BOOT_ERROR)


async def serve(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=args.fd) if args.fd >= 0 else None
    context = _tls(settings)
    default_timeout = float(settings.get("default_timeout", 60.0))
    token = os.environ.pop(TOKEN_ENV, None)
    server_key, client_cert = json.loads(os.environ.get(CURVE_ENV, "[null, null]"))
    client = AsyncClient(args.endpoint, timeout=default_timeout, retry_unanswered=False,
                         server_key=server_key.encode() if server_key else None,
                         client_cert=client_cert)
    catalog = Catalog(client)
    await catalog.refresh()
    refresher = loop.create_task(catalog.run())
    front = Front(client, catalog, default_timeout, token.encode() if token else None,
                  _version())
    access = (lambda line: log.info("http_request", line=line)) \
        if settings.get("access_log") else None
    max_body = int(settings.get("max_body_size", 64 * 1024**2))
    request_timeout = float(settings.get("request_timeout", 30.0))
    limits = Limits(max_body, request_timeout, float(settings.get("keepalive_timeout", 5.0)),
                    _connections_allowed(int(settings.get("max_connections", 1000))), access)
    connections = Connections(body_budget=2 * max_body)
    server = None
    if sock is not None:
        server = await loop.create_server(
            lambda: HttpConnection(front, limits, connections), sock=sock, ssl=context,
            ssl_handshake_timeout=request_timeout if context is not None else None)
    rpc = await _grpc(front, settings)
    flusher = loop.create_task(_flush_metrics())
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    log.info("front_started", pid=os.getpid(), slot=args.slot)
    await stop.wait()
    if server is not None:
        server.close()  # this process stops accepting; the socket stays the daemon's
    connections.drain()
    if rpc is not None:  # refuses new calls, waits for those under way
        await rpc.stop(default_timeout)
    await connections.empty.wait()
    refresher.cancel()
    flusher.cancel()
    metrics.TALLIES.flush()
    await client.close()
    log.info("front_stopped", pid=os.getpid(), slot=args.slot)
    return 0


async def _flush_metrics() -> None:
    while True:
        await asyncio.sleep(metrics.FLUSH)
        metrics.TALLIES.flush()


async def _grpc(front: Front, settings: dict[str, Any]) -> Any:
    """The gRPC front on supervisor.grpc.listen, started; None when it is off."""
    listen = settings.get("grpc_listen")
    if not listen:
        return None
    from supervisor.front import grpc_service  # grpcio only where gRPC is on

    credentials = None
    if settings.get("grpc_tls_cert"):
        import grpc

        key = Path(settings["grpc_tls_key"]).read_bytes()
        credentials = grpc.ssl_server_credentials(
            [(key, Path(settings["grpc_tls_cert"]).read_bytes())])
    server = grpc_service.server(front, listen, int(settings.get("max_message_size",
                                                                 256 * 1024**2)), credentials)
    await server.start()
    return server


def _connections_allowed(configured: int) -> int:
    """max_connections, within what the descriptor limit allows: past it a connection
    could not even be accepted, and would be reset rather than answered 503."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or configured + SPARE_DESCRIPTORS <= soft:
        return configured
    allowed = max(1, soft - SPARE_DESCRIPTORS)
    log.warning("front_connections_capped", max_connections=configured, allowed=allowed,
                nofile=soft, hint="raise LimitNOFILE (ulimit -n) to allow more")
    return allowed


def _tls(settings: dict[str, Any]) -> ssl.SSLContext | None:
    if not settings.get("tls_cert"):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings["tls_cert"], settings["tls_key"])
    return context


def _version() -> str:
    try:
        return metadata.version("tfsupervisor")
    except metadata.PackageNotFoundError:
        return "0"


if __name__ == "__main__":
    sys.exit(main())
