"""A fingerprint of the code a model's workers run: its SavedModel directory or .keras file,
or its handler's module (the whole top-level package it is part of), and the files its
handler options name. A reload compares fingerprints as it compares settings, so a model
changed on disk beside an unchanged config gets new workers.

Reads files: call it off the main loop (a model on a hung mount blocks it). Files are
compared by name, size and modification time, and small regular ones by content as well (a
rewrite within the same clock tick), so a SavedModel of gigabytes costs a few stat calls.
Only regular files are ever opened (a device or a FIFO named in an option is counted by
type and name: /dev/urandom never ends, a FIFO without a writer never answers), and every
walk is bounded (files, depth, bytes read).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from supervisor.config.keys import ModelConfig
from supervisor.shared import logs

log = logs.get(__name__)

# Files up to this size are read (a handler module, a vocabulary); larger ones are stat'ed.
READ_UP_TO = 64 << 10
# At most this many files per source are looked at: a handler in a huge installed package
# (or a model directory of thousands of shards) costs bounded time; the rest is counted.
MOST_FILES = 5000
# ... this deep, and this many bytes read in all per source.
MOST_DEPTH = 16
MOST_BYTES = 64 << 20
# Never walked into, whatever an option names: pseudo file systems, devices.
NEVER = (Path("/dev"), Path("/proc"), Path("/sys"))

Progress = Callable[[Path], None]


class _Sources:
    """Source paths, added to by the walks (each off the loop, in threads of their own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: set[str] = set()

    def add(self, path: str) -> bool:
        """Whether ``path`` is new here."""
        with self._lock:
            new = path not in self._paths
            self._paths.add(path)
            return new

    def sorted(self) -> list[str]:
        with self._lock:
            return sorted(self._paths)


# The sources whose walk hit a bound: what `status` reads (bounded()).
PARTLY_COMPARED = _Sources()
# The sources whose bound the log has told: once each, whatever `status` is given.
_TOLD = _Sources()


def fingerprint(model: ModelConfig, config_dir: Path | None, runtime_dir: Path | None = None,
                progress: Progress | None = None) -> str | None:
    """16 hex digits that change when what the model's workers would load changes; None
    when that is not known (a handler module the worker's import path does not resolve)."""
    found = sources(model, config_dir, runtime_dir)
    if found is None:
        return None
    digest = hashlib.sha256()
    for source in found:
        digest.update(str(source).encode() + b"\0")
        _add(digest, source, progress)
    return digest.hexdigest()[:16]


def sources(model: ModelConfig, config_dir: Path | None,
            runtime_dir: Path | None = None) -> list[Path] | None:
    """What the workers load: the model's files, or the handler's package; then the files
    (or directories) its options name (see _watched). None: the handler is not found."""
    found: list[Path] = []
    for given in (model.saved_model, model.keras):
        if given:
            found.append(_beside(given, config_dir))
    if model.handler:
        module = model.handler.split(":", 1)[0]
        package = _module_source(module, _search_path(model, config_dir))
        if package is None:
            return None
        found.append(package)
    for value in model.options.values():
        if isinstance(value, str) and value and len(value) < 4096 and ("/" in value or
                                                                        "." in value):
            path = _watched(_beside(value, config_dir), config_dir, runtime_dir)
            if path is not None:
                found.append(path)
    return found


def _watched(path: Path, config_dir: Path | None, runtime_dir: Path | None) -> Path | None:
    """``path`` when an option naming it names code or data: an existing regular file, or a
    directory that is not "/", the config's directory or one above it, the runtime dir, or
    under /dev, /proc, /sys ("." as a decimal point named the config's whole directory)."""
    try:
        resolved = path.resolve()
        info = resolved.stat()
    except (OSError, RuntimeError):
        return None
    if any(resolved == n or n in resolved.parents for n in NEVER):
        return None
    if stat.S_ISREG(info.st_mode):
        return path
    if not stat.S_ISDIR(info.st_mode) or resolved == Path("/"):
        return None
    for excluded in (config_dir, runtime_dir):
        if excluded is not None and (resolved == excluded.resolve() or
                                     resolved in excluded.resolve().parents):
            return None
    return path


def _beside(path: str, config_dir: Path | None) -> Path:
    given = Path(path)
    return given if given.is_absolute() or config_dir is None else config_dir / given


def _search_path(model: ModelConfig, config_dir: Path | None) -> list[Path]:
    """Where the worker's import looks, in its order: `python -m worker` puts its working
    directory first (the supervisor's: workers inherit it), then PYTHONPATH as
    worker_spec.worker_env sets it (the config's directory, then the model's env or the
    supervisor's), then the interpreter's own path (this one's, less its script's entry)."""
    pythonpath = model.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    own = [Path(p) for p in sys.path[1:] if p]  # [0]: the supervisor's script or cwd
    try:
        cwd = [Path.cwd()]
    except OSError:  # removed under the running daemon: the worker's import skips it too
        cwd = []
    return [*cwd, *([config_dir] if config_dir else []),
            *(Path(p) for p in pythonpath.split(os.pathsep) if p), *own]


def _module_source(module: str, search: list[Path]) -> Path | None:
    """The file or top-level package directory that ``import module`` finds first, found
    without importing anything (an import runs code in the supervisor)."""
    top = module.split(".", 1)[0]
    for entry in search:
        if (entry / top / "__init__.py").is_file() or \
                ("." in module and (entry / top).is_dir()):
            return entry / top
        if (entry / f"{top}.py").is_file():
            return entry / f"{top}.py"
    return None


def _add(digest: hashlib._Hash, root: Path, progress: Progress | None) -> None:
    try:
        files, bounded = _files(root)
    except OSError as exc:
        digest.update(f"unreadable: {exc}".encode())
        return
    budget = MOST_BYTES
    for path in files:
        if progress is not None:
            progress(path)
        try:
            info = path.lstat() if path.is_symlink() and not path.exists() else path.stat()
            digest.update(f"{path.relative_to(root) if path != root else ''}\0{info.st_size}"
                          f"\0{info.st_mtime_ns}\0{stat.S_IFMT(info.st_mode)}\0".encode())
            if stat.S_ISREG(info.st_mode) and info.st_size <= READ_UP_TO and budget > 0:
                data = _read(path)
                budget -= len(data)
                digest.update(data)
        except OSError as exc:  # gone since the listing, unreadable: a change all the same
            digest.update(f"{path}: {type(exc).__name__}".encode())
    bounded = bounded or budget <= 0
    digest.update(f"files {len(files)} bounded {bounded}".encode())
    if bounded:
        PARTLY_COMPARED.add(str(root))
    if bounded and _TOLD.add(str(root)):
        log.warning("code_fingerprint_bounded", path=str(root), files=MOST_FILES,
                    depth=MOST_DEPTH, bytes=MOST_BYTES,
                    hint="only part of it is compared: a change past the bound is not seen")


def bounded() -> list[str]:
    """The sources whose walk hit a bound (for `status`): only part of each is compared."""
    return PARTLY_COMPARED.sorted()


def _read(path: Path) -> bytes:
    """At most READ_UP_TO + 1 bytes of a regular file, opened so that it cannot block (a
    file replaced by a FIFO since it was stat'ed is checked again once open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b"not a regular file"
        return os.read(fd, READ_UP_TO + 1)
    finally:
        os.close(fd)


def _files(root: Path) -> tuple[list[Path], bool]:
    """Every file under ``root`` (or ``root`` itself), in a stable order, caches left out,
    never under /dev, /proc or /sys; and whether a bound (files, depth) cut the walk."""
    if not root.is_dir():
        return ([root] if root.exists() else []), False
    found: list[Path] = []
    bounded = False
    depth0 = len(root.parts)
    for folder, dirs, names in os.walk(root, followlinks=True):
        here = Path(folder)
        deep = len(here.parts) - depth0 >= MOST_DEPTH
        kept = sorted(d for d in dirs if d != "__pycache__" and not _never(here / d))
        dirs[:] = [] if deep else kept
        bounded = bounded or (deep and bool(kept))
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            found.append(here / name)
            if len(found) >= MOST_FILES:
                return found, True
    return found, bounded


def _never(path: Path) -> bool:
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):
        return True
    return any(resolved == n or n in resolved.parents for n in NEVER)
