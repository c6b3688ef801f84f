"""A fingerprint of the code a model's workers run: its SavedModel directory or .keras file,
or its handler's module (the whole top-level package it is part of), and the files its
handler options name. A reload compares fingerprints as it compares settings, so a model
changed on disk beside an unchanged config gets new workers.

Reads files: call it off the main loop (a model on a hung mount blocks it). Files are
compared by name, size and modification time, and small ones by content as well (a rewrite
within the same clock tick), so a SavedModel of gigabytes costs a few stat calls.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from supervisor.config.keys import ModelConfig

# Files up to this size are read (a handler module, a vocabulary); larger ones are stat'ed.
READ_UP_TO = 64 << 10
# At most this many files per source are looked at: a handler in a huge installed package
# (or a model directory of thousands of shards) costs bounded time; the rest is counted.
MOST_FILES = 5000


def fingerprint(model: ModelConfig, config_dir: Path | None) -> str:
    """16 hex digits that change when what the model's workers would load changes."""
    digest = hashlib.sha256()
    for source in sources(model, config_dir):
        digest.update(str(source).encode() + b"\0")
        _add(digest, source)
    return digest.hexdigest()[:16]


def sources(model: ModelConfig, config_dir: Path | None) -> list[Path]:
    """What the workers load: the model's files, or the handler's package; then the files
    (or directories) its options name that exist."""
    found: list[Path] = []
    for given in (model.saved_model, model.keras):
        if given:
            found.append(_beside(given, config_dir))
    if model.handler:
        module = model.handler.split(":", 1)[0]
        package = _module_source(module, _search_path(model, config_dir))
        if package is not None:
            found.append(package)
    for value in model.options.values():
        if isinstance(value, str) and value and len(value) < 4096 and ("/" in value or
                                                                        "." in value):
            path = _beside(value, config_dir)
            if path.exists():
                found.append(path)
    return found


def _beside(path: str, config_dir: Path | None) -> Path:
    given = Path(path)
    return given if given.is_absolute() or config_dir is None else config_dir / given


def _search_path(model: ModelConfig, config_dir: Path | None) -> list[Path]:
    """Where the worker's import looks (worker_spec.worker_env): the config's directory,
    then PYTHONPATH (the model's own env first), then this interpreter's path."""
    pythonpath = model.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    entries = [*([config_dir] if config_dir else []),
               *(Path(p) for p in pythonpath.split(os.pathsep) if p),
               *(Path(p) for p in sys.path if p)]
    return entries


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


def _add(digest: hashlib._Hash, root: Path) -> None:
    try:
        files = list(_files(root))
    except OSError as exc:
        digest.update(f"unreadable: {exc}".encode())
        return
    for path in files[:MOST_FILES]:
        try:
            info = path.stat()
            digest.update(f"{path.relative_to(root) if path != root else ''}\0{info.st_size}"
                          f"\0{info.st_mtime_ns}\0".encode())
            if info.st_size <= READ_UP_TO:
                digest.update(path.read_bytes())
        except OSError as exc:  # gone since the listing, unreadable: a change all the same
            digest.update(f"{path}: {type(exc).__name__}".encode())
    digest.update(f"files {len(files)}".encode())


def _files(root: Path) -> Iterator[Path]:
    """Every file under ``root`` (or ``root`` itself), in a stable order, caches left out;
    at most MOST_FILES + 1 (enough to know there were more)."""
    if not root.is_dir():
        if root.exists():
            yield root
        return
    count = 0
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            yield Path(folder) / name
            count += 1
            if count > MOST_FILES:
                return
