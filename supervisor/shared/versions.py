"""TF Serving's directory layout: a model path holding numeric version directories
(`models/text/1/`, `models/text/2/`), of which the highest that holds a SavedModel is served.

A path that is a SavedModel itself is served as it is, with no version. Reads the directory:
the worker calls it as it loads, `check` before a start; never the daemon's loop.
"""

from __future__ import annotations

from pathlib import Path

MARKERS = ("saved_model.pb", "saved_model.pbtxt")


def is_saved_model(path: Path) -> bool:
    return any((path / marker).is_file() for marker in MARKERS)


def served_version(path: Path) -> tuple[Path, int | None]:
    """The SavedModel to load under ``path`` and its version (None: not a versioned root).
    A versioned root with no SavedModel in any version directory is returned as it is, to
    fail as a missing SavedModel does."""
    if is_saved_model(path):
        return path, None
    try:
        versions = sorted((int(child.name), child) for child in path.iterdir()
                          if child.name.isdigit() and is_saved_model(child))
    except OSError:
        return path, None
    if not versions:
        return path, None
    number, child = versions[-1]
    return child, number
