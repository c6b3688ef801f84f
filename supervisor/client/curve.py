"""CURVE on the client side: a client's key pair and the server's public key on a socket.

The server side (ZAP, authorized key directories, keygen) is the daemon's:
supervisor/daemon/security.py. This module imports only pyzmq, so a client needs neither the
config stack nor yaml.
"""

from __future__ import annotations

from typing import Any

import zmq

from supervisor.shared.certificates import load_certificate

__all__ = ["make_curve_client"]

def make_curve_client(sock: zmq.Socket[Any], server_key: str | bytes,
                      client_cert: str) -> None:
    """Client side: our key pair from a secret certificate, the server's public key from its
    public certificate file (or as z85 bytes). Call before connect."""
    try:
        public, secret = load_certificate(client_cert)
    except ValueError as exc:
        raise ValueError(f"{client_cert}: {exc}") from None
    if secret is None:
        raise ValueError(f"{client_cert} holds no secret key: pass the .key_secret file")
    if isinstance(server_key, str):
        server_key = load_certificate(server_key)[0]
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_key
