"""Every supervisor behind one DNS name: a Kubernetes headless Service resolves to the
address of each ready pod, and the client spreads jobs over them and fails over
(docs/deployment.md). ZeroMQ itself connects a ``tcp://NAME:PORT`` endpoint to one address
only, so the name is resolved here, into one endpoint per address."""

from __future__ import annotations

import ipaddress
import re
import socket

# A host name as DNS has it: labels of letters, digits, '-' (and '_', which some private
# zones use), 1 to 63 characters each, 253 in all.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_USAGE = "expected tcp://HOST:PORT (an IPv6 address in brackets: tcp://[::1]:5555)"


def resolve_endpoints(endpoint: str) -> list[str]:
    """``tcp://NAME:PORT`` -> ``tcp://ADDRESS:PORT`` for every address NAME resolves to
    (IPv4 and IPv6, IPv6 in brackets, sorted, each once). An address, or an ipc/inproc
    endpoint, is returned as it is. Raises ValueError for anything else (another scheme,
    no port or one outside 1-65535, an IPv6 address without brackets, a name DNS cannot
    hold), and OSError (socket.gaierror) when the name does not resolve: for a headless
    Service, when no pod is ready. Resolve again now and then (a new Client from the new
    list) to pick up pods added by scaling."""
    if not isinstance(endpoint, str):
        raise ValueError(f"{_USAGE}, got {endpoint!r}")
    if endpoint.startswith(("ipc://", "inproc://")) and endpoint.partition("://")[2]:
        return [endpoint]
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"{_USAGE}, ipc://PATH or inproc://NAME, got {endpoint!r}")
    host, sep, port = endpoint[len("tcp://"):].rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) \
            or not 1 <= int(port) <= 65535:
        raise ValueError(f"{_USAGE} with a port from 1 to 65535, got {endpoint!r}")
    if host.startswith("[") or host.endswith("]"):
        try:
            if host.startswith("[") and host.endswith("]"):
                ipaddress.IPv6Address(host[1:-1])
                return [endpoint]
        except ValueError:
            pass
        raise ValueError(f"not an IPv6 address in brackets: {host!r} in {endpoint!r}")
    if ":" in host:
        raise ValueError(f"an IPv6 address goes in brackets (tcp://[{host}]:{port}), got "
                         f"{endpoint!r}")
    try:
        ipaddress.IPv4Address(host)
        return [endpoint]
    except ValueError:
        pass
    name = host.removesuffix(".")
    try:  # an internationalised name, as DNS holds it
        name = name.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"not a valid host name: {host!r} in {endpoint!r}") from None
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError(f"not a valid host name: {host!r} in {endpoint!r}")
    found = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]).partition("%")[0] for info in found},
                       key=lambda a: (ipaddress.ip_address(a).version, ipaddress.ip_address(a)))
    return [f"tcp://[{a}]:{port}" if ":" in a else f"tcp://{a}:{port}" for a in addresses]
