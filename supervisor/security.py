"""Who may reach the supervisor: CURVE keys, the ZAP handler, ipc socket permissions.

The ZAP handler runs inside the daemon's own loop (no extra thread): its socket is polled
like the others, and every denied handshake is one log event.
"""

from __future__ import annotations

import asyncio
import grp
import os
import shutil
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.base import Authenticator

from supervisor import logs
from supervisor.config import CurveConfig

log = logs.get("security")

ZAP_DOMAIN = "tfsupervisor"


class ZapHandler(Authenticator):
    """pyzmq's ZAP authenticator, with denials logged as structured events.

    pyzmq's handlers are coroutines; with certificates read from files they never wait on
    anything, so a private event loop runs each to completion inside the daemon's loop.
    """

    def __init__(self, context: zmq.Context[Any]) -> None:
        super().__init__(context)
        self._loop = asyncio.new_event_loop()

    async def _authenticate_curve(self, domain: str, client_key: bytes) -> tuple[bool, bytes]:
        allowed, reason = await super()._authenticate_curve(domain, client_key)
        if not allowed:
            log.warning("handshake_denied", mechanism="CURVE",
                        client_key=zmq.utils.z85.encode(client_key).decode(),
                        reason=reason.decode(errors="replace"))
        return allowed, reason

    def handle(self) -> None:
        """Answer one pending ZAP request (call when the ZAP socket is readable)."""
        assert self.zap_socket is not None
        message = self.zap_socket.recv_multipart()
        self._loop.run_until_complete(self.handle_zap_message(message))

    def close(self) -> None:
        self.stop()
        self._loop.close()


def start_zap(context: zmq.Context[Any], curve: CurveConfig) -> ZapHandler:
    handler = ZapHandler(context)
    handler.start()
    load_clients(handler, curve)
    return handler


def load_clients(handler: ZapHandler, curve: CurveConfig) -> int:
    """(Re)read the authorized client keys; returns how many there are."""
    assert curve.authorized_clients is not None
    handler.configure_curve(domain=ZAP_DOMAIN, location=curve.authorized_clients)
    count = len(handler.certs.get(ZAP_DOMAIN, {}))
    log.info("curve_clients_loaded", directory=curve.authorized_clients, clients=count)
    return count


def make_curve_server(sock: zmq.Socket[Any], curve: CurveConfig) -> None:
    """Turn CURVE on for a bound socket (call before bind)."""
    assert curve.server_secret_key is not None
    public, secret = zmq.auth.load_certificate(curve.server_secret_key)
    if secret is None:
        raise ValueError(f"{curve.server_secret_key} holds no secret key")
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()


def make_curve_client(sock: zmq.Socket[Any], server_key: str | bytes,
                      client_cert: str) -> None:
    """Client side: our key pair from a secret certificate, the server's public key from its
    public certificate file (or as z85 bytes). Call before connect."""
    public, secret = zmq.auth.load_certificate(client_cert)
    if secret is None:
        raise ValueError(f"{client_cert} holds no secret key: pass the .key_secret file")
    if isinstance(server_key, str):
        server_key = zmq.auth.load_certificate(server_key)[0]
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_key


def prepare_runtime_dir(path: Path, group: str | None) -> int | None:
    """Create the ipc directory, readable by owner and group only; returns the gid to give
    the sockets (None: our own)."""
    path.mkdir(parents=True, exist_ok=True)
    gid = grp.getgrnam(group).gr_gid if group else None
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, 0o750)
    return gid


def restrict_socket(endpoint: str, gid: int | None) -> None:
    """ipc socket files: read/write for owner and group, nothing for others."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://"):]
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, 0o660)


class KeysExist(Exception):
    """keygen would replace keys a fleet of clients may depend on."""


def keygen(directory: Path, force: bool = False) -> dict[str, Path]:
    """Server and client key pairs in the pyzmq certificate format, and an
    authorized_clients directory holding the client's public key. Existing secret keys are
    kept unless ``force``: a new server key cuts off every client that trusts the old one.
    Secrets are created 0600 in a 0700 directory, never readable by others even briefly."""
    names = ("server.key", "server.key_secret", "client.key", "client.key_secret",
             "authorized_clients/client.key")
    existing = [name for name in names if (directory / name).exists()]
    if existing and not force:
        raise KeysExist(f"{directory} already holds {', '.join(existing)}; replacing keys "
                        "cuts off every client that trusts them. Use another directory, or "
                        "--force to replace them")
    previous = os.umask(0o077)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        server_public, server_secret = zmq.auth.create_certificates(str(directory), "server")
        client_public, client_secret = zmq.auth.create_certificates(str(directory), "client")
        authorized = directory / "authorized_clients"
        authorized.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(client_public, authorized / "client.key")
    finally:
        os.umask(previous)
    os.chmod(directory, 0o700)
    for public in (server_public, client_public):
        os.chmod(public, 0o644)
    return {"server_public": Path(server_public), "server_secret": Path(server_secret),
            "client_public": Path(client_public), "client_secret": Path(client_secret),
            "authorized_clients": authorized}
