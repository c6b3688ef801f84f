"""The seccomp filters systemd installs for systemd/tfsupervisor.service, installed by hand.

There is no systemd as PID 1 where the tests run, so the tests build the same filters from
the unit file and run real processes under them:

    python tests/syscall_filter.py SPEC_JSON -- COMMAND [ARGS...]

installs them and execs COMMAND; its children (the workers) inherit them, as the service's
processes do. SPEC_JSON comes from :func:`unit_spec`, which reads the unit as systemd does:

- ``SystemCallFilter=``: the first entry decides (an allow list here); an allow list always
  gets ``@default`` as well; later ``~`` entries take calls out, later plain ones put them
  back. Groups are expanded by ``systemd-analyze syscall-filter``, i.e. by this host's systemd.
- ``SystemCallErrorNumber=``: what a call outside the list gets (an errno, or ``kill``: the
  process dies of SIGSYS).
- ``RestrictAddressFamilies=`` (allow list): socket() of any other family fails with
  EAFNOSUPPORT.
- ``RestrictNamespaces=yes``: clone3() fails with ENOSYS (so that libc falls back to clone(),
  whose flags can be checked), setns() and clone()/unshare() with a CLONE_NEW* flag with EPERM.

Each of these is a separate filter, as systemd loads them; the kernel applies the strictest
answer. Standard library only: the script runs before anything else is imported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import re
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

# libseccomp's actions and comparison operators (seccomp.h).
ACT_KILL_PROCESS = 0x80000000
ACT_ALLOW = 0x7FFF0000
CMP_EQ = 4
CMP_GE = 5
CMP_MASKED_EQ = 7
# The namespaces RestrictNamespaces=yes forbids (linux/sched.h).
CLONE_NEW = {"mnt": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000,
             "user": 0x10000000, "pid": 0x20000000, "net": 0x40000000}
# Above every address family Linux defines (AF_MAX is 46 in Linux 6.x).
FAMILY_LIMIT = 64


def act_errno(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def libseccomp() -> ctypes.CDLL:
    """libseccomp.so.2 (Debian: libseccomp2, which apt and systemd depend on); OSError when
    this host has none."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    return lib


# --- what the unit asks for ----------------------------------------------------------------

def service_settings(text: str) -> dict[str, list[str]]:
    """Every assignment of the [Service] section, in order, by key."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


@cache
def expand(name: str) -> frozenset[str]:
    """A system call, or a @group with its nested groups expanded, by this host's systemd."""
    if not name.startswith("@"):
        return frozenset({name})
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:  # the first line is the group's own name
        entry = line.strip()
        if entry and not entry.startswith("#"):
            calls |= expand(entry)
    if not calls:
        raise ValueError(f"systemd-analyze knows no system calls in {name}")
    return frozenset(calls)


def unit_spec(text: str) -> dict[str, Any]:
    """The filters systemd would install for this unit text, as JSON-ready values."""
    settings = service_settings(text)
    allowed: set[str] | None = None
    for value in settings.get("SystemCallFilter", []):
        if not value:
            allowed = None  # an empty assignment resets the list
            continue
        deny = value.startswith("~")
        names = value.lstrip("~").split()
        if allowed is None:
            if deny:
                raise ValueError("a deny-list SystemCallFilter= is not supported here")
            allowed = set(expand("@default"))
        for name in names:
            if ":" in name:
                raise ValueError(f"SystemCallFilter={value}: per-call errno not supported")
            if deny:
                allowed -= expand(name)
            else:
                allowed |= expand(name)
    if allowed is None:
        raise ValueError("the unit sets no SystemCallFilter= allow list")
    action = (settings.get("SystemCallErrorNumber") or ["kill"])[-1]
    families: set[str] = set()
    for value in settings.get("RestrictAddressFamilies", []):
        if value.startswith("~") or value == "none":
            raise ValueError(f"RestrictAddressFamilies={value} is not supported here")
        families = set() if not value else families | set(value.split())
    return {"allow": sorted(allowed),
            "errno": None if action == "kill" else _errno(action),
            "families": sorted(families),
            "restrict_namespaces": (settings.get("RestrictNamespaces") or ["no"])[-1] == "yes"}


def _errno(value: str) -> int:
    number = int(value) if value.isdigit() else getattr(errno, value, None)
    if not isinstance(number, int):
        raise ValueError(f"SystemCallErrorNumber={value} is not an errno")
    return number


# --- installing it -------------------------------------------------------------------------

def install(spec: dict[str, Any]) -> None:
    """Load the filters into this process (and so into everything it execs or forks)."""
    lib = libseccomp()
    if spec["families"]:
        families = _Filter(lib, ACT_ALLOW)
        keep = {int(getattr(socket, family)) for family in spec["families"]}
        for number in range(FAMILY_LIMIT):
            if number not in keep:
                families.rule(act_errno(errno.EAFNOSUPPORT), "socket", (0, CMP_EQ, number, 0))
        families.rule(act_errno(errno.EAFNOSUPPORT), "socket", (0, CMP_GE, FAMILY_LIMIT, 0))
        families.load()
    if spec["restrict_namespaces"]:
        namespaces = _Filter(lib, ACT_ALLOW)
        namespaces.rule(act_errno(errno.ENOSYS), "clone3")
        namespaces.rule(act_errno(errno.EPERM), "setns")
        for flag in CLONE_NEW.values():
            for call in ("unshare", "clone"):
                namespaces.rule(act_errno(errno.EPERM), call, (0, CMP_MASKED_EQ, flag, flag))
        namespaces.load()
    # Last: seccomp() itself is not in the allow list, so no filter could be loaded after it.
    default = ACT_KILL_PROCESS if spec["errno"] is None else act_errno(spec["errno"])
    allowed = _Filter(lib, default)
    for name in spec["allow"]:
        allowed.rule(ACT_ALLOW, name)
    allowed.load()


class _Filter:
    def __init__(self, lib: ctypes.CDLL, default: int) -> None:
        self.lib = lib
        self.ctx = lib.seccomp_init(default)
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def rule(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        number = self.lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:
            return  # unknown here, or not a call of this architecture: systemd skips it too
        array = (ArgCmp * max(1, len(cmps)))(*[ArgCmp(*c) for c in cmps])
        r = self.lib.seccomp_rule_add_array(self.ctx, action, number, len(cmps), array)
        if r < 0 and r != -errno.EDOM:
            raise OSError(-r, f"seccomp_rule_add({name}): {os.strerror(-r)}")

    def load(self) -> None:
        try:
            r = self.lib.seccomp_load(self.ctx)
            if r < 0:
                raise OSError(-r, f"seccomp_load: {os.strerror(-r)}")
        finally:
            self.lib.seccomp_release(self.ctx)


def seccomp_mode(pid: int | str = "self") -> tuple[int, int]:
    """(Seccomp mode, number of filters) of a process: (2, n) when filtered."""
    status = Path(f"/proc/{pid}/status").read_text()
    mode = re.search(r"^Seccomp:\s+(\d+)", status, re.M)
    filters = re.search(r"^Seccomp_filters:\s+(\d+)", status, re.M)
    return (int(mode.group(1)) if mode else -1, int(filters.group(1)) if filters else -1)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit(f"usage: {Path(__file__).name} SPEC_JSON -- COMMAND [ARGS...]")
    install(json.loads(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
