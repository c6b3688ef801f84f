"""What every benchmark smoke checks of the files a bench writes (tests/test_bench*.py)."""

from __future__ import annotations

import json
from pathlib import Path


def written(out: Path, name: str) -> dict[str, object]:
    """The bench ``name`` wrote its table (markdown) and its figures (JSON) under ``out``."""
    assert (out / f"{name}.md").read_text().startswith(f"### {name}")
    result: dict[str, object] = json.loads((out / f"{name}.json").read_text())
    assert result["benchmark"] == name and "machine" in result
    return result
