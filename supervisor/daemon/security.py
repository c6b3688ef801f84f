"""Who may reach the supervisor: CURVE keys, the ZAP handler, ipc socket permissions.

The ZAP handler runs inside the daemon's own loop (no extra thread): its socket is polled
like the others, and every denied handshake is one log event.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.base import Authenticator

from supervisor.config.keys import CurveConfig
from supervisor.config.loading import shared_dir
from supervisor.shared import logs
from supervisor.shared.certificates import load_certificate

log = logs.get(__name__)

ZAP_DOMAIN = "tfsupervisor"
# The admin endpoint's own ZAP domain: its key set (curve.admin_clients) is separate, so a
# client admitted to submit jobs or read status cannot recycle or reload.
ADMIN_DOMAIN = "tfsupervisor-admin"
# The setting whose key directory each domain's keys come from.
_DIRECTORIES = {ZAP_DOMAIN: "authorized_clients", ADMIN_DOMAIN: "admin_clients"}
# A key directory with more files than this is not a key directory.
MAX_CLIENT_KEYS = 100_000
# A public certificate is a few hundred bytes; a larger .key file is not one.


class KeyDirError(Exception):
    """A client key directory that cannot be used as a whole: missing, unreadable, empty,
    or holding a file that is not a public certificate."""


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


def start_zap(context: zmq.Context[Any], keys: dict[str, dict[bytes, bool]]) -> ZapHandler:
    handler = ZapHandler(context)
    handler.start()
    install_clients(handler, keys)
    return handler


def read_clients(curve: CurveConfig) -> dict[str, dict[bytes, bool]]:
    """Every client key directory the config names, read whole, by ZAP domain; raises
    KeyDirError naming the setting and the file. For start and `check`: all or nothing,
    so a typo is fixed before anyone depends on the service."""
    keys, problems = _read_all(curve)
    if problems:
        raise KeyDirError(problems[0])
    return keys


def reread_clients(curve: CurveConfig) -> tuple[dict[str, dict[bytes, bool]], list[str]]:
    """For a reload: the keys to admit from now on, and what was wrong. OpenSSH's rule for
    authorized_keys: a bad entry is skipped and reported, the rest applies, and a removal
    always applies. So every admitted key is one that is in its directory now: a directory
    that cannot be read or holds no key admits no one until it is fixed (pyzmq's own loader
    would keep the old keys, a revoked client among them)."""
    return _read_all(curve)


def _read_all(curve: CurveConfig) -> tuple[dict[str, dict[bytes, bool]], list[str]]:
    domains = {"authorized_clients": ZAP_DOMAIN, "admin_clients": ADMIN_DOMAIN}
    keys: dict[str, dict[bytes, bool]] = {}
    problems: list[str] = []
    for setting, directory in curve.key_directories.items():
        keys[domains[setting]] = _read_key_dir(f"supervisor.curve.{setting}", Path(directory),
                                               problems)
    return keys, problems


def _read_key_dir(setting: str, directory: Path, problems: list[str]) -> dict[bytes, bool]:
    try:
        files = sorted(p for p in directory.iterdir() if p.suffix == ".key")
    except OSError as exc:
        problems.append(f"{setting}: cannot read {directory}: {exc.strerror}")
        return {}
    if not files:
        problems.append(f"{setting}: {directory} holds no client certificate (*.key): "
                        "every client would be refused")
    if len(files) > MAX_CLIENT_KEYS:
        problems.append(f"{setting}: {directory} holds more than {MAX_CLIENT_KEYS} "
                        "certificates: none is admitted")
        return {}
    keys: dict[bytes, bool] = {}
    for file in files:
        try:
            keys[_public_key(file)] = True
        except (OSError, ValueError) as exc:
            problems.append(f"{setting}: {file} is not a usable public certificate: {exc}")
    return keys


def _public_key(file: Path) -> bytes:
    # Only small regular files are read (load_certificate): a FIFO, a device (/dev/zero) or
    # a huge file would block or swamp the daemon's loop, which reads keys on reload.
    public, secret = load_certificate(file)
    if secret is not None:  # whoever can read this directory could be that client
        raise ValueError("it holds a secret key: copy the client's public .key, never its "
                         ".key_secret")
    zmq.utils.z85.decode(public)  # a key that is not z85 would never match
    if len(public) != 40:
        raise ValueError("not a 40-character z85 CURVE key")
    return public


def front_certificate(directory: Path) -> tuple[bytes, Path]:
    """A key pair for the HTTP fronts, made at each start and never reused: the public key
    (for the ZAP domain clients use) and the secret certificate file, readable by the service
    user only, in pyzmq's certificate format."""
    public, secret = zmq.curve_keypair()
    path = directory / "front.key_secret"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(f'metadata\ncurve\n    public-key = "{public.decode()}"\n'
                   f'    secret-key = "{secret.decode()}"\n')
    return public, path


def with_front(keys: dict[str, dict[bytes, bool]],
               front: bytes | None) -> dict[str, dict[bytes, bool]]:
    """The admitted keys, the fronts' own added to the clients' domain."""
    if front is None:
        return keys
    return {**keys, ZAP_DOMAIN: {**keys.get(ZAP_DOMAIN, {}), front: True}}


def install_clients(handler: ZapHandler, keys: dict[str, dict[bytes, bool]]) -> list[str]:
    """Replace the admitted keys, every domain at once (read them with read_clients); what
    changed, per key directory ("authorized_clients 4,999 (1 removed)"), for `reload` to
    say: a changed key set is a change."""
    before: dict[str, dict[bytes, bool]] = dict(getattr(handler, "certs", {}) or {})
    handler.allow_any = False
    handler.certs = dict(keys)
    for domain, certs in keys.items():
        log.info("curve_clients_loaded", domain=domain, clients=len(certs))
    changes = []
    for domain in sorted({*before, *keys}):
        old, new = set(before.get(domain, {})), set(keys.get(domain, {}))
        added, removed = len(new - old), len(old - new)
        if added or removed:
            what = ", ".join(f"{n:,} {verb}" for n, verb in ((added, "added"),
                                                             (removed, "removed")) if n)
            changes.append(f"{_DIRECTORIES.get(domain, domain)} {len(new):,} ({what})")
    return changes


def make_curve_server(sock: zmq.Socket[Any], curve: CurveConfig,
                      domain: str = ZAP_DOMAIN) -> None:
    """Turn CURVE on for a bound socket (call before bind)."""
    assert curve.server_secret_key is not None
    try:
        public, secret = load_certificate(curve.server_secret_key)
    except ValueError as exc:
        raise ValueError(f"{curve.server_secret_key}: {exc}") from None
    if secret is None:
        raise ValueError(f"{curve.server_secret_key} holds no secret key")
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    sock.zap_domain = domain.encode()




class UnknownGroup(Exception):
    """A configured group that this host does not have."""


def group_id(setting: str, group: str | None) -> int | None:
    """The gid of a configured group (None: none configured)."""
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise UnknownGroup(f"supervisor.{setting}: no group named {group!r} on this "
                           "host") from None


class RuntimeDirError(Exception):
    """A runtime dir the daemon cannot make private without changing what is not its own."""


def prepare_runtime_dir(path: Path, gid: int | None, service_dir: bool = False) -> list[Path]:
    """The ipc directory: made here (readable by owner and group only) and returned with
    every parent made for it, deepest last, so that a failed start can remove them; or,
    when it exists, taken as it is: the mode and owner of a directory the daemon did not
    make are never changed (`runtime_dir: /tmp` must not lock other users out of /tmp).
    One that every user may write to is refused, and so is one in a shared directory (the
    daemon's own there, config/loading.py _own_dir) that another user made.
    ``service_dir``: the service manager made it for this service (systemd's
    RuntimeDirectory=): its group is still set to ``gid`` (socket_group; its mode is left
    alone). A file where
    the directory (or one of its parents) should be is named as `check` names it: mkdir's
    own "File exists" sent the operator looking for a directory that was not there."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is not a directory", str(existing))
    if existing == path:
        if (problem := runtime_dir_problem(path)) is not None:
            raise RuntimeDirError(f"runtime dir {problem}")
        if service_dir and gid is not None:
            os.chown(path, -1, gid)
        return []
    made = [path]
    while made[-1].parent != existing:
        made.append(made[-1].parent)
    path.mkdir(parents=True)
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, 0o750)
    return made[::-1]


def runtime_dir_problem(path: Path) -> str | None:
    """Why an existing runtime dir cannot be the daemon's as it is (None: it can): one every
    user may write to, or one another user made where every user may make it."""
    try:
        info = path.lstat()
    except OSError:
        return None  # not there: the daemon makes it
    if info.st_mode & stat.S_IWOTH:
        return (f"{path}: every user may write to it (mode {stat.S_IMODE(info.st_mode):04o}); "
                "the daemon does not change a directory it did not make: remove it, or "
                "choose another supervisor.runtime_dir")
    if shared_dir(path.parent) and info.st_uid != os.geteuid():
        return (f"{path}: made by another user (uid {info.st_uid}) in a directory every "
                "user may write to; remove it, or choose another supervisor.runtime_dir")
    return None


def restrict_socket(endpoint: str, gid: int | None, shared: bool = True) -> None:
    """ipc socket files: read/write for the owner, and for the group when ``shared``;
    nothing for others."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://"):]
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, 0o660 if shared else 0o600)


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
