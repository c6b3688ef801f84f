"""The Dockerfile read as Docker reads it (instructions, stages, exec forms) and its
HEALTHCHECK as a command: shared by the container tests and the health-check bench."""

from __future__ import annotations

import json
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined.append(pending + stripped)
        pending = ""
    result = []
    for item in joined:
        word, _, rest = item.partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def stages(text: str) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for word, rest in instructions(text):
        if word == "FROM":
            found.append([])
        if found:
            found[-1].append((word, rest))
    return found


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"not an exec form (a JSON list of strings): {rest}")
    return value



def healthcheck(port: int) -> list[str]:
    """The Dockerfile's HEALTHCHECK command, on metrics port ``port`` (not 9464)."""
    (health,) = [r for w, r in stages(DOCKERFILE.read_text())[-1] if w == "HEALTHCHECK"]
    command = exec_form(health.partition(" CMD ")[2])
    return [part.replace("9464", str(port)) for part in command]
