"""Every supervisor behind one DNS name: a Kubernetes headless Service resolves to the
address of each ready pod, and the client spreads jobs over them and fails over
(docs/deployment.md). ZeroMQ itself connects a ``tcp://NAME:PORT`` endpoint to one address
only, so the name is resolved here, into one endpoint per address."""

from __future__ import annotations

import ipaddress
import socket


def resolve_endpoints(endpoint: str) -> list[str]:
    """``tcp://NAME:PORT`` -> ``tcp://ADDRESS:PORT`` for every address NAME resolves to
    (IPv4 and IPv6, sorted, each once). An address, or an ipc/inproc endpoint, is returned
    as it is. Raises OSError (socket.gaierror) when the name does not resolve: for a
    headless Service, when no pod is ready. Resolve again now and then (a new Client from
    the new list) to pick up pods added by scaling."""
    if not endpoint.startswith("tcp://"):
        return [endpoint]
    host, sep, port = endpoint[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected tcp://HOST:PORT, got {endpoint!r}")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return [endpoint]
    except ValueError:
        pass
    found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]) for info in found},
                       key=lambda a: (ipaddress.ip_address(a).version, ipaddress.ip_address(a)))
    return [f"tcp://[{a}]:{port}" if ":" in a else f"tcp://{a}:{port}" for a in addresses]
