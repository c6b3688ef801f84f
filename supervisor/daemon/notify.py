"""sd_notify without libsystemd: a few lines over the NOTIFY_SOCKET datagram socket.

Under systemd (Type=notify) the daemon says READY=1 once its workers are warm, keeps a
STATUS= line current, pings WATCHDOG=1 from its main loop (so a wedged loop gets the unit
restarted), brackets reloads with RELOADING=1 / READY=1, says STOPPING=1 on shutdown and,
while it drains, EXTEND_TIMEOUT_USEC= so that a drain longer than TimeoutStopSec is not
killed half-way (supervisor.daemon.reporting decides how far, never past its own deadline).
Outside systemd every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # '@name' is an abstract socket: the kernel spells it with a leading NUL byte.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.sock: socket.socket | None = None
        if self.address:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_interval = _watchdog_interval(env)
        self.last_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, message: str) -> bool:
        if self.sock is None:
            return False
        try:
            self.sock.sendto(message.encode(), self.address)
        except OSError:
            return False  # systemd gone or socket full: never fatal
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def status(self, text: str) -> bool:
        """Send STATUS= only when it changed."""
        if text == self.last_status:
            return False
        self.last_status = text
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self, monotonic_usec: int) -> bool:
        return self.send(f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def extend_timeout(self, usec: int) -> bool:
        """Ask systemd to wait ``usec`` more (from now) for the current state to end: for a
        stop, the kill at TimeoutStopSec moves to now + usec when that is later. It holds
        until the next message or until the time runs out, so it is sent again while
        progress is made."""
        if usec <= 0:
            raise ValueError(f"EXTEND_TIMEOUT_USEC must be a positive number, got {usec}")
        return self.send(f"EXTEND_TIMEOUT_USEC={int(usec)}")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC, as systemd recommends; None when no watchdog is asked for
    (or it is meant for another process)."""
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
